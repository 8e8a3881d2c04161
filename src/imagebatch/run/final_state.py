"""The run's verdict in Prefect: its final state, the lines of its log a person acts on, and the quiet task
runs (README "Scheduled runs" lists what each state means).

- **Completed** only when every request is done (`succeeded`, or `skipped`: done before), or when the
  requests not done are within `--allow-failures` and the run was not stopped early. The message carries
  the counts.
- **Failed** otherwise: requests not done, a stop (HTTP 401 or 402, a budget cap, a full disk, an
  unreachable service: the reason, which says what to do, leads the message), or a record that could not
  be written. Prefect's plain `Failed` name, not a custom one such as "Partial": Prefect names its state
  events by the state's name (`prefect.flow-run.Failed`), so a custom name would slip past every "notify
  on Failed" automation, which is what a platform team sets up first.
- **Cancelled** when a signal stopped it (Ctrl-C, SIGTERM from a worker's shutdown or from a cancellation
  in the UI, see `run.graceful_stop`): what was in flight was finished and recorded, the rest is
  `not_attempted`, and a rerun goes on from there.

The CLI's exit code follows the same rule (`exit_code`): 0 exactly when the state is Completed.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ParamSpec

from prefect.states import Cancelled, Completed, Failed, State

from imagebatch.run.graceful_stop import graceful_stop, safe_output
from imagebatch.run.verdict import Allowance, parse_allowance, verdict
from imagebatch.storage.layout import UNKNOWN_HINT
from imagebatch.work.outcome import NOT_DONE, not_done, tally
from imagebatch.work.variants import describe

PREFIX = "imagebatch: "
"""How every verdict's message begins, so a parent run tells a shard that ran to its end from one that
broke (`ran_to_end`)."""


def final_state(info: dict[str, Any], allowance: Allowance | None = None) -> State[Any]:
    """The flow run's final state for the run summary `info` (its data is `info`)."""
    counts: Mapping[str, int] = info["counts"]
    stopped: str | None = info.get("stopped")
    unwritten: list[str] = info.get("unwritten") or []
    message = PREFIX + "; ".join(([f"stopped: {stopped}"] if stopped else []) + [tally(counts)] + unwritten)
    kind = verdict(info, allowance)
    if kind == "Cancelled":
        return Cancelled(message=message + "; a rerun goes on from there", data=info)
    if kind == "Failed":
        return Failed(message=message, data=info)
    if not_done(counts):
        message += f" (within --allow-failures {allowance})"
    return Completed(message=message, data=info)


def conclude(info: dict[str, Any], allowance: Allowance | None = None) -> State[Any]:
    """Log the run's summary and warnings to the flow run's log, and return its final state."""
    from prefect.logging import get_run_logger

    state = final_state(info, allowance)
    log_summary(get_run_logger(), info, state)  # type: ignore[arg-type]  # a LoggerAdapter, same methods
    return state


def log_summary(logger: logging.Logger, info: dict[str, Any], state: State[Any]) -> None:
    """One INFO line with the counts (and spend), then one WARNING per class of problem, each saying what
    to do: a stop (401 and 402 name their fix), 429s, `unknown`, other failures, unwritten records."""
    counts: Mapping[str, int] = info["counts"]
    line = f"{state.name}: {tally(counts)} -> {info.get('out')}"
    if (sent := info.get("sent")) is not None:
        line += f"; {sent} sent this run"
    if spend := info.get("spend"):
        line += f"; estimated spend {spend['spent']:,.2f} {spend['currency']}".rstrip()
        if spend.get("in_doubt"):
            line += f" (up to {spend['spent'] + spend['in_doubt']:,.2f} if the unknown ones were billed)"
    if (redo := info.get("redo")) is not None:
        line += f"; {describe(redo)}"
    logger.info(line)
    for warning in warnings(info):
        logger.warning(warning)


def warnings(info: dict[str, Any]) -> Iterator[str]:
    counts: Mapping[str, int] = info["counts"]
    if stopped := info.get("stopped"):
        left = counts.get("not_attempted", 0)
        yield f"Stopped early: {stopped}. {left} request(s) not attempted; a rerun sends them."
    if limited := info.get("rate_limited"):
        yield (
            f"{limited} request(s) failed on HTTP 429 (the service's rate limit): a rerun sends them; a "
            "lower rpm or concurrency (or a --global-limit shared by every run) avoids it."
        )
    if unknown := counts.get("unknown"):
        yield f"{unknown} request(s) have an unknown outcome (sent, no answer): {UNKNOWN_HINT}."
    failed = counts.get("failed", 0) - (info.get("rate_limited") or 0)
    if failed > 0:
        yield f"{failed} request(s) failed: the error column of results.csv (and report.html) says why."
    if no_image := counts.get("no_image"):
        yield f"{no_image} request(s) were answered without an image (no_image): results.csv has the text."
    yield from info.get("unwritten") or []


def summary_of(state: State[Any]) -> dict[str, Any]:
    """The run summary a flow run's final state carries; the run's own error when it raised."""
    data = state.result(raise_on_failure=False)
    if isinstance(data, BaseException):
        raise data
    if not isinstance(data, dict):
        raise RuntimeError(f"the flow run ended {state.name} without a summary: {state.message}")
    return data


def ran_to_end(state_type: str | None, message: str | None) -> bool:
    """Whether a shard run ended by its own verdict (even Failed: some requests not done), rather than
    crashing or being cancelled before it recorded anything."""
    return state_type == "COMPLETED" or (state_type == "FAILED" and (message or "").startswith(PREFIX))


class TaskRunNoise(logging.Filter):
    """Prefect's "Finished in state ..." line of each task run (one per request for runs of up to 100
    requests, at INFO, or at ERROR for a Failed batch) goes to DEBUG: the UI's task-run list shows each
    batch's state and counts, and the flow's log keeps the lines above. Other task-run lines pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Finished in state"):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


@contextlib.contextmanager
def quiet_task_runs() -> Iterator[None]:
    """`TaskRunNoise` on Prefect's task-run logger while the flow runs."""
    target = logging.getLogger("prefect.task_runs")
    noise = TaskRunNoise()
    target.addFilter(noise)
    try:
        yield
    finally:
        target.removeFilter(noise)


P = ParamSpec("P")


def concluded(body: Callable[P, dict[str, Any]]) -> Callable[P, State[Any]]:
    """Wrap the flow's body: its run summary becomes its final state (`conclude`, with the allowance of the
    body's own `options` argument), Prefect's per-task-run lines go quiet (`quiet_task_runs`), and where no
    terminal handles the signals (`RunHooks.signals` unset: a worker, `serve`, a Python caller) the run
    stops gracefully on SIGTERM or SIGINT and never dies of a closed output pipe (`run.graceful_stop`)."""
    signature = inspect.signature(body)

    @functools.wraps(body)
    def run(*args: P.args, **kwargs: P.kwargs) -> State[Any]:
        from imagebatch.run.hooks import RunHooks, current_hooks, run_hooks

        options = signature.bind_partial(*args, **kwargs).arguments.get("options")  # imagebatch.options
        allowance = parse_allowance(options.outcome.allow_failures if options is not None else None)
        with contextlib.ExitStack() as stack:
            hooks = current_hooks() or stack.enter_context(run_hooks(RunHooks()))
            stack.enter_context(quiet_task_runs())
            if hooks.signals is None:
                stack.enter_context(safe_output())
                stack.enter_context(graceful_stop(hooks.control))
            return conclude(body(*args, **kwargs), allowance)

    return run


__all__ = ["NOT_DONE", "Allowance", "conclude", "concluded", "final_state", "summary_of"]
