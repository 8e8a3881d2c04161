"""A request's record (`work.records`), through one unit against the fake service: which errors stop the
whole run and what the stop says, a failure counted by its status, and the files' names.

The service is the shared fake (tests/helpers/units.py: the `h` fixture, tests/work/conftest.py).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from helpers.units import (
    CAT,
    CHAIN,
    IMAGES,
    Harness,
    answer_png,
    error,
)

from imagebatch.work.unit import run_unit


def test_a_rate_limited_failure_is_counted_by_its_status_not_by_its_message(h: Harness) -> None:
    """run.json's `rate_limited` counts records whose last answer was a 429 (a typed field the journal
    keeps for a rerun or a sharded run's parent), not messages that happen to say "HTTP 429"."""
    from imagebatch.run.outputs import rate_limited

    units = h.units(CAT, {"id": "dog", "prompt": "a dog"})
    h.service.reply(
        (429, {"error": {"message": "slow down", "code": "rate_limit_exceeded"}}),
        (503, {"error": {"message": "upstream answered HTTP 429", "code": "service_unavailable"}}),
    )
    ctx = h.context()
    limited, other = (run_unit(ctx, unit)[0] for unit in units)
    assert (limited.status, limited.http_status) == ("failed", 429)
    assert (other.status, other.http_status) == ("failed", 503) and "HTTP 429" in (other.error or "")
    assert rate_limited([limited, other]) == 1
    replayed = h.context().states[limited.idempotency_key].outcome
    assert replayed is not None and replayed.http_status == 429


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (error(401, "invalid_api_key"), "IMAGEBATCH_API_KEY"),
        (error(402, "insufficient_funds"), "insufficient funds"),
        (error(404, "not_found"), "base URL"),
        (httpx.ConnectError, "base URL"),
    ],
    ids=["401", "402", "404", "connect-error"],
)
def test_account_and_address_errors_stop_the_run(h: Harness, reply: Any, reason: str) -> None:
    first, second, chain = h.units(CAT, {"id": "b", "prompt": "dog"}, CHAIN)
    h.service.reply(reply)
    ctx = h.context()
    (rec,) = run_unit(ctx, first)
    assert rec.status == "failed"
    assert ctx.state.halt.is_set() and reason in (ctx.state.halt_reason or "")
    assert h.service.count == 1

    (other,) = run_unit(ctx, second)
    assert other.status == "not_attempted" and other.error == ctx.state.halt_reason
    assert [r.status for r in run_unit(ctx, chain)] == ["not_attempted"] * 3
    assert h.service.count == 1  # nothing sent after the halt


def test_a_404_for_an_unknown_model_does_not_stop_the_run(h: Harness) -> None:
    first, second = h.units(CAT, {"id": "b", "prompt": "dog"})
    h.service.reply(error(404, "model_not_found"))
    ctx = h.context()
    assert run_unit(ctx, first)[0].status == "failed"
    assert not ctx.state.halt.is_set()
    assert run_unit(ctx, second)[0].status == "succeeded"
    assert h.service.count == 2


def test_an_unanswered_attempt_ends_its_request_and_does_not_stop_the_run(h: Harness) -> None:
    """No answer is not a refusal: its request is `unknown` (never resent to learn more), and the run goes
    on; the next request's 401 is what stops it."""
    first, second, third = h.units(
        IMAGES, {"id": "g2", "model": "compat-image-2", "prompt": "y"}, {"id": "g3", "prompt": "z"}
    )
    h.service.reply(httpx.ReadTimeout, error(401, "invalid_api_key"))
    ctx = h.context()
    (rec,) = run_unit(ctx, first)
    assert rec.status == "unknown" and h.service.count == 1
    assert not ctx.state.halt.is_set()
    assert run_unit(ctx, second)[0].status == "failed"
    assert ctx.state.halt.is_set() and "IMAGEBATCH_API_KEY" in (ctx.state.halt_reason or "")
    assert run_unit(ctx, third)[0].status == "not_attempted"


def test_a_401_names_where_the_key_came_from(h: Harness) -> None:
    """A key read from a Secret block is fixed there, not in IMAGEBATCH_API_KEY."""
    unit = h.unit(CAT)
    h.service.reply(error(401, "invalid_api_key"))
    ctx = h.context(key_source="the Prefect Secret block 'team-key'")
    run_unit(ctx, unit)
    assert ctx.state.halt_reason == (
        "the service refused the API key (HTTP 401): set the Prefect Secret block 'team-key' to a valid key"
    )


def test_similar_job_ids_and_copies_never_share_a_file(h: Harness) -> None:
    units = h.units({"id": "a", "prompt": "cat", "count": 2}, {"id": "a_1", "prompt": "cat"})
    ctx = h.context()
    records = [rec for unit in units for rec in run_unit(ctx, unit)]
    assert [r.status for r in records] == ["succeeded"] * 3
    paths = [p for r in records for p in r.paths]
    assert len(paths) == len(set(paths)) == 3
    written = sorted(p.relative_to(h.out).as_posix() for p in (h.out / "images").rglob("*") if p.is_file())
    assert written == sorted(paths)
    assert [(h.out / p).read_bytes() for p in paths] == [
        answer_png(9),
        answer_png(10),
        answer_png(11),
    ]


def test_an_edited_row_writes_a_new_file_and_keeps_the_old_one(h: Harness) -> None:
    (old,) = run_unit(h.context(), h.unit(CAT))
    old_bytes = (h.out / old.paths[0]).read_bytes()
    (new,) = run_unit(h.context(), h.unit({"id": "a", "prompt": "dog"}))
    assert h.service.count == 2 and new.status == "succeeded"
    assert new.idempotency_key != old.idempotency_key
    assert new.paths != old.paths
    assert (h.out / old.paths[0]).read_bytes() == old_bytes
    assert (h.out / new.paths[0]).read_bytes() == answer_png(10)
