"""Benchmark: the CPU a run's health check of Prefect's server costs, two source trees alternated (a script).

    uv run python bench/bench_probe.py --src /tmp/before/src --src src --seconds 30 --repeat 2

A run watches Prefect's API (`run.api_guard.PrefectGuard`): a probe of `/health` every second for as long
as it sends. This starts a loopback HTTP server that answers `/health` (HTTP/1.1, as Prefect's uvicorn
does), then, for each `--src` in turn (first on `PYTHONPATH` of a fresh process), runs a guard's watch
against it for `--seconds` and prints the CPU seconds (user + system) the watching process spent, per
probe and per minute, with the server's count of probes and connections. The server runs in this
process, so its CPU is not counted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

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


class Health(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    counts: ClassVar[dict[str, int]] = {"probes": 0, "connections": 0}

    def handle(self) -> None:
        self.counts["connections"] += 1
        super().handle()

    def do_GET(self) -> None:
        self.counts["probes"] += 1
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args: Any) -> None:
        pass


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
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api_url = f"http://127.0.0.1:{server.server_port}/api"
    print("| tree | CPU s | probes | connections | ms a probe | CPU s a minute |\n|-|-|-|-|-|-|")
    for _ in range(args.repeat):
        for src in args.src:
            Health.counts.update(probes=0, connections=0)
            cpu = once(src, api_url, args.seconds)
            probes, connections = Health.counts["probes"], Health.counts["connections"]
            per_probe, per_minute = 1000 * cpu / max(probes, 1), 60 * cpu / args.seconds
            print(f"| {src} | {cpu:.2f} | {probes} | {connections} | {per_probe:.1f} | {per_minute:.2f} |")
    server.shutdown()


if __name__ == "__main__":
    main()
