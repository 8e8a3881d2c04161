"""Peak RSS and CPU of a rerun's replay of the folder's state (`OutputStore.load_state`), as the folder grows:
a local folder of N finished requests, its journal as a run writes it: the first 1,000 requests by the
project's own writers (`OutputStore.journal` for `attempt_started`, `attempt_finished` and `answered`,
`record_outcome`, `append_usage`), the rest the same lines made by the writers' own encoder
(`appendlog.json_line`, checked byte for byte against the writers' first request) straight into the
files, the writers' open-append-close per line being too slow for 500,000; and each request's image
there as an empty file (the replay only looks them up). Each step runs in a child process of its own,
measured by `os.wait4` (peak RSS, user + sys CPU):

- `import`: Python with imagebatch's record imported (the floor of every other step);
- `load`: `load_state()`, every key's state, each succeeded one's image looked up (a stat each);
- `no-stat`: the same replay with the look-up answered without the disk (what the stats cost is the
  difference from `load`);
- `decide`: `load_state()`, then `.get` of every key, as a rerun's decisions read it.

`--src` runs the steps against another checkout's `src/` (the code before a change) on the same folders,
and `--alternate` runs this checkout's and that one's in turn for each size, so that before and after
share the machine's load:

    uv run python bench/bench_state.py --requests 50000 200000 500000 --src /tmp/before/src --alternate
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = {
    "import": "from imagebatch.work.store import OutputStore",
    "load": """
from imagebatch.work.store import OutputStore
states = OutputStore(OUT).load_state()
assert len(states) == N, len(states)
""",
    "no-stat": """
from imagebatch.storage import layout
from imagebatch.work.replay import replay
from imagebatch.work.store import OutputStore
states = replay(OutputStore(OUT).backend.records(layout.JOURNAL), lambda record, settled: True)
assert len(states) == N, len(states)
""",
    "decide": """
from imagebatch.work.store import OutputStore
states = OutputStore(OUT).load_state()
done = sum(states.get(f"ib1-{i:032x}").status == "succeeded" for i in range(N))
assert done == N, done
""",
}

WRITER = """
import os
from dataclasses import asdict
from imagebatch.storage.appendlog import json_line
from imagebatch.work.request_record import RequestRecord
from imagebatch.work.store import OutputStore

def request(i):
    key, job = f"ib1-{i:032x}", f"j{i // 1000}"
    ids = {"idempotency_key": key, "job_id": job, "request_index": i % 1000, "turn_index": 0, "variant": 1}
    common = {**ids, "route": "native", "model": "native-image-2.1", "attempt": 1,
              "started_at": "2026-11-28T10:00:00.000000+00:00"}
    finished = {"duration_s": round(0.01 + (i % 997) * 0.0007, 4), "outcome": "ok", "error_code": None,
                "request_id": f"req-{i}-" + "r" * 24, "images": 1, "retry_in": None}
    usage = {**common, **finished, "http_status": 200,
             "usage": {"promptTokenCount": 12, "candidatesTokenCount": 1290}}
    path = f"images/{job}/{i % 1000}-{i:012x}.png"
    record = RequestRecord(job_id=job, request_index=i % 1000, turn_index=0, status="succeeded",
                           model="native-image-2.1", route="native", idempotency_key=key, paths=[path],
                           images=1, width=1024, height=1024, mime_type="image/png", attempts=1,
                           finish_reason="STOP", request_id=f"req-{i}", http_status=200)
    os.makedirs(os.path.join(OUT, "images", job), exist_ok=True)
    open(os.path.join(OUT, path), "wb").close()
    return common, finished, usage, record

store = OutputStore(OUT)
store.backend.prepare()
WRITERS = min(N, 1000)
for i in range(WRITERS):
    common, finished, usage, record = request(i)
    store.journal("attempt_started", sync=False, **common)
    store.journal("attempt_finished", sync=False, **common, status=200, **finished)
    store.append_usage(usage)
    store.journal("answered", sync=False, **asdict(record))
    store.record_outcome(record)
store.backend.sync()
journal, ledger = (open(os.path.join(OUT, name), "rb+") for name in ("journal.jsonl", "usage.jsonl"))

def lines(i):
    common, finished, usage, record = request(i)
    events = [{"event": "attempt_started", **common},
              {"event": "attempt_finished", **common, "status": 200, **finished},
              {"event": "answered", **asdict(record)}, {"event": "outcome", **asdict(record)}]
    return b"".join(map(json_line, events)), json_line(usage)

first = lines(0)
assert journal.read(len(first[0])) == first[0] and ledger.read(len(first[1])) == first[1]
journal.seek(0, 2)
ledger.seek(0, 2)
for i in range(WRITERS, N):
    events, usage = lines(i)
    journal.write(events)
    ledger.write(usage)
journal.close()
ledger.close()
"""


def child(code: str, out: Path, n: int, src: str | None) -> tuple[float, float, float]:
    """(peak RSS MiB, user + sys CPU s, wall s) of `code` in a child process."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", f"OUT = {str(out)!r}\nN = {n}\n" + code], env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed at {n} in {out}")
    return usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, time.perf_counter() - t0


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--requests", type=int, nargs="+", default=[50_000, 200_000])
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--src", help="another checkout's src/ (the code before a change)")
    parser.add_argument("--alternate", action="store_true", help="run this checkout's, then --src's")
    parser.add_argument("--tmp", help="where to make the folders (default: the machine's temporary folder)")
    args = parser.parse_args()
    if args.src and not (Path(args.src) / "imagebatch").is_dir():  # else the installed code runs instead
        raise SystemExit(f"{args.src} holds no imagebatch package")
    codes = [("after", None), ("before", args.src)] if args.alternate else [(args.src or "this", args.src)]
    print(f"load average {os.getloadavg()}", flush=True)
    print("| requests | step | code | peak RSS MiB | CPU s (user+sys) | wall s |\n|-|-|-|-|-|-|", flush=True)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for n in args.requests:
            out = Path(tmp) / f"out{n}"
            _, cpu, wall = child(WRITER, out, n, None)
            print(f"(wrote {n:,} requests: {cpu:.0f} s CPU, {wall:.0f} s wall)", flush=True)
            for step in args.steps:
                for name, src in codes:
                    rss, cpu, wall = child(STEPS[step], out, n, src)
                    print(f"| {n:,} | {step} | {name} | {rss:.0f} | {cpu:.2f} | {wall:.1f} |", flush=True)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
