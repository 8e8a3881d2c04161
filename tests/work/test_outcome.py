"""What a run's records amount to (`work.outcome.request_counts`): statuses counted, an old variant a newer
one replaced left out, in memory that does not grow with a plain run's size."""

from __future__ import annotations

from collections.abc import Iterator

from helpers.memory import traced_peak

from imagebatch.work.outcome import request_counts
from imagebatch.work.request_record import RequestRecord


def record(status: str, key: str, job_id: str, request_index: int = 0, variant: int = 1) -> RequestRecord:
    return RequestRecord(
        job_id=job_id, request_index=request_index, turn_index=0, status=status,  # type: ignore[arg-type]
        model="native-image-2.1", route="native", idempotency_key=key, variant=variant,
    )  # fmt: skip


def test_a_variant_not_done_is_left_out_when_its_request_has_a_newer_one() -> None:
    records = [
        record("no_image", key="a1", job_id="a"),
        record("succeeded", key="a2", job_id="a", variant=2),
        record("failed", key="b1", job_id="b"),  # no newer variant: counted
        record("succeeded", key="c1", job_id="c"),
        record("succeeded", key="c2", job_id="c", variant=2),  # an older success stays counted
        record("no_image", key="d1", job_id="d", request_index=1),
        record("succeeded", key="d2", job_id="d", variant=2),  # another request of job d: not d#1's
    ]
    counts, superseded = request_counts(records)
    assert superseded == 1
    assert counts == {"succeeded": 4, "failed": 1, "no_image": 1}


def test_the_counts_of_a_plain_runs_records_hold_nothing_per_request() -> None:
    """50,000 first samples, read back one at a time as a run's spool gives them: remembering each
    request between the two passes would hold several MB; only later variants are remembered."""

    def records() -> Iterator[RequestRecord]:
        for i in range(50_000):
            yield record("failed" if i % 10 == 0 else "succeeded", key=f"k{i}", job_id=f"job-{i:06d}")

    (counts, superseded), peak = traced_peak(lambda: request_counts(_Twice(records)), 2**20)
    assert (counts, superseded) == ({"succeeded": 45_000, "failed": 5_000}, 0)
    assert peak < 1 * 2**20, f"peak {peak / 2**20:.1f} MiB"


class _Twice:
    """An iterable made anew on each pass, as `run.outputs.RunRecords` is."""

    def __init__(self, make: object) -> None:
        self.make = make

    def __iter__(self) -> Iterator[RequestRecord]:
        return self.make()  # type: ignore[operator,no-any-return]
