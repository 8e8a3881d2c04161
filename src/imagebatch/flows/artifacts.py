"""What a run shows beside its output folder: its caps (`--max-images`, `--max-spend`), its estimated
spend, and its Prefect bookkeeping: the artifacts (progress, the usage table, the summary, the report's
link) and the wait for Prefect's server to record every task run's final state (`settle_prefect_records`)."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from imagebatch.flows.constants import TERMINAL_STATES
from imagebatch.flows.dispatch import Budget, ProgressSnapshot
from imagebatch.tasks import layout
from imagebatch.tasks.context import Unit
from imagebatch.tasks.prices import PriceTable
from imagebatch.tasks.store import STATUSES, RequestRecord


def budgets(max_images: int | None, max_spend: float | None, prices: PriceTable | None) -> list[Budget]:
    """The run's caps (see `flows.dispatch.Budget`)."""
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


def spend(
    units: list[Unit], results: Mapping[int, list[RequestRecord]], prices: PriceTable
) -> dict[str, Any]:
    """This run's estimated spend: what succeeded cost, and what `unknown` requests may have cost."""
    spent = doubt = 0.0
    for unit in units:
        for req, rec in zip(unit.requests, results[unit.index], strict=False):
            spent += prices.spent(req, rec)
            doubt += prices.most(req) if rec.status == "unknown" else 0.0
    plan = [r for u in units for r in u.requests]
    return {"spent": spent, "in_doubt": doubt, "currency": prices.currency, "unpriced": prices.unpriced(plan)}


class ProgressArtifact:
    """A Prefect progress artifact (`imagebatch-progress`) moved as the run goes, at most every
    `interval` seconds (each update is a call to Prefect's API), and to 100 % at the end; passes every
    snapshot on to `forward` (the command's progress bar)."""

    def __init__(
        self,
        forward: Callable[[ProgressSnapshot], None] | None,
        interval: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.forward = forward
        self.interval = interval
        self.clock = clock
        self.artifact_id: Any = create_progress_artifact(  # a UUID here (sync context)
            0.0, key="imagebatch-progress", description="imagebatch: requests settled"
        )
        self._last = clock()
        self._percent = 0.0

    def __call__(self, snap: ProgressSnapshot) -> None:
        if self.forward is not None:
            self.forward(snap)
        self._percent = 100.0 * snap.done / snap.planned if snap.planned else 100.0
        if self.clock() - self._last >= self.interval:
            self._update()

    def _update(self) -> None:
        self._last = self.clock()
        with contextlib.suppress(Exception):  # a progress display must never fail the run
            update_progress_artifact(self.artifact_id, self._percent)

    def close(self) -> None:
        self._update()


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
    server to record its task runs' final states (best effort: the output folder is the record)."""
    create_markdown_artifact(
        key="imagebatch-run-summary", markdown=summary_markdown(info), description="imagebatch run"
    )
    if info.get("report"):
        create_link_artifact(
            Path(info["report"]).resolve().as_uri(), link_text=layout.REPORT_HTML, key="imagebatch-report",
            description="the run's contact sheet (a file on the machine that ran it)",
        )  # fmt: skip
    create_table_artifact(
        key="imagebatch-usage",
        table=usage_table(records, info["usage"]),
        description="requests by route, model and status, with the usage summary (all runs into the folder)",
    )
    with contextlib.suppress(Exception):  # best effort: the output folder is the record, not Prefect's
        settle_prefect_records(info)


def settle_prefect_records(
    info: dict[str, Any],
    *,
    timeout: float = 30.0,
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
