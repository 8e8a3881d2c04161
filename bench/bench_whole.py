"""Benchmark: the peak RSS of what a command holds per request or per row, as the manifest grows (a script).

    uv run python bench/bench_whole.py --requests 50000 200000 --src /tmp/whole-before/src --alternate

For each size, the inputs are made once with the project's own writers: a CSV manifest of that many rows,
one request a row (`bench_flow.write_manifest`), a price table, an empty output folder, a review record of
that many approvals (`work.decisions.decision_line`, each line as `record_decision` writes it), and
results.csv of that many rows in a bucket of a moto server (`OutputStore.write_results` into
`s3://...`, `bench_store.start_moto`). Each step then runs in a child process of its own, each printing its
own peak RSS (`VmHWM`) and CPU seconds (user + sys):

- `validate`: `imagebatch validate M` (the floor of the three steps after it: the manifest read and
  checked, its summary counted from the jobs);
- `estimate`: `imagebatch validate M --prices P` (`work.prices.estimate_lines` over the plan);
- `names`: `imagebatch validate M --name '{sku}/{job_id}.{ext}'` (`delivery.manifestnames`);
- `forecast`: `imagebatch validate M --out EMPTY --prices P` (`work.forecast`: every request new);
- `summarise`: `manifest.summarise(plan(load_manifest(M)))`, the plan's summary counted from its requests;
- `fetch`: `BucketBackend.local_copy().fetch(["results.csv"])`, results.csv staged for a reader;
- `decisions`: `DecisionCache` of a folder's review record of N approvals, then `approved()`;
- `import`: Python with those modules imported (the floor of `summarise`, `fetch` and `decisions`).

`--src` runs the steps against another checkout's `src/` (the code before a change) on the same inputs;
`--alternate` runs this checkout's and that one's in turn for each step, so that both share the load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_flow import write_manifest
from bench_store import BUCKET, SECRET, s3_client, start_moto

HERE = Path(__file__).resolve().parent.parent / "src"
TEMPLATE = "{sku}/{job_id}.{ext}"
CLI = "import sys; from imagebatch.cli.main import main; sys.argv = ['imagebatch', 'validate', *ARGS]; main()"
IMPORTS = """
from imagebatch.manifest import load_manifest, plan, summarise
from imagebatch.report.review_decisions import DecisionCache
from imagebatch.storage.bucket import BucketBackend
from imagebatch.storage.folder import FolderBackend
"""
PEAK = """
import resource
own = resource.getrusage(resource.RUSAGE_SELF)
hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(hwm, own.ru_utime + own.ru_stime, flush=True)
"""
"""The child's own peak RSS (`VmHWM`: wait4's `ru_maxrss` would start from this process's, the child's
fork) and CPU seconds, printed last."""
STEPS: dict[str, str] = {
    "validate": "ARGS = [M]\n" + CLI,
    "estimate": "ARGS = [M, '--prices', P]\n" + CLI,
    "names": f"ARGS = [M, '--name', {TEMPLATE!r}]\n" + CLI,
    "forecast": "ARGS = [M, '--out', EMPTY, '--prices', P]\n" + CLI,
    "import": IMPORTS,
    "summarise": IMPORTS + "s = summarise(plan(load_manifest(M)))\nassert s.requests == N, s\n",
    "fetch": IMPORTS
    + """
with BucketBackend(URL).local_copy() as copy:
    copy.fetch(["results.csv"])
    assert (copy.folder / "results.csv").stat().st_size > N * 100
""",
    "decisions": IMPORTS
    + """
from pathlib import Path
assert len(DecisionCache(FolderBackend(Path(REVIEWED))).approved()) == N
""",
}


def make_inputs(tmp: Path, n: int, moto_url: str) -> dict[str, str]:
    """The inputs of every step for `n` requests, under `tmp`; the names the steps' code reads."""
    from imagebatch.work.decisions import Decision, decision_line
    from imagebatch.work.request_record import RESULT_COLUMNS
    from imagebatch.work.store import OutputStore

    manifest, prices, reviewed = tmp / "m.csv", tmp / "prices.toml", tmp / "reviewed"
    write_manifest(manifest, n)
    prices.write_text('currency = "USD"\n[images]\n"native-image-2.1" = 0.04\n')
    reviewed.mkdir()
    with (reviewed / "review.jsonl").open("wb") as fh:
        for i in range(n):
            at = f"2026-11-29T09:{i // 60_000 % 60:02d}:{i // 1000 % 60:02d}.{i % 1000:06d}Z"
            fh.write(decision_line(Decision(f"ib1-{i:032x}", 1, "approved", "", "bench", at)))
    url = f"s3://{BUCKET}/results-{n}"
    store = OutputStore(url)
    row = {c: "" for c in RESULT_COLUMNS}
    rows = (
        {**row, "job_id": f"item-{i}", "request_index": 0, "turn_index": 0, "status": "succeeded",
         "model": "native-image-2.1", "route": "native", "idempotency_key": f"ib1-{i:032x}",
         "paths": f"images/item-{i}/0-{i:012x}.png", "images": 1, "width": 1024, "height": 1024,
         "sku": f"SKU-{i}"}
        for i in range(n)
    )  # fmt: skip
    store.write_results(rows, ["sku"])
    return {"M": str(manifest), "P": str(prices), "EMPTY": str(tmp / "empty"), "REVIEWED": str(reviewed),
            "URL": url, "N": str(n), "MOTO": moto_url}  # fmt: skip


def measure(step: str, src: Path, inputs: dict[str, str]) -> tuple[float, float]:
    """(peak RSS MiB, CPU s) of the step's child."""
    names = {k: v for k, v in inputs.items() if k not in ("N", "MOTO")}
    head = "".join(f"{k} = {v!r}\n" for k, v in names.items()) + f"N = {inputs['N']}\n"
    env = {**os.environ, **SECRET, "PYTHONPATH": str(src), "AWS_ENDPOINT_URL": inputs["MOTO"]}
    env["AWS_ALLOW_HTTP"] = "true"
    code = head + STEPS[step] + PEAK
    pipe = subprocess.PIPE
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=pipe, stderr=pipe)
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{step} failed: {err.decode()[-2000:]}")
    peak_kib, cpu = out.decode().strip().splitlines()[-1].split()
    return int(peak_kib) / 1024, float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[50_000, 200_000])
    parser.add_argument("--steps", nargs="+", choices=list(STEPS), default=list(STEPS))
    parser.add_argument("--src", type=Path, help="another checkout's src/ (before a change)")
    parser.add_argument("--alternate", action="store_true", help="with --src: each step before, then after")
    args = parser.parse_args()
    trees = [("after", HERE)]
    if args.src is not None:
        trees = [("before", args.src.resolve())] + (trees if args.alternate else [])
    with tempfile.TemporaryDirectory(prefix="bench-whole-") as tmp:
        moto, url = start_moto(Path(tmp) / "moto.log", spill=True)
        try:
            s3_client(url).create_bucket(Bucket=BUCKET)
            os.environ.update({**SECRET, "AWS_ENDPOINT_URL": url, "AWS_ALLOW_HTTP": "true"})
            print(f"load: {os.getloadavg()}")
            print("| step | requests | " + " | ".join(f"{t} MiB | {t} CPU s" for t, _ in trees) + " |")
            print("|-|-|" + "-|-|" * len(trees))
            for n in args.requests:
                folder = Path(tmp) / f"n{n}"
                folder.mkdir()
                start = time.perf_counter()
                inputs = make_inputs(folder, n, url)
                print(f"  (inputs of {n:,} made in {time.perf_counter() - start:.0f} s)", file=sys.stderr)
                for step in args.steps:
                    cells = []
                    for _, src in trees:
                        rss, cpu = measure(step, src, inputs)
                        cells += [f"{rss:.0f}", f"{cpu:.1f}"]
                    print(f"| {step} | {n:,} | " + " | ".join(cells) + " |", flush=True)
        finally:
            moto.terminate()
            moto.wait()


if __name__ == "__main__":
    main()
