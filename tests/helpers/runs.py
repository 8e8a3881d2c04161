"""Small readers and writers shared by the tests that run the flow: manifests written from rows, a run of the
flow with no real waiting (`run_now`), results and journals read back, and the emulator's sleep gates."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from imagebatch.cli.main import main
from imagebatch.storage.csvcells import read_csv


def write_jsonl(path: Path, jobs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    return path


def write_csv(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """A CSV manifest of `rows` (the first row's keys are the header; a missing cell is empty), written by
    the csv module, so a comma or a quote in a cell stays in its cell."""
    rows = list(rows)
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]), restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def catalog(path: Path, rows: int, prefix: str = "p") -> Path:
    """A CSV manifest of `rows` plain jobs (`id`: `p0000`, `p0001`...; `prompt`: `photo of product 0`...)."""
    jobs = ({"id": f"{prefix}{i:04d}", "prompt": f"photo of product {i}"} for i in range(rows))
    return write_csv(path, jobs)


def read_results(out: Path) -> list[dict[str, str]]:
    """results.csv's rows, every cell as it was before the writer neutralised formulas."""
    return list(read_csv(out / "results.csv"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def summary_counts(out: str) -> dict[str, int]:
    """The rows of the summary table printed on stdout: {status: requests}."""
    counts = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 2 and cells[1].isdigit():
            counts[cells[0]] = int(cells[1])
    return counts


def peak_in_flight(requests: list[dict[str, Any]]) -> int:
    """The most requests the emulator was answering at once, from its request log's start and end times."""
    edges = [(r["time"], 1) for r in requests] + [(r["ended"], -1) for r in requests]
    peak = now = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start at the same instant
        now += step
        peak = max(peak, now)
    return peak


class Rendezvous:
    """The emulator's latency sleep: holds each generation until `size` are held at once, then lets every
    one through. A test asserting that requests overlapped waits for the overlap (an event) instead of
    hoping a latency is long enough on a loaded machine; if they never overlap, it gives up after
    `bound` seconds and the test's assertion fails."""

    def __init__(self, size: int, bound: float = 60.0) -> None:
        self.size = size
        self.bound = bound
        self.held = 0
        self.met = threading.Event()

    async def __call__(self, _seconds: float) -> None:
        self.held += 1  # the emulator's event loop: one thread
        if self.held >= self.size:
            self.met.set()
        if not self.met.is_set():
            await asyncio.to_thread(self.met.wait, self.bound)
        self.held -= 1


def run_now(
    manifest: Path | str, out: Path | str, waits: list[float] | None = None, **options: Any
) -> dict[str, Any]:
    """Run the flow here (`run_flow`) on `manifest` into `out` without waiting for real: every wait the run
    asks for (a retry's delay, pacing) is appended to `waits` instead, when given."""
    from imagebatch.run.hooks import RunHooks, run_hooks

    sleep = waits.append if waits is not None else (lambda _seconds: None)
    with run_hooks(RunHooks(sleep=sleep)):
        return run_flow(str(manifest), str(out), **options)


def run_flow(manifest: str, out: str, **options: Any) -> dict[str, Any]:
    """Run the flow here with these options (named alone: `concurrency=3`; a shard's role too) and return
    its run summary, whatever its final state (Completed, Failed, Cancelled); what the flow raised is
    raised."""
    from imagebatch.flows.batch import generate_from_manifest
    from imagebatch.options import RunOptions, ShardRole
    from imagebatch.run.final_state import summary_of

    role = ShardRole(**{k: options.pop(k) for k in list(options) if k in ShardRole.model_fields})
    run_options = RunOptions.from_flat(**options)
    state = generate_from_manifest(
        manifest=manifest, out=out, options=run_options, role=role, return_state=True
    )
    return summary_of(state)


class Gate:
    """The emulator's latency sleep: lets the first N generations through, then holds every later one
    (so requests are in flight when the client dies) until released."""

    def __init__(self, open_for: int) -> None:
        self.open_for = open_for
        self.calls = 0
        self.closed_on_someone = threading.Event()
        self.release = threading.Event()

    async def __call__(self, _seconds: float) -> None:
        self.calls += 1
        if self.calls <= self.open_for:
            return
        self.closed_on_someone.set()
        await asyncio.to_thread(self.release.wait)


def start_run(
    service_env: Any, prefect_harness: str, manifest: Path, out: Path, *, concurrency: int, text: bool
) -> subprocess.Popen[Any]:
    """`imagebatch run` as a real process against the session emulator and the session's Prefect server
    (so no second Prefect server has to start), its stderr piped."""
    env = {
        **os.environ,
        "IMAGEBATCH_BASE_URL": service_env.url,
        "IMAGEBATCH_API_KEY": service_env.api_key,
        "PREFECT_API_URL": prefect_harness,
    }
    cmd = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--out", str(out)]
    cmd += ["--concurrency", str(concurrency)]
    stdout = subprocess.PIPE if text else subprocess.DEVNULL
    return subprocess.Popen(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=text)


def kill_mid_run(
    service_env: Any,
    prefect_harness: str,
    manifest: Path,
    out: Path | str,
    *,
    let_through: int,
    concurrency: int,
) -> int:
    """`imagebatch run` as a real process, killed with SIGKILL once `let_through` generations are answered
    and later ones are held in flight; the emulator is left answering at once again. Its return code."""
    gate = Gate(let_through)
    service_env.configure(latency=0.001, sleep=gate)
    child = start_run(service_env, prefect_harness, manifest, out, concurrency=concurrency, text=False)  # type: ignore[arg-type]
    try:
        assert gate.closed_on_someone.wait(timeout=180), child.stderr.read().decode() if child.poll() else ""
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        gate.release.set()
        if child.poll() is None:
            child.kill()
        if child.stderr:
            child.stderr.close()
    service_env.configure(sleep=asyncio.sleep, latency=0.0)
    return child.returncode
