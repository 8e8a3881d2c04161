"""Edit chains (`work.chain`) against the fake service: every earlier turn sent back exactly as returned,
the history saved under `chains/`, a chain resumed, stopped, edited or remade.

The service is the shared fake (tests/helpers/units.py: the `h` fixture, tests/work/conftest.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.units import (
    CHAIN,
    Crash,
    Harness,
    crash,
    error,
    key12,
    native_no_image,
    native_ok,
)

from imagebatch.work.unit import run_unit


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def model_turn(h: Harness, i: int) -> dict[str, Any]:
    """The model content the service answered to request `i`, exactly as sent."""
    return h.service.answers[i].json["candidates"][0]["content"]


def test_chain_sends_every_earlier_turn_exactly_as_returned(h: Harness) -> None:
    unit = h.unit(CHAIN)
    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["succeeded"] * 3
    assert [r.turn_index for r in records] == [0, 1, 2]
    assert h.service.count == 3
    assert h.service.body(0)["contents"] == [user("p")]
    assert h.service.body(1)["contents"] == [user("p"), model_turn(h, 0), user("t1")]
    assert h.service.body(2)["contents"] == [
        user("p"),
        model_turn(h, 0),
        user("t1"),
        model_turn(h, 1),
        user("t2"),
    ]
    # Byte-level: part order, thought parts and signatures untouched.
    sent_back = h.service.body(2)["contents"][3]
    assert [p.get("thoughtSignature") for p in sent_back["parts"]] == ["thought-sig-2", None, "sig-2"]
    assert json.dumps(sent_back, sort_keys=True) == json.dumps(model_turn(h, 1), sort_keys=True)

    for rec in records:
        assert rec.paths == [f"images/c/0-t{rec.turn_index}-{key12(rec)}.png"]
        assert (h.out / rec.paths[0]).is_file()
    saved = json.loads((h.out / "chains" / "c" / "0.json").read_text())
    assert saved["job_id"] == "c"
    assert [t["key"] for t in saved["turns"]] == [r.idempotency_key for r in records]
    assert saved["turns"][1]["contents"] == [user("t1"), model_turn(h, 1)]


def test_chain_resumes_at_the_failed_turn_with_the_full_history(h: Harness) -> None:
    unit = h.unit(CHAIN)
    h.service.reply(native_ok(1), native_ok(2), error(503))
    assert [r.status for r in run_unit(h.context(), unit)] == ["succeeded", "succeeded", "failed"]

    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["skipped", "skipped", "succeeded"]
    assert h.service.count == 4  # only turn 2 again
    assert h.service.body(3)["contents"] == [
        user("p"),
        model_turn(h, 0),
        user("t1"),
        model_turn(h, 1),
        user("t2"),
    ]


def test_chain_without_its_history_file_sends_nothing(h: Harness) -> None:
    unit = h.unit(CHAIN)
    h.service.reply(native_ok(1), native_ok(2), error(503))
    run_unit(h.context(), unit)
    (h.out / "chains" / "c" / "0.json").unlink()

    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["skipped", "skipped", "failed"]
    assert "--force" in (records[2].error or "") and "chains/c/0.json" in (records[2].error or "")
    assert h.service.count == 3  # turns 0-1 are not billed again to rebuild the history


def test_chain_stops_at_a_turn_without_an_image(h: Harness) -> None:
    unit = h.unit(CHAIN)
    h.service.reply(native_ok(1), native_no_image())
    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["succeeded", "no_image", "not_attempted"]
    assert h.service.count == 2

    again = run_unit(h.context(), unit)
    assert [r.status for r in again] == ["skipped", "no_image", "not_attempted"]
    assert again[1] == records[1]
    assert h.service.count == 2


def test_chain_with_an_edited_last_turn_keeps_the_earlier_history(h: Harness) -> None:
    run_unit(h.context(), h.unit(CHAIN))
    edited = h.unit({**CHAIN, "turns": ["t1", "t2 but blue"]})
    records = run_unit(h.context(), edited)
    assert [r.status for r in records] == ["skipped", "skipped", "succeeded"]
    assert h.service.count == 4
    assert h.service.body(3)["contents"] == [
        user("p"),
        model_turn(h, 0),
        user("t1"),
        model_turn(h, 1),
        user("t2 but blue"),
    ]


def test_chain_turn_whose_image_was_deleted_is_made_again_on_the_same_history(h: Harness) -> None:
    unit = h.unit(CHAIN)
    first = run_unit(h.context(), unit)
    (h.out / first[1].paths[0]).unlink()

    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["skipped", "succeeded", "skipped"]
    assert h.service.count == 4
    assert h.service.body(3)["contents"] == [user("p"), model_turn(h, 0), user("t1")]
    saved = json.loads((h.out / "chains" / "c" / "0.json").read_text())
    assert [t["key"] for t in saved["turns"][:2]] == [r.idempotency_key for r in records[:2]]
    assert saved["turns"][1]["contents"] == [user("t1"), model_turn(h, 3)]  # the new answer replaced it


def test_chain_crash_after_a_turns_files_can_continue_without_force(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CHAIN)
    ctx = h.context()
    monkeypatch.setattr(ctx.store, "record_outcome", crash)
    with pytest.raises(Crash):
        run_unit(ctx, unit)  # killed after turn 0's files, before its outcome
    assert h.service.count == 1

    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["skipped", "succeeded", "succeeded"]
    assert h.service.count == 3
    assert h.service.body(1)["contents"] == [user("p"), model_turn(h, 0), user("t1")]


def test_chain_sends_back_a_model_turn_whose_image_type_was_mislabelled(h: Harness) -> None:
    unit = h.unit(CHAIN)
    mislabelled = native_ok(1)
    mislabelled["candidates"][0]["content"]["parts"][2]["inlineData"]["mimeType"] = "image/jpeg"  # PNG bytes
    h.service.reply(mislabelled)
    records = run_unit(h.context(), unit)
    assert records[0].status == "succeeded" and records[0].mime_type == "image/png"
    assert h.service.count == 3
    assert h.service.body(1)["contents"] == [user("p"), model_turn(h, 0), user("t1")]


def test_force_remakes_a_whole_chain(h: Harness) -> None:
    unit = h.unit(CHAIN)
    run_unit(h.context(), unit)
    records = run_unit(h.context(force=True), unit)
    assert [r.status for r in records] == ["succeeded"] * 3
    assert h.service.count == 6
    assert h.service.body(4)["contents"] == [user("p"), model_turn(h, 3), user("t1")]
