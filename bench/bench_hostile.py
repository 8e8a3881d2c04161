"""Benchmark: what the hostile files of issue 29 cost to refuse (a script, not a test).

    uv run python bench/bench_hostile.py [--cap-mb 3000] [--src DIR]

`--src` runs the children on another checkout's `src` (the code before the fixes, for the "before" column).

Builds each file the attacker built, then reads it in a child process (`python -c`, the same code
`imagebatch validate` and `imagebatch export` run) and reports the child's wall and CPU seconds, its peak
RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`, printed by the child itself) and the first line of its
answer. Each child runs under an address-space cap (`--cap-mb`, RLIMIT_AS) and a 120 s timeout, so a
reader that tried to pay the cost would fail, not take the machine:

- `sparse.xlsx`: a header `id, prompt` and one cell at XFD1048576 (5 KB);
- `two-cells.xlsx`: a header and a row of two cells at row 1,048,576 (5 KB);
- `wide-header.xlsx`: a header cell at XFD1 and 20,000 rows of two cells (the padding bound);
- `bomb.parquet`: 4,000 records naming one 1 MiB dictionary value (9 KB; 4 GiB decoded);
- `--name '{job_id:>999999999}.{ext}'`: an export of a two-image output folder.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOAD = """
import resource, sys, time
from imagebatch.manifest import ManifestError, load_manifest
try:
    load_manifest(sys.argv[1])
    answer = "loaded"
except ManifestError as exc:
    answer = str(exc.problems[0])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, answer[:150])
"""

EXPORT = """
import contextlib, io, resource, sys
from imagebatch.cli.main import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(["export", sys.argv[1], "--to", sys.argv[2], "--name", "{job_id:>999999999}.{ext}"])
first = err.getvalue().splitlines()[0][:150]
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, f"exit {code}:", first)
"""


def build(folder: Path) -> dict[str, list[str]]:
    """The hostile inputs, as the argument lists of a child (its code, then its arguments)."""
    import openpyxl
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    cases: dict[str, list[str]] = {}
    for name, cells in {
        "sparse.xlsx": {(1_048_576, 16_384): "x"},
        "two-cells.xlsx": {(1_048_576, 1): "g1", (1_048_576, 2): "a vase"},
        "wide-header.xlsx": {(1, 16_384): "far"}
        | {(r, c): f"v{r}" for r in range(2, 20_002) for c in (1, 2)},
    }.items():
        book = openpyxl.Workbook()
        book.active.append(["id", "prompt"])
        for (row, column), value in cells.items():
            book.active.cell(row=row, column=column, value=value)
        book.save(folder / name)
        cases[name] = [LOAD, str(folder / name)]
    prompt = pa.DictionaryArray.from_arrays(pa.array([0] * 4000, pa.int32()), pa.array(["x" * (1 << 20)]))
    table = pa.table({"id": [f"r{i}" for i in range(4000)], "prompt": prompt})
    pq.write_table(table, folder / "bomb.parquet", compression="zstd", dictionary_pagesize_limit=4 << 20)
    cases["bomb.parquet"] = [LOAD, str(folder / "bomb.parquet")]

    from imagebatch.work.store import OutputStore

    out = folder / "out"
    rows = []
    for job in ("r1", "r2"):
        (out / "images" / job).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(out / "images" / job / "0-abc.png")
        row = {"job_id": job, "request_index": 0, "turn_index": 0, "status": "succeeded"}
        rows.append(row | {"paths": f"images/{job}/0-abc.png", "images": 1, "idempotency_key": f"ib1-{job}"})
    OutputStore(out).write_results(rows, [])
    cases["--name '{job_id:>999999999}.{ext}'"] = [EXPORT, str(out), str(folder / "dest")]
    return cases


def measure(argv: list[str], cap_mb: int, src: str | None = None) -> tuple[float, float, int, str]:
    """Wall s, CPU s, peak RSS (MB) and the answer of one child."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap_mb << 20, cap_mb << 20))

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    env = {**os.environ, "PYTHONPATH": src} if src else None
    try:
        done = subprocess.run(
            [sys.executable, "-c", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=limit,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return time.monotonic() - start, 0.0, 0, "still running after 120 s: killed"
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        return wall, cpu, 0, f"failed: {done.stderr.strip().splitlines()[-1][:150]}"
    rss, _, answer = done.stdout.strip().partition(" ")
    return wall, cpu, int(rss) // 1024, answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--src", help="a checkout's src folder to run the children on (default: this one)")
    parser.add_argument("--cap-mb", type=int, default=3000, help="the child's address-space cap (MB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = build(Path(tmp))
        print("| input | wall s | CPU s | peak RSS MB | answer |\n|-|-|-|-|-|")
        for name, argv in cases.items():
            wall, cpu, rss, answer = measure(argv, args.cap_mb, args.src)
            print(f"| `{name}` | {wall:.1f} | {cpu:.1f} | {rss} | {answer.replace('|', '/')} |", flush=True)


if __name__ == "__main__":
    main()
