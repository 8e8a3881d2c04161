"""What a run shows beside its output folder: its caps (`--max-images`, `--max-spend`), its estimated
spend, and its Prefect artifacts (progress, the usage table, the summary)."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from imagebatch.flows.dispatch import Budget, ProgressSnapshot
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
        self.artifact_id: Any = create_progress_artifact(  # a UUID here (sync context)
            0.0, key="imagebatch-progress", description="imagebatch: starting"
        )
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

    def _update(self) -> None:
        self._last = self.clock()
        with contextlib.suppress(Exception):  # a progress display must never fail the run
            update_progress_artifact(self.artifact_id, self._percent, description=self._text)

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
