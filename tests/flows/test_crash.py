"""A run killed with SIGKILL in the middle loses no finished image, and its rerun generates nothing twice."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import Gate, kill_mid_run, read_results, run_flow, start_run, write_jsonl
from PIL import Image

from imagebatch.run.hooks import RunHooks, run_hooks
from imagebatch.work.store import OutputStore, read_jsonl

JOBS = 24
PASS_FIRST = 6  # generations let through before the gate closes and the process is killed


def test_kill_9_mid_run_then_rerun(service_env: Any, prefect_harness: str, tmp_path: Path, out: Path) -> None:
    manifest = write_jsonl(
        tmp_path / "m.jsonl", [{"id": f"job{i:02d}", "prompt": f"crash {i}"} for i in range(JOBS)]
    )
    code = kill_mid_run(service_env, prefect_harness, manifest, out, let_through=PASS_FIRST, concurrency=3)
    assert code == -signal.SIGKILL

    # What the killed run left is readable, and every outcome it recorded as succeeded has its image.
    states = OutputStore(out).load_state()
    assert list(read_jsonl(out / "usage.jsonl"))  # readable (a torn last line is skipped)
    finished = {k: s.outcome for k, s in states.items() if s.outcome and s.outcome.status == "succeeded"}
    assert finished, "the gate let some generations through before the kill"
    for record in finished.values():
        for rel in record.paths:
            with Image.open(out / rel) as img:
                img.verify()
    in_doubt = {k for k, s in states.items() if s.status == "unknown"}
    assert in_doubt, "requests were in flight when the process died"
    # run.json still says the dead run is running; a reader that may write corrects it, as the next run does.
    assert json.loads((out / "run.json").read_text())["state"] == "running"
    settled = OutputStore(out).settle_dead_run("2026-11-27T00:00:00+00:00")
    assert settled is not None and settled.state == "crashed"
    left = json.loads((out / "run.json").read_text())
    assert (left["state"], left["noticed_at"]) == ("crashed", "2026-11-27T00:00:00+00:00")
    assert OutputStore(out).settle_dead_run("later") is None  # nothing more to correct

    service_env.configure(sleep=asyncio.sleep, latency=0.0)
    before = Counter(r["idempotency_key"] for r in service_env.requests())
    with run_hooks(RunHooks(sleep=lambda s: None)):
        info = run_flow(manifest=str(manifest), out=str(out), concurrency=3)

    rows = read_results(out)
    assert len(rows) == JOBS
    statuses = Counter(r["status"] for r in rows)
    # The in-doubt requests are left alone; everything else is done, and nothing was generated twice.
    assert statuses["unknown"] == len(in_doubt)
    assert statuses["succeeded"] + statuses["skipped"] + statuses["unknown"] == JOBS
    # Every request the service received, across the killed run and the rerun: none sent twice. The rerun
    # sent none of the in-doubt requests (journaled before sending, so some may never have left) and
    # nothing the killed run had sent.
    received = Counter(r["idempotency_key"] for r in service_env.requests())
    assert max(received.values()) == 1, received
    resent = set(received - before)
    assert not resent & in_doubt and not resent & set(before)
    done_keys = {r["idempotency_key"] for r in rows if r["status"] in ("succeeded", "skipped")}
    assert done_keys <= {e["idempotency_key"] for e in service_env.ledger()}
    assert info["counts"]["unknown"] == len(in_doubt)
    for row in rows:
        for rel in filter(None, row["paths"].split(";")):
            assert (out / rel).is_file()
    json.loads((out / "run.json").read_text())


@pytest.mark.parametrize(
    ("signum", "code", "name"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_a_stop_signal_stops_gracefully(
    service_env: Any, prefect_harness: str, tmp_path: Path, out: Path, signum: int, code: int, name: str
) -> None:
    """SIGINT (Ctrl-C) and SIGTERM (what schedulers and workers send first): no new request; those in
    flight finish and are saved; the rest are not_attempted; results and run.json are written; exit
    128 + the signal's number."""
    manifest = write_jsonl(
        tmp_path / "m.jsonl", [{"id": f"job{i:02d}", "prompt": f"stop {i}"} for i in range(12)]
    )
    gate = Gate(4)
    service_env.configure(latency=0.001, sleep=gate)
    child = start_run(service_env, prefect_harness, manifest, out, concurrency=2, text=True)
    seen: list[str] = []
    try:
        assert gate.closed_on_someone.wait(timeout=180)
        child.send_signal(signum)
        assert child.stderr is not None
        for line in child.stderr:  # the run has taken the stop before the held requests may finish
            seen.append(line)
            if "Stopping" in line:
                break
    finally:
        gate.release.set()  # the held requests may now finish: the run waits for them and saves them
    _, rest = child.communicate(timeout=120)
    stderr = "".join(seen) + rest
    service_env.configure(sleep=asyncio.sleep, latency=0.0)

    assert child.returncode == code, stderr
    assert "Traceback" not in stderr and "Stopping" in stderr and "Crash detected" not in stderr
    rows = read_results(out)
    statuses = Counter(r["status"] for r in rows)
    assert statuses["succeeded"] >= 4 and statuses["not_attempted"] >= 1
    assert statuses["succeeded"] + statuses["not_attempted"] == len(rows) == 12, (statuses, stderr[-3000:])
    # Everything in flight when the signal came was waited for: nothing the service received is in doubt.
    received = {r["idempotency_key"] for r in service_env.requests()}
    assert received == {r["idempotency_key"] for r in rows if r["status"] == "succeeded"}
    run = json.loads((out / "run.json").read_text())
    assert run["state"] == "stopped" and run["stopped"] == f"interrupted ({name})"


def test_a_second_signal_abandons_the_run_and_run_json_says_so(
    service_env: Any, prefect_harness: str, tmp_path: Path, out: Path
) -> None:
    """Issue 21 #9: Ctrl-C then SIGTERM while requests are held in flight: the run exits at once (130, the
    first signal's code) and run.json says "abandoned" instead of "running"."""
    manifest = write_jsonl(
        tmp_path / "m.jsonl", [{"id": f"job{i:02d}", "prompt": f"drop {i}"} for i in range(12)]
    )
    gate = Gate(4)
    service_env.configure(latency=0.001, sleep=gate)
    child = start_run(service_env, prefect_harness, manifest, out, concurrency=2, text=True)
    try:
        assert gate.closed_on_someone.wait(timeout=180)
        child.send_signal(signal.SIGINT)
        assert child.stderr is not None
        while "Stopping" not in (line := child.stderr.readline()):
            assert line, "the run ended without acknowledging Ctrl-C"
        child.send_signal(signal.SIGTERM)  # the held requests never finish: only an abandon ends the run
        _, rest = child.communicate(timeout=120)
    finally:
        gate.release.set()
        if child.poll() is None:
            child.kill()
        service_env.configure(sleep=asyncio.sleep, latency=0.0)
    assert child.returncode == 130, rest
    assert "Abandoned the requests in flight" in rest and "Traceback" not in rest
    run = json.loads((out / "run.json").read_text())
    assert run["state"] == "abandoned" and run["ended_at"]
    assert run["stopped"] == "abandoned (Ctrl-C, then SIGTERM): requests in flight are unknown"
    assert OutputStore(out).load_state()  # the journal the rerun reads is intact
