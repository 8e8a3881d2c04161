"""`work.variants`: which requests a `--redo KINDS` run makes a new variant of (rejected by a reviewer,
answered without an image, failed), what it holds back, and how it counts them; over a real output
folder's decisions and a plan of a real manifest."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.runs import write_jsonl

from imagebatch.manifest import PlannedRequest, load_manifest, plan, variant_of
from imagebatch.storage.kinds import open_location
from imagebatch.work.context import Unit, group_units
from imagebatch.work.decisions import Decision, record_decision
from imagebatch.work.records import record
from imagebatch.work.redo import redo_kinds
from imagebatch.work.store import KeyState, OutputStore
from imagebatch.work.variants import describe, with_variants


@pytest.fixture
def units(tmp_path: Path) -> list[Unit]:
    jobs = [
        {"id": job, "prompt": f"a mug, {job}", "model": "native-image-2"} for job in ("ni", "fa", "rj", "ok")
    ]
    return list(group_units(plan(load_manifest(write_jsonl(tmp_path / "m.jsonl", jobs)))))


def first(units: list[Unit]) -> dict[str, PlannedRequest]:
    return {u.requests[0].job_id: u.requests[0] for u in units if u.requests[0].variant == 1}


def state(req: PlannedRequest, status: str) -> KeyState:
    request = (req.job_id, req.request_index, req.turn_index) if req.variant > 1 else None
    return KeyState(outcome=record(req, status), variant=req.variant, request=request)  # type: ignore[arg-type]


@pytest.fixture
def folder(tmp_path: Path, units: list[Unit]) -> tuple[OutputStore, dict[str, KeyState]]:
    """ni: answered without an image; fa: failed; rj: succeeded and rejected; ok: succeeded."""
    store = OutputStore(tmp_path / "out")
    reqs = first(units)
    states = {
        reqs["ni"].idempotency_key: state(reqs["ni"], "no_image"),
        reqs["fa"].idempotency_key: state(reqs["fa"], "failed"),
        reqs["rj"].idempotency_key: state(reqs["rj"], "succeeded"),
        reqs["ok"].idempotency_key: state(reqs["ok"], "succeeded"),
    }
    record_decision(open_location(store.where), Decision(reqs["rj"].idempotency_key, 1, "rejected", "dull"))
    return store, states


def new_variants(out: list[Unit]) -> list[tuple[str, int]]:
    return [(u.requests[0].job_id, u.requests[0].variant) for u in out if u.requests[0].variant > 1]


@pytest.mark.parametrize(
    ("kinds", "made", "held_jobs"),
    [
        ("no_image", [("ni", 2)], []),
        ("rejected", [("rj", 2)], []),
        ("failed", [("fa", 2)], ["fa"]),  # the failed request is not sent again: its new variant is
        ("rejected,no_image,failed", [("ni", 2), ("fa", 2), ("rj", 2)], ["fa"]),
    ],
)
def test_redo_makes_a_variant_of_exactly_the_kinds_asked(
    units: list[Unit],
    folder: tuple[OutputStore, dict[str, KeyState]],
    kinds: str,
    made: list[tuple[str, int]],
    held_jobs: list[str],
) -> None:
    store, states = folder
    out, held, summary = with_variants(units, states, store, redo=redo_kinds(kinds))
    assert new_variants(out) == made
    reqs = first(units)
    assert held == {reqs[job].idempotency_key for job in held_jobs}
    assert summary is not None and summary.variants == len(made)
    assert summary.kinds == {kind: 1 for kind in kinds.split(",")}
    order = [(u.requests[0].job_id, u.requests[0].variant) for u in out]
    for job, _ in made:  # each new variant just before its request's own unit
        assert order.index((job, 1)) == order.index((job, 2)) + 1
    for job, variant in made:
        (unit,) = [u for u in out if (u.requests[0].job_id, u.requests[0].variant) == (job, variant)]
        assert unit.requests[0] == variant_of(reqs[job], 2)


def test_an_earlier_variant_that_failed_is_sent_again_or_replaced(
    units: list[Unit], folder: tuple[OutputStore, dict[str, KeyState]]
) -> None:
    store, states = folder
    v2 = variant_of(first(units)["rj"], 2)
    states[v2.idempotency_key] = state(v2, "failed")  # the redo of the rejected image failed

    out, held, summary = with_variants(units, states, store, redo=redo_kinds("rejected"))
    assert new_variants(out) == [("rj", 2)] and held == frozenset()  # variant 2 itself, sent again
    assert summary is not None and summary.variants == 1 and summary.kinds == {"rejected": 1}

    out, held, summary = with_variants(units, states, store, redo=redo_kinds("failed"))
    assert new_variants(out) == [("fa", 2), ("rj", 3), ("rj", 2)]  # newest first
    assert held == {first(units)["fa"].idempotency_key, v2.idempotency_key}
    assert summary is not None and summary.kinds == {"failed": 2}

    out, held, summary = with_variants(units, states, store)  # not a redo: every variant held as it stands
    assert new_variants(out) == [("rj", 2)] and held == {v2.idempotency_key} and summary is None


def test_edit_falls_back_to_a_new_sample_where_there_is_no_image_to_edit(
    units: list[Unit], folder: tuple[OutputStore, dict[str, KeyState]]
) -> None:
    store, states = folder
    _, _, summary = with_variants(units, states, store, redo=redo_kinds("no_image,failed"), edit=True)
    assert summary is not None and summary.edits == 0
    assert summary.fallback == {"no image to edit": 2}
    line = describe(summary.info())
    assert line.startswith("redo: 2 variants to send (1 failed, 1 no_image)")
    assert "2 made as new samples instead of edits (2 no image to edit)" in line


def test_redo_kinds_are_a_comma_separated_set() -> None:
    assert redo_kinds(None) == frozenset()
    assert redo_kinds("rejected, no_image") == {"rejected", "no_image"}
    with pytest.raises(
        ValueError, match=r"--redo takes rejected, no_image, failed \(comma separated\), not 'typo'"
    ):
        redo_kinds("rejected,typo")
