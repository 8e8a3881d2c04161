"""The end of a run: its records in the output folder (results.csv, usage-summary.csv, run.json,
report.html), then its Prefect artifacts (`run.artifacts`). Also what `run.json` says when a run starts.

Prefect is imported only to publish the artifacts, so that a rerun with nothing to send can write its
records without starting Prefect at all (`run.nothing_to_send`).

The folder is the record: a file that cannot be written is named in `unwritten` (the command prints it),
and neither the report nor Prefect's bookkeeping can fail the run.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import imagebatch
from imagebatch.options import RunOptions
from imagebatch.report.details import index_details
from imagebatch.report.location import write_report
from imagebatch.run.plan import RunPlan
from imagebatch.run.preflight import Preflight, out_text
from imagebatch.storage import layout
from imagebatch.work.context import Unit
from imagebatch.work.outcome import request_counts
from imagebatch.work.prices import PriceTable
from imagebatch.work.records import storage_message
from imagebatch.work.store import STATUSES, OutputStore, RequestRecord
from imagebatch.work.usage import summarise_usage, usage_csv


class RunRecords:
    """The run's records in manifest order, read from `results` again on each iteration: its `units` are
    numbered 0 to `units` - 1 in that order (`run.plan.RunPlan`), each with its records there."""

    def __init__(self, units: int, results: Mapping[int, list[RequestRecord]]) -> None:
        self.units, self.results = units, results

    def __iter__(self) -> Iterator[RequestRecord]:
        for index in range(self.units):
            yield from self.results[index]


def write_records(
    checked: Preflight,
    store: OutputStore,
    plan: RunPlan,
    results: Mapping[int, list[RequestRecord]],
    info: dict[str, Any],
    halt_reason: str | None,
    tasks: int,
    report: bool,
) -> dict[str, Any]:
    """Write the run's records (results.csv, usage-summary.csv, run.json, report.html) and its Prefect
    artifacts; return the run summary."""
    from prefect.runtime import flow_run

    from imagebatch.run import api_guard as prefect_guard
    from imagebatch.run.artifacts import publish

    guard = prefect_guard.current()
    prefect: dict[str, Any] = {"flow_run_id": str(flow_run.id) if flow_run.id else None, "task_runs": tasks}
    if guard.note:
        prefect["incomplete"] = guard.note
    info = write_files(checked, store, plan, results, info, halt_reason, report, prefect)
    # Prefect's bookkeeping below: bounded, and skipped once its server is lost (run.api_guard).
    guard.records_written(info, store.write_run)
    publish(info, RunRecords(plan.units, results))
    return info


def write_files(
    checked: Preflight,
    store: OutputStore,
    plan: RunPlan,
    results: Mapping[int, list[RequestRecord]],
    info: dict[str, Any],
    halt_reason: str | None,
    report: bool,
    prefect: dict[str, Any],
) -> dict[str, Any]:
    """Write the run's records into its output folder (`prefect`: what run.json says of Prefect's side of
    the run); return the run summary. The records are read back from `results` on each pass, and the
    plan planned again where a pass needs its requests, never all at once."""
    price_table = checked.prices
    records = RunRecords(plan.units, results)
    rows = ({**unit.job.metadata, **r.to_row()} for unit in plan for r in results[unit.index])
    unwritten: list[str] = []
    with contextlib.suppress(OSError):  # what a replay needs was synced as it was written; this is the rest
        store.backend.sync()
    try:
        store.write_results(rows, list(checked.manifest.metadata_columns))
    except OSError as exc:
        unwritten.append(f"{layout.RESULTS_CSV} not written: {storage_message(store.where, exc)}")
    usage = summarise_usage(store.usage_lines(), records)
    try:
        store.backend.put(layout.USAGE_SUMMARY_CSV, usage_csv(usage))
    except OSError as exc:
        unwritten.append(f"{layout.USAGE_SUMMARY_CSV} not written: {storage_message(store.where, exc)}")
    counts, superseded = request_counts(records)  # an old no_image a redo replaced is not counted
    info["usage"] = [row.to_dict() for row in usage]
    if price_table is not None:
        info["spend"] = spend(plan, results, price_table)
    info["rate_limited"] = rate_limited(records)
    info |= {"counts": {s: counts.get(s, 0) for s in STATUSES}, "superseded": superseded}
    return write_summary(store, plan, info, halt_reason, report, prefect, unwritten)


def write_summary(
    store: OutputStore,
    plan: Iterable[Unit],
    info: dict[str, Any],
    halt_reason: str | None,
    report: bool,
    prefect: dict[str, Any],
    unwritten: list[str],
) -> dict[str, Any]:
    """The run's end in run.json (`info`, its records' figures in it already) and, with `report`, the
    report of `plan`'s requests; return the run summary, with `unwritten` (what could not be written)."""
    info |= {
        "ended_at": datetime.now(UTC).isoformat(),
        "state": "stopped" if halt_reason else "finished",
        "stopped": halt_reason,
        "prefect": prefect,
    }
    try:
        store.write_run(info)
    except OSError as exc:
        unwritten.append(f"{layout.RUN_JSON} not written: {storage_message(store.where, exc)}")
    try:
        if report:
            requests = (req for unit in plan for req in unit.requests)
            with index_details(requests) as details:  # on disk; the manifest is not loaded again
                info["report"] = write_report(store, details)
    except Exception as exc:  # the report is a view of the records, never a reason to fail the run
        unwritten.append(f"{layout.REPORT_HTML} not written: {exc}")
    if unwritten:
        info["unwritten"] = unwritten  # the command prints them; the records above are all there is
    return info


def spend(
    units: Iterable[Unit], results: Mapping[int, list[RequestRecord]], prices: PriceTable
) -> dict[str, Any]:
    """This run's estimated spend: what succeeded cost, and what `unknown` requests may have cost."""
    spent = doubt = 0.0
    unpriced: set[str] = set()
    for unit in units:
        for req, rec in zip(unit.requests, results[unit.index], strict=False):
            spent += prices.spent(req, rec)
            doubt += prices.most(req) if rec.status == "unknown" else 0.0
        unpriced.update(prices.unpriced(unit.requests))
    return {"spent": spent, "in_doubt": doubt, "currency": prices.currency, "unpriced": sorted(unpriced)}


def rate_limited(records: Iterable[RequestRecord]) -> int:
    """How many requests `failed` on the service's rate limit (their last answer an HTTP 429)."""
    return sum(r.status == "failed" and r.http_status == 429 for r in records)


def run_info(
    checked: Preflight, planned: int, options: RunOptions, shard: int | None = None
) -> dict[str, Any]:
    """What `run.json` says of a run when it starts (`state: running` until it ends): its options are every
    field of the model by its name (`RunOptions.flat`), the service as resolved, and a shard's number."""
    return {
        "manifest": checked.manifest.source,  # a workbook's with its sheet: `path#Sheet`
        "manifest_sha256": checked.manifest.sha256,
        "out": out_text(checked.out),
        "service": checked.base_url or "embedded emulator",
        "options": options.flat() | {"base_url": checked.base_url, "shard": shard},
        "versions": {"imagebatch": imagebatch.__version__, "prefect": importlib.metadata.version("prefect")},
        "started_at": datetime.now(UTC).isoformat(),
        "ended_at": None,
        "state": "running",
        "requests": planned,
    }
