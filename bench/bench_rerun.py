"""Benchmark of a rerun that sends nothing (issue 19): a local folder against `s3://` on a local
S3-compatible server (`moto_server`, its own process), at 1,000 and 10,000 finished rows.

Not a test. For each row count: a manifest of that many native rows is run once into a local folder and
once into `s3://` (the emulator with no latency, `--no-report`: only the finished record matters), then
rerun `--repeat` times into each (nothing to send). Prints the reruns' wall seconds and, for `s3://`, the
store's requests during each rerun by kind (from the server's request log): what a rerun reads, and that it
lists and reads no image however many there are.

    uv run python bench/bench_rerun.py [--rows 1000 10000] [--repeat 3] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_flow import KEY, start_emulator, write_manifest
from bench_store import BUCKET, SECRET, run, start_moto, store_requests


def reruns(
    cmd: list[str], env: dict[str, str], log: Path, repeat: int
) -> list[tuple[float, int, Counter[str]]]:
    """(wall seconds, exit code, the store's requests by kind) of `repeat` reruns."""
    done = []
    for _ in range(repeat):
        mark = len(log.read_text(errors="replace").splitlines())
        wall, _, code = run(cmd, env)
        done.append((wall, code, store_requests(log, mark)))
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    emulator, service = start_emulator(0.0)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "moto.log"
        moto, store = start_moto(log)
        env = {**os.environ, "IMAGEBATCH_BASE_URL": service, "IMAGEBATCH_API_KEY": KEY, **SECRET}
        env |= {"AWS_ENDPOINT_URL": store, "AWS_ALLOW_HTTP": "true"}
        print("| finished rows | location | first run wall s | rerun wall s (median; all) | rerun exit |")
        print("|-|-|-|-|-|")
        try:
            for rows in args.rows:
                manifest = Path(tmp) / f"m{rows}.csv"
                write_manifest(manifest, rows)
                base = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--no-report"]
                base += ["--concurrency", str(args.concurrency)]
                places = (
                    ("local folder", str(Path(tmp) / f"out{rows}")),
                    ("s3://", f"s3://{BUCKET}/r{rows}"),
                )
                for name, out in places:
                    first, _, code = run([*base, "--out", out], env)
                    assert code == 0, f"the first run into {out} exited {code}"
                    done = reruns([*base, "--out", out], env, log, args.repeat)
                    walls = [wall for wall, _, _ in done]
                    every = ", ".join(f"{w:.2f}" for w in walls)
                    median = f"{statistics.median(walls):.2f} ({every})"
                    cells = [f"{rows:,}", name, f"{first:.1f}", median, [c for _, c, _ in done]]
                    print("| " + " | ".join(map(str, cells)) + " |", flush=True)
                    for i, (_, _, kinds) in enumerate(done if out.startswith("s3://") else [], 1):
                        listed = dict(sorted(kinds.items()))
                        print(f"  rerun {i}: {sum(kinds.values())} store requests: {listed}", flush=True)
        finally:
            moto.terminate()
            emulator.terminate()


if __name__ == "__main__":
    main()
