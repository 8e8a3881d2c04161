"""A run against a rate-limited service (issue 10, item 3): dispatch starts low and adapts to 429s, the
native route's 429s are `failed` and reported, a rerun sends exactly those; `--rpm` paces the starts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import read_results, run_flow, run_now, write_jsonl

from imagebatch.run.hooks import RunHooks, run_hooks


@pytest.fixture
def limited(service_env: Any) -> Any:
    """The session emulator allowing 4 generations at once; each takes a little while, so requests
    overlap as they would against a real service."""
    service_env.configure(max_in_flight=4, latency=0.02)
    return service_env


def test_a_run_against_an_unknown_limit_loses_few_requests_and_a_rerun_sends_exactly_those(
    limited: Any, tmp_path: Path, out: Path
) -> None:
    manifest = write_jsonl(
        tmp_path / "m.jsonl", [{"id": f"j{i:03d}", "prompt": f"kite {i}"} for i in range(200)]
    )
    info = run_now(manifest, out, concurrency=32)

    rows = read_results(out)
    statuses = Counter(r["status"] for r in rows)
    failed = {r["idempotency_key"] for r in rows if r["status"] == "failed"}
    assert set(statuses) <= {"succeeded", "failed"} and len(rows) == 200
    assert len(failed) <= 20, statuses  # at most 10 % lost to 429
    assert all("HTTP 429" in r["error"] for r in rows if r["status"] == "failed")
    assert info["rate_limited"] == len(failed)
    assert not [e for e in limited.requests() if e["status"] == 200 and e["limit"]]

    limited.reset()
    limited.configure(max_in_flight=None)
    run_now(manifest, out, concurrency=32)
    assert {e["idempotency_key"] for e in limited.requests()} == failed  # exactly the ones that failed
    after = Counter(r["status"] for r in read_results(out))
    assert after == {"skipped": 200 - len(failed), "succeeded": len(failed)}


def test_without_adaptation_most_of_the_overshoot_fails(limited: Any, tmp_path: Path) -> None:
    """The baseline the window is measured against: 32 at once against a limit of 4."""
    manifest = write_jsonl(
        tmp_path / "m.jsonl", [{"id": f"j{i:03d}", "prompt": f"kite {i}"} for i in range(64)]
    )
    info = run_now(manifest, tmp_path / "out", concurrency=32, adaptive=False)
    assert info["rate_limited"] > 6  # more than 10 %: the adaptive run above stays under that at 200


def test_rpm_paces_the_starts(service_env: Any, tmp_path: Path) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": f"p{i}", "prompt": f"kite {i}"} for i in range(5)])
    waits: list[float] = []
    now = [0.0]

    def sleep(seconds: float) -> None:  # time passes only in the run's sleeps: a loaded machine's
        waits.append(seconds)  # slowness between two starts is not counted in the pacing
        now[0] += seconds

    with run_hooks(RunHooks(sleep=sleep, clock=lambda: now[0])):
        info = run_flow(manifest=str(manifest), out=str(tmp_path / "out"), rpm=30, concurrency=1)
    assert info["counts"]["succeeded"] == 5
    # 30 a minute: starts 2 s apart. The first starts at once; each later one waits the 2 s left.
    assert waits == [2.0, 2.0, 2.0, 2.0] and now[0] == 8.0
