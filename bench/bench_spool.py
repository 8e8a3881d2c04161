"""Benchmark: what the run's record spool (`work.spool.RecordSpool`) holds in memory as units finish (a
script).

    uv run python bench/bench_spool.py --units 50000 500000 [--src /tmp/before/src]

For each size, a child process of its own (with `--src` first on `PYTHONPATH`, to run other code) makes a
spool in a temporary folder and gives it one succeeded record per unit, as a run's request threads do (a
record made per unit, then dropped), then reads every unit back in order, as results.csv is written.
Prints the child's resident memory after its imports, after the spool is filled and after the read, its
peak RSS (`wait4`) and its CPU seconds (user + sys), and what the spool's memory holds per unit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import gc, sys, time
from pathlib import Path
from imagebatch.work.request_record import RequestRecord
try:
    from imagebatch.work.spool import RecordSpool
except ImportError:  # older code keeps it in work.context
    from imagebatch.work.context import RecordSpool

def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

def record(i):
    return RequestRecord(
        job_id=f"job-{i}", request_index=0, turn_index=0, status="succeeded", model="native-image-2.1",
        route="native", idempotency_key=f"ib1-{i:032x}", paths=[f"images/job-{i}/0-{i:012x}.png"],
        images=1, width=1024, height=1024, mime_type="image/png", attempts=1, request_id=f"req_{i:032x}",
    )

folder, units = sys.argv[1], int(sys.argv[2])
gc.collect()
start = rss_kib()
spool = RecordSpool(Path(folder))
began = time.process_time()
for i in range(units):
    spool[i] = [record(i)]
filled, fill_cpu = rss_kib(), time.process_time() - began
began = time.process_time()
assert sum(len(spool[i]) for i in range(units)) == units and len(spool) == units
read, read_cpu = rss_kib(), time.process_time() - began
spool.close()
print(start, filled, read, f"{fill_cpu:.2f}", f"{read_cpu:.2f}")
"""


def once(src: str | None, units: int) -> dict[str, float]:
    """One child's figures: RSS (MiB) after imports, filled and read back; peak RSS; CPU and wall s."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    with tempfile.TemporaryDirectory(prefix="bench-spool-") as folder:
        start = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, folder, str(units)], env=env, stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        out = child.stdout.read().split()
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"the child failed ({status})")
    start_kib, filled_kib, read_kib = (int(x) for x in out[:3])
    return {
        "start": start_kib / 1024,
        "filled": filled_kib / 1024,
        "read": read_kib / 1024,
        "held_per_unit": (filled_kib - start_kib) * 1024 / units,
        "peak": usage.ru_maxrss / 1024,
        "cpu": usage.ru_utime + usage.ru_stime,
        "fill_cpu": float(out[3]),
        "read_cpu": float(out[4]),
        "wall": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=[50_000, 500_000])
    parser.add_argument("--src", default=None, help="a source tree to run instead of the installed one")
    args = parser.parse_args()
    print("| units | RSS after imports MiB | filled MiB | read back MiB | held B/unit | peak RSS MiB "
          "| CPU s (fill, read) | load |")  # fmt: skip
    print("|-|-|-|-|-|-|-|-|")
    for units in args.units:
        f = once(args.src, units)
        print(f"| {units:,} | {f['start']:.0f} | {f['filled']:.0f} | {f['read']:.0f} | "
              f"{f['held_per_unit']:.0f} | {f['peak']:.0f} | {f['cpu']:.2f} ({f['fill_cpu']:.2f}, "
              f"{f['read_cpu']:.2f}) | {os.getloadavg()[0]:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
