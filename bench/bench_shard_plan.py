"""Benchmark: what one shard of a sharded run holds once it has read and planned its share (a script).

    uv run python bench/bench_shard_plan.py --rows 50000 200000 --shards 10 [--src /tmp/before/src]
    uv run python bench/bench_shard_plan.py --rows 50000 500000 --src /tmp/before/src --src src --shard-only

Writes `bench_manifest.make_folder`'s catalog manifest of each size, then in a child process of its own
(with `--src` first on `PYTHONPATH`, to run other code) does what a shard's flow does before it sends:
load the manifest (every row checked; with `run.shards.shard_keeps` where the code has it, only shard 0's
jobs kept), plan it, group the requests into units and keep shard 0's (`shard_of`), and once more for the
whole run (what one process or a sharded run's parent plans; not with `--shard-only`). Prints each one's
peak RSS (`wait4`), CPU seconds and the units kept; with `--load-only`, only the load (what the manifest
side holds, the plan left out). Several `--src` are run in turn for each size, in an
order that alternates with `--repeat` (a loaded machine's drift then falls on all alike).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_manifest import manifests

CHILD = """
import sys
from imagebatch.manifest import load_manifest, plan
from imagebatch.run import shards as sharding
from imagebatch.work.context import group_units
path, shards, shard, planned = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "plan"
keep = None
if shard >= 0 and hasattr(sharding, "shard_keeps"):
    keep = sharding.shard_keeps(shard, shards)
manifest = load_manifest(path, keep=keep) if keep else load_manifest(path)
units = group_units(plan(manifest)) if planned else []
if shard >= 0:
    units = [u for u in units if sharding.shard_of(u, shards) == shard]
print(len(manifest.jobs), len(units))
"""


def once(
    src: str | None, manifest: Path, shards: int, shard: int, planned: bool = True
) -> tuple[float, float, float, str]:
    """Peak RSS MiB, CPU s and wall s of one child, and what it printed (jobs held, units kept)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    cmd = [sys.executable, "-c", CHILD, str(manifest), str(shards), str(shard), "plan" if planned else "load"]
    start = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    out = child.stdout.read().strip()
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"the child failed ({status})")
    wall = time.perf_counter() - start
    return usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, wall, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[50_000, 200_000])
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument(
        "--src", action="append", default=None, help="a source tree to run (repeat: alternated)"
    )
    parser.add_argument("--shard-only", action="store_true", help="only the shard, not the whole plan")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--load-only", action="store_true", help="load the manifest (the shard's jobs kept), plan nothing"
    )
    args = parser.parse_args()
    trees: list[str | None] = args.src or [None]
    kinds = [(0, f"shard 0 of {args.shards}")] + ([] if args.shard_only else [(-1, "whole plan")])
    for rows, manifest in manifests(args.rows):
        for i in range(args.repeat):
            for src in trees if i % 2 == 0 else trees[::-1]:
                for shard, what in kinds:
                    rss, cpu, wall, out = once(src, manifest, args.shards, shard, not args.load_only)
                    jobs, units = out.split()
                    print(f"{rows:>9,} rows  {src or 'installed':<24} {what:<16} {rss:6.0f} MiB  {cpu:6.2f} "
                          f"CPU s  {wall:6.2f} s wall  jobs held {int(jobs):>7,}  units {int(units):>7,}  "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
