"""How steady the stream of requests is at the service (issue 23, part 3): completions per second.

Runs an emulator in this process (`--latency` seconds a generation, no faults), then, one after the other,
the plain asyncio peer (`bench/peer.py`) and `imagebatch run` (with the adaptive window and without), each
into a fresh folder with a fresh Prefect home, all with `--concurrency`. From the emulator's request log it
prints, for each runner, the completions in each whole second from the first answer to the last, the
fewest in a second once the first `window_open` seconds have passed, and the span at the service (first
request received to last answer sent).

    uv run python bench/bench_stream.py --requests 640 --latency 1 --concurrency 32
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-stream-key"


def series(requests: list[dict[str, Any]]) -> tuple[list[int], float]:
    """Completions in each whole second from the first answer, and the span at the service."""
    ends = sorted(r["ended"] for r in requests if r.get("ended") and r.get("status") == 200)
    starts = [r["time"] for r in requests]
    if not ends:
        return [], 0.0
    first = ends[0]
    counts = [0] * (math.floor(ends[-1] - first) + 1)
    for end in ends:
        counts[math.floor(end - first)] += 1
    return counts, ends[-1] - min(starts)


def run(label: str, cmd: list[str], env: dict[str, str], emulator: Any, out: Path) -> dict[str, Any]:
    emulator.reset()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    counts, span = series(emulator.requests())
    return {"label": label, "code": done.returncode, "counts": counts, "span": span, "body": body(done, out)}


def body(done: subprocess.CompletedProcess[str], out: Path) -> float | None:
    """The flow body (run.json's start to end) of an imagebatch run; the peer's own loop seconds."""
    from datetime import datetime

    try:
        info = json.loads((out / "run.json").read_text())
        return (
            datetime.fromisoformat(info["ended_at"]) - datetime.fromisoformat(info["started_at"])
        ).total_seconds()
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for line in reversed(done.stdout.splitlines()):
        with contextlib.suppress(ValueError):
            figures = json.loads(line)
            return float(figures.get("loop_s") or figures.get("loop_seconds") or 0) or None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=640)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--window-open", type=int, default=3, help="seconds left out of the minimum")
    args = parser.parse_args()

    from imagebatch.emulator import EmulatorServer, EmulatorSettings

    settings = EmulatorSettings(
        api_key=KEY, seed=0, latency=args.latency, jpeg_rate=0.0, thought_image_rate=0.0
    )
    with (
        tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp_name,
        EmulatorServer(settings) as emulator,
    ):
        results = run_all(args, emulator, Path(tmp_name))
    report(args, results)


def run_all(args: argparse.Namespace, emulator: Any, tmp: Path) -> list[dict[str, Any]]:
    """The peer, then `imagebatch run` with the adaptive window and without, on one manifest."""
    manifest = tmp / "m.csv"
    manifest.write_text(
        "id,prompt\n" + "".join(f"r{i:05d},product shot {i % 8}\n" for i in range(args.requests))
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "IMAGEBATCH_"))}
    env = base | {"IMAGEBATCH_BASE_URL": emulator.url, "IMAGEBATCH_API_KEY": KEY}
    peer = [sys.executable, str(ROOT / "bench" / "peer.py"), str(manifest), "--out", str(tmp / "peer")]
    peer += ["--base-url", emulator.url, "--api-key", KEY, "--concurrency", str(args.concurrency)]
    results = [run("peer (asyncio)", peer, env, emulator, tmp / "peer")]
    for label, extra in (("imagebatch, adaptive", []), ("imagebatch, --no-adaptive", ["--no-adaptive"])):
        out = tmp / label.split(",")[1].strip().lstrip("-")
        cmd = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--out", str(out)]
        cmd += ["--concurrency", str(args.concurrency), "--no-report", *extra]
        results.append(run(label, cmd, env | {"PREFECT_HOME": str(out) + "-home"}, emulator, out))
    return results


def report(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    """The table: each runner's completions per second, and the fewest once the window has opened."""
    ideal = args.requests * args.latency / args.concurrency
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    head = f"{args.requests} requests x {args.latency:g} s at --concurrency {args.concurrency}"
    print(f"\n{head}: ideal span {ideal:.1f} s; load average at the end {load}")
    print(
        "| runner | exit | flow body (peer: its loop) s | span at the service, s | fewest a second after the "
        f"first {args.window_open} s | completions per second |"
    )
    print("|-|-|-|-|-|-|")
    for r in results:
        steady = r["counts"][args.window_open : -1] or r["counts"]
        shown = f"{r['body']:.1f}" if r["body"] else "-"
        fewest = min(steady) if steady else "-"
        print(f"| {r['label']} | {r['code']} | {shown} | {r['span']:.1f} | {fewest} | "
              f"{', '.join(map(str, r['counts']))} |")  # fmt: skip


if __name__ == "__main__":
    main()
