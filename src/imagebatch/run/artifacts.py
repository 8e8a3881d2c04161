"""What a run shows beside its output folder: its caps (`--max-images`, `--max-spend`), and its Prefect
bookkeeping: the artifacts (progress, the usage table, the summary, the report) and the wait for Prefect's
server to record every task run's final state (`settle_prefect_records`)."""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from imagebatch.run import api_guard as prefect_guard
from imagebatch.run.constants import TERMINAL_STATES
from imagebatch.run.dispatch import Budget, ProgressSnapshot
from imagebatch.run.report_artifact import publish_report
from imagebatch.work.prices import PriceTable
from imagebatch.work.store import STATUSES, RequestRecord


def budgets(max_images: int | None, max_spend: float | None, prices: PriceTable | None) -> list[Budget]:
    """The run's caps (see `run.dispatch.Budget`)."""
    out = []
    if max_images is not None:
        out.append(Budget(
            "--max-images", max_images,
            most=lambda u: sum(r.images_at_most for r in u.requests),
            used=lambda _u, recs: sum(r.images for r in recs if r.status == "succeeded"),
            show=lambda n: f"{n:g}",
        ))  # fmt: skip
    if max_spend is not None and prices is not None:
        out.append(Budget(
            "--max-spend", max_spend,
            most=lambda u: sum(prices.most(r) for r in u.requests),
            used=lambda u, recs: sum(prices.spent(q, r) for q, r in zip(u.requests, recs, strict=False)),
            show=prices.money,
        ))  # fmt: skip
    return out


class ProgressArtifact:
    """A Prefect progress artifact (`imagebatch-progress`) moved as the run goes, at most every
    `interval` seconds (each update is a call to Prefect's API), and once at the end; passes every
    snapshot on to `forward` (the command's progress bar).

    Its percentage is the share of requests *done* (succeeded or skipped), so 100 % means every image is
    there and a run of failures stays low; its description carries the counts (`progress_text`)."""

    def __init__(
        self,
        forward: Callable[[ProgressSnapshot], None] | None,
        interval: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.forward = forward
        self.interval = interval
        self.clock = clock
        self.artifact_id: Any = None  # a UUID once made (sync context)
        prefect_guard.current().call(self._create)
        self._last = clock()
        self._percent = 0.0
        self._text = "imagebatch: starting"

    def __call__(self, snap: ProgressSnapshot) -> None:
        if self.forward is not None:
            self.forward(snap)
        done = sum(snap.counts.get(s, 0) for s in ("succeeded", "skipped"))
        self._percent = 100.0 * done / snap.planned if snap.planned else 100.0
        self._text = progress_text(snap)
        if self.clock() - self._last >= self.interval:
            self._update()

    def _create(self) -> None:
        self.artifact_id = create_progress_artifact(
            0.0, key="imagebatch-progress", description="imagebatch: starting"
        )

    def _update(self) -> None:
        """Move the artifact on the guard's thread: the dispatcher never waits for Prefect's API."""
        self._last = self.clock()
        if self.artifact_id is not None:
            call = functools.partial(
                update_progress_artifact, self.artifact_id, self._percent, description=self._text
            )
            prefect_guard.current().later("progress", call)

    def close(self) -> None:
        self._update()


def progress_text(snap: ProgressSnapshot) -> str:
    """`done 40 of 60 (38 succeeded, 2 skipped); not done 3 (2 failed, 1 unknown); in flight 4`."""
    done = {s: snap.counts.get(s, 0) for s in ("succeeded", "skipped")}
    short = {s: snap.counts.get(s, 0) for s in ("failed", "no_image", "unknown", "not_attempted")}
    text = f"done {sum(done.values())} of {snap.planned}"
    text += f" ({', '.join(f'{n} {s}' for s, n in done.items() if n)})" if any(done.values()) else ""
    if any(short.values()):
        text += f"; not done {sum(short.values())} ({', '.join(f'{n} {s}' for s, n in short.items() if n)})"
    return text + (f"; in flight {snap.in_flight}" if snap.in_flight else "")


def usage_table(records: Iterable[Any], usage: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (route, model): this run's requests by status, then the folder's usage summary."""
    by: dict[tuple[str, str], Counter[str]] = {}
    for r in records:
        by.setdefault((r.route, r.model), Counter())[r.status] += 1
    summary = {(u["route"], u["model"]): u for u in usage}
    rows = []
    for route, model in sorted(by.keys() | summary.keys()):
        counts = by.get((route, model), Counter())
        row: dict[str, Any] = {"route": route, "model": model}
        row |= {status: counts.get(status, 0) for status in STATUSES}
        u = summary.get((route, model), {})
        row |= {k: u.get(k) for k in ("attempts", "images", "total_tokens", "latency_p50_s", "latency_p95_s")}
        rows.append(row)
    return rows


def summary_markdown(info: dict[str, Any]) -> str:
    counts = info["counts"]
    lines = [
        f"# imagebatch run: {info['manifest']}",
        "",
        f"Service: {info['service']}  ",
        f"Output: `{info['out']}`",
        "",
        "| status | requests |",
        "|-|-|",
    ]
    lines += [f"| {s} | {counts.get(s, 0)} |" for s in STATUSES]
    lines += [f"| **total** | {sum(counts.values())} |"]
    return "\n".join(lines)


def publish(info: dict[str, Any], records: Iterable[RequestRecord]) -> None:
    """The finished run's Prefect artifacts (summary, report link, usage table), then wait for Prefect's
    server to record its task runs' final states (best effort: the output folder is the record). Each call
    is bounded and none is made once the server is lost (`run.api_guard`)."""
    guard = prefect_guard.current()
    guard.call(lambda: create_markdown_artifact(
        key="imagebatch-run-summary", markdown=summary_markdown(info), description="imagebatch run"
    ))  # fmt: skip
    publish_report(info, records, guard.call)  # this run's own copy of the report, and an artifact about it
    table = usage_table(records, info["usage"])
    guard.call(lambda: create_table_artifact(
        key="imagebatch-usage", table=table,
        description="requests by route, model and status, with the usage summary (all runs into the folder)",
    ))  # fmt: skip
    guard.call(lambda: settle_prefect_records(info), bound=SETTLE_TIMEOUT + prefect_guard.CALL_BOUND)


SETTLE_TIMEOUT = 30.0


def settle_prefect_records(
    info: dict[str, Any],
    *,
    timeout: float = SETTLE_TIMEOUT,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Wait until Prefect's server has recorded the final state of every task run of a finished flow run.

    Task-run states reach Prefect's server as events, which it writes to its database in batches, a
    moment after the flow has returned. A process that exits at once stops the ephemeral server in the
    middle of such a write (`CancelledError` tracebacks, "Error flushing events", on the user's terminal
    after a successful run, and the UI loses those states). Returns True once the server's count of
    finished task runs matches `info`, or False on timeout (the output folder is the record either way).
    """
    from prefect.client.orchestration import get_client

    meta = info.get("prefect") or {}
    run_id, expected = meta.get("flow_run_id"), meta.get("task_runs", 0)
    if not run_id or not expected:
        return True
    body = {
        "flow_runs": {"id": {"any_": [run_id]}},
        "task_runs": {"state": {"type": {"any_": list(TERMINAL_STATES)}}},
    }
    deadline = clock() + timeout
    with get_client(sync_client=True) as client:
        while True:
            response = client.request("POST", "/task_runs/count", json=body)
            if response.status_code == 200 and int(response.json()) >= expected:
                return True
            if clock() >= deadline:
                return False
            sleep(0.2)
