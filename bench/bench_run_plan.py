"""Benchmark: the peak RSS of a whole run held in one process, planning, dispatch and records (a script).

    uv run python bench/bench_run_plan.py --requests 20000 100000 200000 [--src /tmp/before/src]

For each size, writes a CSV manifest of that many rows (`bench_manifest.write_manifest`: one request a
row) and runs the batch flow on it in a child process of its own (with `--src` first on `PYTHONPATH`, to
run other code), into a fresh folder, `--no-report`, on an in-process service: an `httpx.MockTransport`
answering each request at once with a tiny PNG in the native route's shape (`RunHooks.transport`), so
that what is measured is imagebatch's own planning, dispatch and records, not HTTP. Prefect's temporary
server is a process of its own: the child prints its own peak RSS (`VmHWM`, the flow's process alone),
and its CPU seconds (user + sys, this process). Prints a row per size: requests, peak RSS MiB, CPU s,
wall s, and the run's counts. With `--plan-only`, no run: the child loads the manifest, makes the run's
plan (before: the list of every unit; after: `run.plan.RunPlan`, counted) and goes over it once more, as
the end of a run does; its last column is then the requests seen on that second pass.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_flow import write_manifest

CHILD = r"""
import base64, json, os, resource, struct, sys, zlib
import httpx
from imagebatch.flows.batch import generate_from_manifest
from imagebatch.options import RunOptions
from imagebatch.run.final_state import summary_of
from imagebatch.run.hooks import RunHooks, run_hooks

def png():
    raw = b"\x00\xff\xff\xff"  # one white pixel, RGB
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    head = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body

IMAGE = base64.b64encode(png()).decode()
USAGE = {"promptTokenCount": 8, "candidatesTokenCount": 1290, "thoughtsTokenCount": 0,
         "totalTokenCount": 1298}

def answer(request):
    model = request.url.path.rsplit("/", 1)[-1].split(":")[0]
    body = {"candidates": [{"content": {"role": "model", "parts": [
                {"inlineData": {"mimeType": "image/png", "data": IMAGE}}]},
            "finishReason": "STOP", "index": 0}],
            "usageMetadata": USAGE, "modelVersion": model, "responseId": "r1"}
    return httpx.Response(200, json=body, headers={"x-request-id": "req_r1"})

manifest, out, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.environ["IMAGEBATCH_API_KEY"] = "bench-key"
options = RunOptions.from_flat(base_url="http://service.invalid", report=False, concurrency=concurrency)
with run_hooks(RunHooks(transport=httpx.MockTransport(answer))):
    state = generate_from_manifest(manifest=manifest, out=out, options=options, return_state=True)
summary = summary_of(state)
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
own = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"peak_kib": peak, "cpu": own.ru_utime + own.ru_stime, "counts": summary.get("counts"),
                  "requests": summary.get("requests")}))
"""

PLAN_ONLY = r"""
import json, resource, sys
from imagebatch.manifest import load_manifest, plan
from imagebatch.work.context import group_units
manifest = load_manifest(sys.argv[1])
try:
    from imagebatch.run.plan import RunPlan
except ImportError:  # the code before the plan was a stream: the run's list of units
    units = list(group_units(plan(manifest)))
    requests = sum(len(u.requests) for u in units)
    units_again = sum(len(u.requests) for u in units)
else:
    run_plan = RunPlan(manifest.jobs)
    run_plan.count()
    requests = run_plan.requests
    units_again = sum(len(u.requests) for u in run_plan)
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
own = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"peak_kib": peak, "cpu": own.ru_utime + own.ru_stime, "counts": units_again}))
"""


def once(
    src: str | None, manifest: Path, out: Path, concurrency: int, plan_only: bool = False
) -> tuple[dict[str, object], float]:
    """What the child printed, and its wall seconds."""
    import json

    env = dict(os.environ, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600")  # a loaded machine
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    cmd = [sys.executable, "-c", PLAN_ONLY if plan_only else CHILD, str(manifest), str(out), str(concurrency)]
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"the child failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[20_000, 100_000, 200_000])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--src", help="another tree's src/ (the code before a change), first on PYTHONPATH")
    parser.add_argument(
        "--plan-only", action="store_true",
        help="only load the manifest, plan it as the run does and go over the plan again (no Prefect)",
    )  # fmt: skip
    args = parser.parse_args()
    print("| requests | peak RSS MiB | CPU s | wall s | counts |")
    print("|-|-|-|-|-|")
    for n in args.requests:
        with tempfile.TemporaryDirectory() as tmp:
            manifest = Path(tmp) / "m.csv"
            write_manifest(manifest, n)
            got, wall = once(args.src, manifest, Path(tmp) / "out", args.concurrency, args.plan_only)
            peak = int(got["peak_kib"]) / 1024  # type: ignore[call-overload]
            cells = [f"{n:,}", f"{peak:.0f}", f"{got['cpu']:.1f}", f"{wall:.0f}", got["counts"]]
            print("| " + " | ".join(map(str, cells)) + " |", flush=True)


if __name__ == "__main__":
    main()
