"""Peak RSS of the record's end of a run and of a rerun's replay, by step, as the journal grows: a
journal of N finished requests (the lines a run writes for each: attempt started and finished, usage,
answered, outcome; about 2.6 KB a request) written straight into a local folder and into `s3://` on a
local `moto_server` (its own process; one segment per 64 requests, as group commits make them), then
each step run in a child process of its own and measured by `os.wait4`'s `ru_maxrss`:

- `import`: Python with imagebatch's record imported, nothing read (the floor of every other step);
- `end`: what the end of a run does with the journal: hold the location, sync (in a bucket: compact the
  segments into one object), the usage summary from the ledger, results.csv from N rows;
- `replay`: a rerun's `load_state` (every key's state).

`--src` runs the steps against another checkout's `src/` (the code before a change), with the same
data, so that before and after alternate on one machine:

    uv run python bench/bench_record_end.py --requests 25000 100000
    uv run python bench/bench_record_end.py --requests 25000 100000 --src /tmp/base/src
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import BUCKET, SECRET, s3_client, start_moto

PER_SEGMENT = 64

STEPS = {
    "import": "from imagebatch.work.store import OutputStore",
    "end": """
from imagebatch.work.store import OutputStore
from imagebatch.work.usage import summarise_usage, usage_csv
from imagebatch.work.request_record import RequestRecord
store = OutputStore(OUT)
with store.backend.hold():
    store.backend.sync()
    summary = usage_csv(summarise_usage(store.usage_lines()))
    store.backend.put("usage-summary.csv", summary)
    rows = (RequestRecord(job_id=f"j{i}", request_index=0, turn_index=0, status="succeeded",
            model="native-image-2.1", route="native", idempotency_key=f"ib1-{i:032x}",
            paths=[f"images/j{i}/0-{i:012x}.png"], images=1, width=1024, height=1024,
            mime_type="image/png", attempts=1, finish_reason="STOP", request_id=f"req-{i}").to_row()
            for i in range(N))
    store.write_results(rows, [])
""",
    "replay": """
from imagebatch.work.store import OutputStore
states = OutputStore(OUT).load_state()
assert len(states) == N, len(states)
""",
}


def lines_of(i: int) -> list[bytes]:
    """The journal and usage lines of request `i`, as a run writes them (sizes close to a real run's)."""
    key = f"ib1-{i:032x}"
    ids = {"idempotency_key": key, "job_id": f"j{i}", "request_index": 0, "turn_index": 0, "variant": 1}
    common = {**ids, "route": "native", "model": "native-image-2.1", "attempt": 1,
              "started_at": "2026-11-28T10:00:00.000000+00:00"}  # fmt: skip
    finished = {"duration_s": round(0.01 + (i % 997) * 0.0007, 4), "outcome": "ok", "error_code": None,
                "request_id": f"req-{i}-" + "r" * 24, "images": 1, "retry_in": None}  # fmt: skip
    record = {**ids, "status": "succeeded", "model": "native-image-2.1", "route": "native",
              "paths": [f"images/j{i}/0-{i:012x}.png"], "images": 1, "width": 1024, "height": 1024,
              "mime_type": "image/png", "attempts": 1, "finish_reason": "STOP", "request_id": f"req-{i}",
              "error": None, "http_status": 200, "text": "t" * 300, "usage": {"promptTokenCount": 12,
              "candidatesTokenCount": 1290, "totalTokenCount": 1302}}  # fmt: skip
    usage = {**common, **finished, "http_status": 200, "usage": record["usage"], "pad": "u" * 250}
    events = [
        {"event": "attempt_started", **common},
        {"event": "attempt_finished", **common, "status": 200, **finished},
        {"event": "answered", **record},
        {"event": "outcome", **record},
    ]
    return [json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in events] + [
        json.dumps(usage, separators=(",", ":")).encode() + b"\n"
    ]


def write_folder(out: Path, n: int) -> None:
    out.mkdir(parents=True)
    with (out / "journal.jsonl").open("wb") as journal, (out / "usage.jsonl").open("wb") as ledger:
        for i in range(n):
            *events, usage = lines_of(i)
            journal.write(b"".join(events))
            ledger.write(usage)


def write_bucket(client: object, prefix: str, n: int) -> None:
    for seq, start in enumerate(range(0, n, PER_SEGMENT), 1):
        body = b""
        for i in range(start, min(n, start + PER_SEGMENT)):
            *events, usage = lines_of(i)
            body += b"".join(events) + usage.replace(b'{"idempotency', b'{"event":"usage","idempotency', 1)
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/journal/00000001-{seq:08d}.jsonl", Body=body)  # type: ignore[attr-defined]


def measure(step: str, out: str, n: int, src: str | None, env: dict[str, str]) -> tuple[float, float]:
    """(peak RSS MiB, wall s) of one step in a child process."""
    code = f"OUT = {out!r}\nN = {n}\n" + STEPS[step]
    child_env = dict(env)
    if src:
        child_env["PYTHONPATH"] = src
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], env=child_env)
    _, status, rusage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{step} at {n} into {out} failed")
    return rusage.ru_maxrss / 1024, time.perf_counter() - t0


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--requests", type=int, nargs="+", default=[25_000, 100_000])
    parser.add_argument("--src", help="another checkout's src/ (the code before a change)")
    parser.add_argument("--where", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    args = parser.parse_args()
    if args.src and not (Path(args.src) / "imagebatch").is_dir():  # else the installed code runs instead
        raise SystemExit(f"{args.src} holds no imagebatch package")
    print(f"load average {os.getloadavg()}, code {args.src or 'this checkout'}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        moto, url = start_moto(Path(tmp) / "moto.log")
        env = {**os.environ, **SECRET, "AWS_ENDPOINT_URL": url, "AWS_ALLOW_HTTP": "true"}
        try:
            print("| requests | where | step | peak RSS MiB | wall s |\n|-|-|-|-|-|", flush=True)
            for n in args.requests:
                for where in args.where:
                    for step in STEPS:
                        if where == "local":
                            out = str(Path(tmp) / f"{step}-{n}")
                            write_folder(Path(out), n)
                        else:
                            prefix = f"{step}-{n}"
                            write_bucket(s3_client(url), prefix, n)
                            out = f"s3://{BUCKET}/{prefix}"
                        rss, wall = measure(step, out, n, args.src, env)
                        print(f"| {n:,} | {where} | {step} | {rss:.0f} | {wall:.1f} |", flush=True)
        finally:
            moto.terminate()
            moto.wait()
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
