"""Adaptive dispatch against a rate-limited service: the same run with adaptation off and on.

    uv run python bench/bench_ratelimit.py [--requests 200] [--limit 4] [--latency 0.5] [--concurrency 32]

Starts `imagebatch emulator --max-in-flight LIMIT --latency L` in its own process, then runs `imagebatch
run` twice into fresh folders (with `--no-adaptive`, then without) and prints 429 failures and wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

KEY = "bench-ratelimit-key-0123456789"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    env = {**os.environ, "IMAGEBATCH_API_KEY": KEY}
    emulator = subprocess.Popen(
        [sys.executable, "-m", "imagebatch.cli.main", "emulator", "--port", "0", "--api-key", KEY,
         "--max-in-flight", str(args.limit), "--latency", str(args.latency)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert emulator.stdout is not None
        url = emulator.stdout.readline().split()[-1]
        with tempfile.TemporaryDirectory() as tmp:
            manifest = Path(tmp) / "m.jsonl"
            manifest.write_text(
                "".join(
                    json.dumps({"id": f"j{i:05d}", "prompt": f"kite {i}"}) + "\n"
                    for i in range(args.requests)
                )
            )
            ideal = args.requests * args.latency / args.limit
            print(f"{args.requests} native requests, --concurrency {args.concurrency}, service limit "
                  f"{args.limit} in flight, latency {args.latency} s; ideal {ideal:.1f} s")  # fmt: skip
            print("| dispatch | failed on 429 | of requests | wall (whole process) |\n|-|-|-|-|")
            for label, extra in (
                ("all at once (--no-adaptive)", ["--no-adaptive"]),
                ("adaptive (default)", []),
            ):
                out = Path(tmp) / label.split()[0]
                t0 = time.monotonic()
                subprocess.run(
                    [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--out", str(out),
                     "--base-url", url, "--concurrency", str(args.concurrency), *extra],
                    env=env, capture_output=True, check=False,
                )  # fmt: skip
                wall = time.monotonic() - t0
                statuses = Counter(json.loads((out / "run.json").read_text())["counts"])
                failed = statuses["failed"]
                print(f"| {label} | {failed} | {failed / args.requests:.0%} | {wall:.1f} s |")
    finally:
        emulator.terminate()
        emulator.wait(timeout=30)


if __name__ == "__main__":
    main()
