"""The review's count over a whole run's rows (`report.setstate.review_states`): the same as the page's
count (`review_counts`), in memory that does not grow with the rows."""

from __future__ import annotations

from collections.abc import Iterator

from helpers.memory import traced_peak

from imagebatch.report.setstate import review_counts, review_states
from imagebatch.work.decisions import Decision


def row(job: str, key: str, variant: int = 1, request: int = 0) -> dict[str, str]:
    return {"job_id": job, "request_index": str(request), "turn_index": "0", "idempotency_key": key,
            "variant": str(variant), "status": "succeeded", "paths": f"images/{key}.png"}  # fmt: skip


def test_the_count_is_the_pages_with_redone_rejections_and_new_variants() -> None:
    rows = [
        row("a", "a1"), row("a", "a2", variant=2),  # a1 rejected then redone by a2 (unreviewed)
        row("b", "b1"),  # approved
        row("c", "c1"), row("c", "c2", variant=2), row("c", "c3", variant=3),  # c1 replaced, c2 approved
        row("d", "d1"), row("d", "d1b", request=1),  # rejected, and another request of d's
        row("e", "e1"),  # cleared: unreviewed
    ]  # fmt: skip
    decisions = {
        "a1": Decision("a1", 1, "rejected"), "b1": Decision("b1", 2, "approved"),
        "c2": Decision("c2", 3, "approved"), "d1": Decision("d1", 4, "rejected"),
        "e1": Decision("e1", 5, "cleared"),
    }  # fmt: skip
    counts, _ = review_counts(rows, decisions)
    assert review_states(rows, decisions) == counts
    assert counts == {"redone": 2, "unreviewed": 4, "approved": 2, "rejected": 1}  # c1 replaced: redone


def test_a_runs_rows_are_counted_without_holding_them() -> None:
    """40,000 rows made anew on each walk (as a run's records read back from its spool): holding them,
    as the page's count does for one request's variants, would be tens of MB."""

    class Rows:
        def __iter__(self) -> Iterator[dict[str, str]]:
            return (row(f"job-{i:06d}", f"k{i}") for i in range(40_000))

    counts, peak = traced_peak(lambda: review_states(Rows(), {"k7": Decision("k7", 1, "approved")}), 2**20)
    assert counts == {"unreviewed": 39_999, "approved": 1}
    assert peak < 1 * 2**20, f"peak {peak / 2**20:.1f} MiB"
