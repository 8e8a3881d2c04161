"""Benchmark: `imagebatch validate` of generated CSV manifests, two source trees alternated (a script).

    uv run python bench/bench_validate.py --src /tmp/before/src --src src --rows 100000 500000 --repeat 3

Writes `bench_manifest.make_folder`'s catalog manifest of each size once, then runs `python -m
imagebatch.cli.main validate` on it with each `--src` first on `PYTHONPATH`, alternating the trees run
after run (a loaded machine's drift then falls on both alike), and prints each run's CPU seconds (user +
system) and peak RSS from `wait4`, the load average beside them, and each tree's median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_manifest import manifests


def once(src: str, manifest: Path) -> tuple[float, float, float, int]:
    """CPU s, wall s, peak RSS MiB and exit code of one `validate` with `src` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    cmd = [sys.executable, "-m", "imagebatch.cli.main", "validate", str(manifest)]
    start = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", required=True, help="a source tree (repeat: alternated)")
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for rows, manifest in manifests(args.rows):
        runs: dict[str, list[tuple[float, float, float, int]]] = {src: [] for src in args.src}
        for i in range(args.repeat):
            order = args.src if i % 2 == 0 else args.src[::-1]
            for src in order:
                load = os.getloadavg()[0]
                cpu, wall, rss, code = once(src, manifest)
                runs[src].append((cpu, wall, rss, code))
                print(f"{rows:>9,} rows  {src:<28} exit {code}  {cpu:6.2f} CPU s  {wall:6.2f} s wall  "
                      f"{rss:6.0f} MiB  load {load:.1f}", flush=True)  # fmt: skip
        for src, got in runs.items():
            cpu = statistics.median(r[0] for r in got)
            rss = max(r[2] for r in got)
            print(f"{rows:>9,} rows  {src:<28} median {cpu:.2f} CPU s, peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
