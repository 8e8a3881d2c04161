"""What `imagebatch run` prints on a terminal: the progress bar while it runs, then the summary (counts by
status, the usage table, the spend, the warnings) and the exit code it decides (`report`). Without Prefect:
a rerun settled without it (`run.nothing_to_send`) prints the same."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from imagebatch.run.exit_codes import EXIT_INCOMPLETE, EXIT_OK, exit_code_for
from imagebatch.words import counted
from imagebatch.work.prices import money

if TYPE_CHECKING:
    from imagebatch.run.api_guard import PrefectGuard
    from imagebatch.run.dispatch import ProgressSnapshot


def report(
    out: Console, err: Console, info: dict[str, Any], signals: list[int], guard: PrefectGuard | None = None
) -> int:
    """Print the run's summary from its records (usage, spend and warnings); return the exit code."""
    from imagebatch.run.verdict import parse_allowance, verdict, warnings

    print_summary(out, info)
    if info.get("redo") is not None:
        from imagebatch.work.variants import describe

        out.print(describe(info["redo"]), markup=False, highlight=False)
    print_usage(out, info.get("usage", []))
    if info.get("spend"):
        s = info["spend"]
        line = f"estimated spend this run: {money(s['spent'], s['currency'])}"
        if s["in_doubt"]:
            line += f" (up to {money(s['spent'] + s['in_doubt'])} if the unknown requests were billed)"
        if s["unpriced"]:
            line += f"; no price for {', '.join(s['unpriced'])} (counted as 0)"
        out.print(line, markup=False, highlight=False)
    if info.get("report"):
        out.print(f"report: {info['report']}", markup=False, highlight=False)
    for line in warnings(info):  # the flow run's log says them in the same words (run.final_state)
        err.print(line, markup=False)
    if guard is not None and guard.note:
        err.print(f"{guard.note}.", markup=False)
    if signals:
        return exit_code_for(signals[0])
    allowance = parse_allowance((info.get("options") or {}).get("allow_failures"))
    # The rule of the flow run's final state (run.final_state), without Prefect: 0 exactly when Completed.
    return EXIT_OK if verdict(info, allowance) == "Completed" else EXIT_INCOMPLETE


def progress_bar(err: Console) -> tuple[Progress, Callable[[ProgressSnapshot], None]]:
    """A progress bar on a terminal (nothing elsewhere) and the callback that moves it."""
    progress = Progress(
        TextColumn("[bold]imagebatch"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not err.is_terminal,
    )
    bar = progress.add_task("run", total=None, stats="starting Prefect")
    t0: list[float] = []  # the rate counts from the first dispatch, not from Prefect's start-up

    def on_progress(snap: ProgressSnapshot) -> None:
        if not t0:
            t0.append(time.monotonic())
        minutes = max(time.monotonic() - t0[0], 1e-6) / 60
        failed = sum(snap.counts.get(s, 0) for s in ("failed", "unknown", "no_image"))
        done = sum(snap.counts.get(s, 0) for s in ("succeeded", "skipped"))
        left = snap.counts.get("not_attempted", 0)
        rate = snap.images / minutes
        stats = f"done {done}  failed {failed}  in flight {snap.in_flight}  {rate:.1f} img/min"
        stats += f"  not attempted {left}" if left else ""
        stats += f"  window {snap.window}  429s {snap.rate_limited}" if snap.rate_limited else ""
        progress.update(bar, total=snap.planned, completed=snap.done, stats=stats)

    return progress, on_progress


def print_usage(console: Console, usage: list[dict[str, Any]]) -> None:
    """The usage summary (every run into the folder), as written to usage-summary.csv."""
    if not usage:
        return
    table = Table(title="usage (all runs into this folder)")
    names = ("route", "model", "requests", "attempts", "images", "unknown", "total_tokens", "latency_p50_s")
    heads = ("route", "model", "requests", "attempts", "images", "unknown", "tokens", "p50 s")
    for name, head in zip(names, heads, strict=True):
        table.add_column(head, justify="left" if name in ("route", "model") else "right", overflow="fold")
    for row in usage:
        table.add_row(*("" if row[n] is None else f"{row[n]:.2f}" if n == "latency_p50_s" else str(row[n])
                        for n in names))  # fmt: skip
    console.print(table)


def print_summary(console: Console, info: dict[str, Any]) -> None:
    console.print(f"imagebatch: {counted(info['requests'], 'request')} -> {info['out']}", markup=False)
    table = Table()
    table.add_column("status")
    table.add_column("requests", justify="right")
    for status, n in info["counts"].items():
        if n:
            table.add_row(status, str(n))
    console.print(table)
