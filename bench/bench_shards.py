"""Issue 11, item 6: one manifest as one run, and as N shards on N workers, against a Prefect server on
PostgreSQL (SQLite with --database sqlite), the emulator in its own process.

    uv run python bench/bench_shards.py --requests 5000 --latency 0.5 --concurrency 32 --shards 2

Both variants are deployments run by `prefect worker start` processes on one process pool (the one-run
variant: one worker, `--shards 1`; the sharded one: N workers, `--shards N`), each started from a fresh
output folder. Figures: wall (trigger to the parent's end), requests/s, CPU per request of every worker
process tree (the workers and the flow runs they start), Prefect server CPU per request, errors in the
server's log. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scale_harness import (  # noqa: E402
    KEY,
    Emulator,
    fmt,
    idle_rate,
    machine,
    prefect_server,
    settle,
    table,
    tree_cpu,
    write_manifest,
)

from tests.helpers.prefect_server import start_worker, stop_process_group  # noqa: E402

FLOW = "generate_from_manifest"


def _api(api: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    response = httpx.request(method, f"{api}{path}", json=body, timeout=60)
    response.raise_for_status()
    return response.json()


TERMINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def create_process_pool(api: str, pool: str) -> None:
    """A process work pool named `pool` on the server at `api` (left as it is if it exists)."""
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    httpx.post(f"{api}/work_pools/", json={"name": pool, "type": "process", "base_job_template": template})


def wait_for_end(api: str, flow_run_id: str, poll: float = 0.5, timeout: float = 86400.0) -> dict[str, Any]:
    """The flow run once it is in a terminal state (polled every `poll` s; TimeoutError after `timeout`).
    A poll the server does not answer is tried again: Prefect's server on SQLite can stall for a minute
    under load."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = _api(api, "GET", f"/flow_runs/{flow_run_id}")
        except httpx.TransportError:
            state = {"state_type": "(the server did not answer)"}
        if state["state_type"] in TERMINAL:
            return state
        if time.monotonic() > deadline:
            raise TimeoutError(f"flow run {flow_run_id} still {state['state_type']} after {timeout} s")
        time.sleep(poll)


def one_variant(
    api: str, server_pid: int, emu: Emulator, manifest: Path, tmp: Path, shards: int, concurrency: int
) -> dict[str, Any]:
    pool = f"bench-pool-{shards}"
    create_process_pool(api, pool)
    out = tmp / f"out-{shards}"
    name = f"bench-{shards}"
    env = {"IMAGEBATCH_API_KEY": KEY, "PREFECT_HOME": str(tmp / f"worker-home-{shards}")}
    workers = [
        start_worker(api, pool, env, tmp / f"worker-{shards}-{i}.log", query_seconds=1.0)
        for i in range(max(1, shards))
    ]
    try:
        deploy = [
            sys.executable, "-m", "imagebatch.cli.main", "deploy", str(manifest), "--out", str(out),
            "--name", name, "--work-pool", pool, "--concurrency", str(concurrency), "--no-adaptive",
            "--base-url", emu.url, "--shards", str(shards), "--no-report",
        ]  # fmt: skip
        import os
        import subprocess

        subprocess.run(deploy, env={**os.environ, "PREFECT_API_URL": api}, check=True, capture_output=True)
        deployment = _api(api, "GET", f"/deployments/name/{FLOW}/{name}")
        emu.reset()
        server_idle = idle_rate(server_pid)
        server_before = tree_cpu(server_pid)
        t0 = time.monotonic()
        run = _api(api, "POST", f"/deployments/{deployment['id']}/create_flow_run", {})
        state = wait_for_end(api, run["id"])
        wall = time.monotonic() - t0
        settle_s = settle(server_pid, server_idle)
        server_cpu = tree_cpu(server_pid) - server_before - server_idle * (wall + settle_s)
        info = json.loads((out / "run.json").read_text())
        return {
            "shards": shards, "state": state["state_type"], "wall_s": wall, "counts": info["counts"],
            "server_cpu_s": server_cpu, "emulator_requests": emu.requests_seen(),
        }  # fmt: skip
    finally:
        for w in workers:
            stop_process_group(w, grace=3)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--database", choices=("postgres", "sqlite"), default="postgres")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as name:
        tmp = Path(name)
        manifest = tmp / "m.csv"
        write_manifest(manifest, args.requests)
        emu = Emulator(args.latency, 0.0, 0.0, tmp / "emulator.log")
        try:
            emu.warm()
            with prefect_server(tmp / "server", args.database) as server:
                results = [
                    one_variant(server.info.api_url, server.info.pid, emu, manifest, tmp, n, args.concurrency)
                    for n in (1, args.shards)
                ]
                log = server.info.log()
        finally:
            emu.close()
    errors = sum(line.count("ERROR") + line.count("Traceback") for line in log.splitlines())
    rows = []
    for r in results:
        ideal = args.requests * args.latency / (args.concurrency * r["shards"])  # N shards: N x the slots
        label = "one run, 1 worker" if r["shards"] == 1 else f"{r['shards']} shards, {r['shards']} workers"
        rate, of_ideal = args.requests / r["wall_s"], ideal / r["wall_s"]
        server = r["server_cpu_s"] / args.requests * 1e3
        rows.append([label, r["state"], fmt(r["wall_s"]), fmt(rate), f"{of_ideal:.2f}", fmt(server, ".2f"),
                     r["counts"].get("succeeded", 0)])  # fmt: skip
    print(f"\n{args.requests} requests, latency {args.latency} s, --concurrency {args.concurrency} per run "
          f"or shard, Prefect server on {args.database}; server log errors: {errors}")  # fmt: skip
    print(
        table(
            ["variant", "state", "wall s", "requests/s", "of ideal", "server CPU ms/req", "succeeded"], rows
        )
    )
    print(json.dumps({"bench": "shards", "args": vars(args), "results": results, "server_log_errors": errors,
                      "machine": machine()}))  # fmt: skip


if __name__ == "__main__":
    main()
