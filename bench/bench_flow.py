"""Benchmark of `imagebatch run`: wall time, throughput and peak memory against manifest length.

Not a test. It starts the emulator as its own process (`imagebatch emulator`, with a fixed latency per
generation standing in for the real service's), then runs `imagebatch run` as a child process for
manifests of several lengths, and prints a table: rows, wall seconds, requests per second, and the peak
resident memory of the run process (the emulator's memory is not counted). A flat memory column is the
claim under test: no task returns image bytes, and the dispatch window bounds what is in flight.

    uv run python bench/bench_flow.py [--rows 100 400 1600] [--latency 0.5] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEY = "bench-key"


def write_manifest(path: Path, rows: int) -> None:
    ratios = ["1:1", "4:5", "16:9", "3:4"]
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "prompt", "aspect_ratio", "sku"])
        for i in range(rows):
            writer.writerow([f"item-{i}", f"Studio photo of product {i} on white", ratios[i % 4], f"SKU-{i}"])


def start_emulator(latency: float) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        sys.executable, "-m", "imagebatch.cli.main", "emulator", "--port", "0", "--api-key", KEY,
        "--latency", str(latency), "--jpeg-rate", "0", "--thought-image-rate", "0",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"emulator did not start: {line!r}")
    return proc, match.group(1)


def run_once(manifest: Path, out: Path, url: str, concurrency: int) -> tuple[float, int, int]:
    """Return (wall seconds, peak RSS in KiB of the run process, exit code)."""
    env = {**os.environ, "IMAGEBATCH_BASE_URL": url, "IMAGEBATCH_API_KEY": KEY}
    cmd = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--out", str(out)]
    cmd += ["--concurrency", str(concurrency)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, rusage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t0, rusage.ru_maxrss, os.waitstatus_to_exitcode(status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 400, 1600])
    parser.add_argument("--latency", type=float, default=0.5, help="emulator seconds per generation")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    emulator, url = start_emulator(args.latency)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            py = sys.version.split()[0]
            print(f"emulator latency {args.latency} s, concurrency {args.concurrency}, Python {py}")
            print("| rows | wall s | requests/s | peak RSS MiB | rerun wall s (0 sent) | exit |")
            print("|-|-|-|-|-|-|")
            for rows in args.rows:
                manifest = Path(tmp) / f"m{rows}.csv"
                out = Path(tmp) / f"out{rows}"
                write_manifest(manifest, rows)
                wall, rss, code = run_once(manifest, out, url, args.concurrency)
                rerun_wall, _, _ = run_once(manifest, out, url, args.concurrency)
                rate, mib = rows / wall, rss / 1024
                figures = [rows, f"{wall:.1f}", f"{rate:.1f}", f"{mib:.0f}", f"{rerun_wall:.1f}", code]
                print("| " + " | ".join(map(str, figures)) + " |", flush=True)
    finally:
        emulator.terminate()
        emulator.wait(timeout=10)


if __name__ == "__main__":
    main()
