"""One unit of work (`work.unit`) against the fake service: `--force` and `--retry-unknown`, and
`settle`, which turns an internal error into a record that says what was sent.

The service is the shared fake (tests/helpers/units.py: the `h` fixture, tests/work/conftest.py).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from helpers.images import png
from helpers.units import (
    CAT,
    CHAIN,
    Harness,
)

from imagebatch.work import records
from imagebatch.work import unit as unit_module
from imagebatch.work.records import UNKNOWN_HINT
from imagebatch.work.unit import run_unit, settle


def test_force_resends_a_succeeded_request(h: Harness) -> None:
    unit = h.unit(CAT)
    (first,) = run_unit(h.context(), unit)
    assert run_unit(h.context(), unit)[0].status == "skipped"
    assert h.service.count == 1
    (forced,) = run_unit(h.context(force=True), unit)
    assert h.service.count == 2 and forced.status == "succeeded"
    assert forced.paths == first.paths
    assert (h.out / forced.paths[0]).read_bytes() == png(
        10, 8, (10, 200, 30)
    )  # the new answer replaced the old file


def test_retry_unknown_resends_an_unknown_request(h: Harness) -> None:
    unit = h.unit(CAT)
    h.service.reply(httpx.ReadTimeout)
    assert run_unit(h.context(), unit)[0].status == "unknown"
    assert run_unit(h.context(), unit)[0].status == "unknown"
    assert h.service.count == 1
    (rec,) = run_unit(h.context(retry_unknown=True), unit)
    assert h.service.count == 2 and rec.status == "succeeded"
    assert run_unit(h.context(), unit)[0].status == "skipped"


def test_an_internal_error_after_the_attempt_started_is_unknown(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CAT)

    def broken(*_args: Any) -> Any:
        raise RuntimeError("bug in plan_files")

    monkeypatch.setattr(records, "plan_files", broken)
    ctx = h.context()
    (rec,) = settle(ctx, unit)
    assert ctx.state.results[unit.index] == [rec]  # kept for results.csv as well as returned
    assert h.service.count == 1
    assert rec.status == "unknown"
    assert "internal error: RuntimeError: bug in plan_files" in (rec.error or "")
    assert UNKNOWN_HINT in (rec.error or "")

    monkeypatch.undo()
    rerun = h.context()
    assert rerun.states[unit.requests[0].idempotency_key].status == "unknown"  # answered, never saved
    assert run_unit(rerun, unit)[0].status == "unknown"
    assert h.service.count == 1


def test_a_settled_unit_lets_go_of_its_started_keys_and_they_stay_counted(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run keeps which keys it started only for units in flight (a set of every key sent grew with
    the run); how many it started (run.json's `sent`) counts them all, each key once."""
    ctx = h.context()
    cat, chain = h.unit(CAT), h.unit(CHAIN)
    seen: list[bool] = []
    release = ctx.state.started_keys.release

    def released(keys: Any) -> None:
        keys = list(keys)
        seen.append(all(k in ctx.state.started_keys for k in keys))  # held until the unit settled
        release(keys)

    monkeypatch.setattr(ctx.state.started_keys, "release", released)
    settle(ctx, cat)
    settle(ctx, chain)
    keys = [r.idempotency_key for u in (cat, chain) for r in u.requests]
    assert seen == [True, True] and len(keys) > 2
    assert len(ctx.state.started_keys) == len(set(keys))  # every turn of the chain counted, once
    assert not any(k in ctx.state.started_keys for k in keys)  # none kept


def test_an_internal_error_before_any_attempt_is_not_attempted(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CAT)

    def broken(*_args: Any) -> Any:
        raise RuntimeError("bug before sending")

    monkeypatch.setattr(unit_module, "build_request", broken)
    (rec,) = settle(h.context(), unit)
    assert h.service.count == 0
    assert rec.status == "not_attempted" and "bug before sending" in (rec.error or "")


def test_an_internal_error_in_a_later_turn_keeps_the_earlier_turns_records(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CHAIN)
    real = records.plan_files

    def broken_on_turn_1(req: Any, result: Any, chain: bool) -> Any:
        if req.turn_index == 1:
            raise RuntimeError("bug in plan_files")
        return real(req, result, chain)

    monkeypatch.setattr(records, "plan_files", broken_on_turn_1)
    out = settle(h.context(), unit)
    assert h.service.count == 2
    assert [r.status for r in out] == ["succeeded", "unknown", "not_attempted"]
