"""Benchmark: the CPU a run's health check of Prefect's server costs, two source trees alternated (a script).

    uv run python bench/bench_probe.py --src /tmp/before/src --src src --seconds 30 --repeat 2

A run watches Prefect's API (`run.api_guard.PrefectGuard`): a probe of `/health` every second for as long
as it sends. This starts a loopback HTTP server that answers `/health` (HTTP/1.1, as Prefect's uvicorn
does; `tests/helpers/health.py`), then, for each `--src` in turn (first on `PYTHONPATH` of a fresh
process), runs a guard's watch against it for `--seconds` and prints the CPU seconds (user + system)
the watching process spent, per probe and per minute, with the server's count of probes and
connections. The server runs in this process, so its CPU is not counted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers.health import health_server

WATCH = """
import resource, sys, threading, time
from imagebatch.run.api_guard import PrefectGuard
guard = PrefectGuard(sys.argv[1])
guard.api_url = sys.argv[1]  # as `start` sets it, without Prefect's settings
before = resource.getrusage(resource.RUSAGE_SELF)
watch = threading.Thread(target=guard._watch, daemon=True)
watch.start()
time.sleep(float(sys.argv[2]))
guard.close()
watch.join()
after = resource.getrusage(resource.RUSAGE_SELF)
print(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
"""


def once(src: str, api_url: str, seconds: float) -> float:
    """CPU seconds of one watch of `seconds` with `src` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    done = subprocess.run(
        [sys.executable, "-c", WATCH, api_url, str(seconds)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", required=True, help="a source tree (repeat: alternated)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print("| tree | CPU s | probes | connections | ms a probe | CPU s a minute |\n|-|-|-|-|-|-|")
    for _ in range(args.repeat):
        for src in args.src:
            with health_server() as (api_url, health):  # a fresh one: its counts are this watch's
                cpu = once(src, api_url, args.seconds)
                probes, connections = health.answers, health.connections
            per_probe, per_minute = 1000 * cpu / max(probes, 1), 60 * cpu / args.seconds
            print(f"| {src} | {cpu:.2f} | {probes} | {connections} | {per_probe:.1f} | {per_minute:.2f} |")


if __name__ == "__main__":
    main()
