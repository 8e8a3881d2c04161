"""What a set of request records amounts to: done or not, in words a person reads in Prefect's UI.

Shared by a batch's task run (its final state) and the flow run's verdict (`run.final_state`). A request is
*done* when it `succeeded` (now) or is `skipped` (it had succeeded before); `failed`, `no_image`,
`unknown` and `not_attempted` are not done, as for the command's exit code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from imagebatch.words import counted
from imagebatch.work.store import STATUSES, RequestRecord

if TYPE_CHECKING:  # Prefect is imported only to make a state: a rerun settled without it never does
    from prefect.states import State

DONE = ("succeeded", "skipped")
NOT_DONE = ("failed", "no_image", "unknown", "not_attempted")


def request_counts(records: Iterable[RequestRecord]) -> tuple[Counter[str], int]:
    """The records' statuses, counted for the verdict, and how many were left out: a variant that is not
    done is left out when its request has a newer variant (`--redo no_image` made one: the request is what
    its newest variant is, so a nightly rerun after the redo is not failed by the old answer). Two passes
    over `records` (a run's are read back from its spool); only requests with a variant past the first are
    remembered between them (a plain run's records hold none: its memory does not grow with its size)."""
    newest: dict[tuple[str, int, int], int] = {}
    for r in records:
        if r.variant > 1:
            request = (r.job_id, r.request_index, r.turn_index)
            newest[request] = max(newest.get(request, 1), r.variant)
    counts: Counter[str] = Counter()
    superseded = 0
    for r in records:
        newer = newest.get((r.job_id, r.request_index, r.turn_index), 1) if newest else 1
        if r.status in NOT_DONE and r.variant < newer:
            superseded += 1
        else:
            counts[r.status] += 1
    return counts, superseded


def not_done(counts: Mapping[str, int]) -> int:
    return sum(counts.get(s, 0) for s in NOT_DONE)


def total(counts: Mapping[str, int]) -> int:
    return sum(counts.get(s, 0) for s in STATUSES)


def describe(counts: Mapping[str, int]) -> str:
    """`4 succeeded, 1 skipped, 1 no_image`: the statuses in results.csv's order, none of 0."""
    return ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts.get(s)) or "none"


def tally(counts: Mapping[str, int]) -> str:
    """`1 of 6 requests not done (4 succeeded, 1 skipped, 1 no_image)`, or `6 requests done (...)`."""
    n, missing = total(counts), not_done(counts)
    head = f"{missing:,} of {counted(n, 'request')} not done" if missing else f"{counted(n, 'request')} done"
    return f"{head} ({describe(counts)})"


def batch_state(records: Iterable[RequestRecord]) -> State[Any] | None:
    """A batch's task-run state: None (Prefect's own Completed) when every request is done, else Failed
    with the counts, and the first error, so the UI's task list shows which batches fell short."""
    from prefect.states import Failed

    counts: dict[str, int] = {}
    first_error = None
    for record in records:
        counts[record.status] = counts.get(record.status, 0) + 1
        if record.status in NOT_DONE and first_error is None:
            first_error = f"{record.job_id}#{record.request_index}: {record.error or record.status}"
    if not not_done(counts):
        return None
    return Failed(message=f"{tally(counts)}; first: {first_error}")
