"""Whole runs whose requests get no answer (the emulator's `drop`: generated and billed, then the connection
closed): on every route the request is `unknown` after one attempt, the service bills its key once, and
neither the retry schedule nor a plain rerun sends it again; `--retry-unknown` does, when asked."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from helpers.runs import read_results, run_flow, write_jsonl

from imagebatch.run.hooks import RunHooks, run_hooks


def run(manifest: Path, out: Path, **kw: Any) -> tuple[dict[str, Any], list[float]]:
    """Run the flow with a recording sleep; return its summary and the waits it asked for."""
    delays: list[float] = []
    with run_hooks(RunHooks(sleep=delays.append)):
        info = run_flow(manifest=str(manifest), out=str(out), **kw)
    return info, delays


def sent_keys(emulator: Any) -> Counter[str]:
    """How many times each idempotency key reached the service."""
    return Counter(r["idempotency_key"] for r in emulator.requests() if r["idempotency_key"])


def billed_keys(emulator: Any) -> Counter[str]:
    return Counter(entry["idempotency_key"] for entry in emulator.ledger())


def test_a_dropped_images_answer_is_billed_once_and_not_resent(
    service_env: Any, tmp_path: Path, caplog: Any
) -> None:
    """The issue's reproduction: `drop` then `ok` on a compat-image-2 row. Before, the schedule resent it
    3 s later ("retrying in 3 s") and the service billed the key twice."""
    caplog.set_level(logging.WARNING, logger="imagebatch.gateway")
    jobs = [
        {"id": "lost", "model": "compat-image-2", "prompt": "a lost answer"},
        {"id": "kept", "model": "compat-image-2", "prompt": "a kept answer"},
    ]
    manifest = write_jsonl(tmp_path / "m.jsonl", jobs)
    service_env.set_faults(scripts=[{"outcomes": ["drop", "ok"], "match": "lost answer"}])
    out = tmp_path / "out"
    _, delays = run(manifest, out)
    assert delays == []
    lost, kept = read_results(out)
    assert (lost["status"], lost["attempts"]) == ("unknown", "1") and "--retry-unknown" in lost["error"]
    assert kept["status"] == "succeeded"
    assert billed_keys(service_env)[lost["idempotency_key"]] == 1
    messages = [r.getMessage() for r in caplog.records if lost["idempotency_key"] in r.getMessage()]
    assert messages and not any("retrying" in m for m in messages)
    assert all("not resent automatically" in m for m in messages)

    sent = len(service_env.requests())
    _, delays = run(manifest, out)  # a plain rerun
    assert delays == [] and len(service_env.requests()) == sent
    assert read_results(out)[0]["status"] == "unknown"
    assert billed_keys(service_env)[lost["idempotency_key"]] == 1

    run(manifest, out, retry_unknown=True)  # asked for: the service's second attempt answers
    assert read_results(out)[0]["status"] == "succeeded"
    assert billed_keys(service_env)[lost["idempotency_key"]] == 2


def test_a_dropped_answer_on_every_route_is_sent_once(
    service_env: Any, examples: Path, tmp_path: Path
) -> None:
    """Every first attempt of every key is dropped (the mixed example has all six routes): no key reaches
    the service twice or is billed twice, no retry wait is asked for, and nothing is done (a chain's later
    turns wait for its first)."""
    service_env.set_faults(scripts=[["drop", "ok"]])
    out = tmp_path / "out"
    info, delays = run(examples / "mixed.json", out)
    assert delays == []
    rows = read_results(out)
    assert {r["route"] for r in rows if r["status"] == "unknown"} == {
        "native", "chat", "images_generations", "images_edits", "messages", "responses",
    }  # fmt: skip
    assert {r["status"] for r in rows} == {"unknown", "not_attempted"}
    assert {r["job_id"] for r in rows if r["status"] == "not_attempted"} == {"mug-desk-chain"}
    assert info["counts"]["unknown"] == 7
    assert all(r["attempts"] == "1" for r in rows if r["status"] == "unknown")
    assert set(sent_keys(service_env).values()) == {1}
    assert billed_keys(service_env) == sent_keys(service_env)

    sent = len(service_env.requests())
    run(examples / "mixed.json", out)
    assert len(service_env.requests()) == sent  # a plain rerun sends none of them
