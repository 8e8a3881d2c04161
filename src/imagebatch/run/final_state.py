"""The run's verdict in Prefect: its final state, reached as the flow's body ends (`concluding`, the `with`
around it), the lines of its log a person acts on, and the quiet task runs (README "Scheduled runs" lists
what each state means).

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

A Failed or Cancelled state's data is a `RunEnded` exception carrying the summary: Prefect's engine ends
a flow run by `state.result()`, which for such a state must find an exception (anything else is its
"Unexpected result for failed state" traceback); the engine then re-raises it and logs it as an
"unexpected exception", which `EngineNoise` drops: the verdict was logged already, in one line.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prefect.states import Cancelled, Completed, Failed, State

from imagebatch.options import RunOptions, ShardRole
from imagebatch.run.constants import SHARDED_STOP_GRACE, STOP_GRACE
from imagebatch.run.graceful_stop import graceful_stop, safe_output
from imagebatch.run.hooks import RunHooks, current_hooks, run_hooks
from imagebatch.run.trust import REFUSED, Refused
from imagebatch.run.verdict import Allowance, parse_allowance, verdict, warnings
from imagebatch.work.outcome import NOT_DONE, not_done, tally
from imagebatch.work.variants import describe

PREFIX = "imagebatch: "
"""How every verdict's message begins, so a parent run tells a shard that ran to its end from one that
broke (`ran_to_end`)."""


class RunEnded(Exception):
    """The data of a Failed or Cancelled run's final state: its message, and the run summary (`summary`)."""

    def __init__(self, message: str, summary: dict[str, Any]) -> None:
        super().__init__(message, summary)  # both in `args`: it pickles whole, as Prefect's results do
        self.summary = summary

    def __str__(self) -> str:
        return str(self.args[0])


def final_state(info: dict[str, Any], allowance: Allowance | None = None) -> State[Any]:
    """The flow run's final state for the run summary `info` (its data is `info`, or a `RunEnded`
    carrying it when the run did not complete)."""
    counts: Mapping[str, int] = info["counts"]
    stopped: str | None = info.get("stopped")
    unwritten: list[str] = info.get("unwritten") or []
    message = PREFIX + "; ".join(([f"stopped: {stopped}"] if stopped else []) + [tally(counts)] + unwritten)
    kind = verdict(info, allowance)
    if kind == "Cancelled":
        message += "; a rerun goes on from there"
        return Cancelled(message=message, data=RunEnded(message, info))
    if kind == "Failed":
        return Failed(message=message, data=RunEnded(message, info))
    if not_done(counts):
        message += f" (within --allow-failures {allowance})"
    return Completed(message=message, data=info)


def conclude(
    info: dict[str, Any], allowance: Allowance | None = None, on_terminal: bool = False
) -> State[Any]:
    """Log the run's summary and warnings to the flow run's log, and return its final state. With
    `on_terminal` these lines go to Prefect's log only: the terminal prints the same summary itself
    (`cli.display.report`), once."""
    from prefect.logging import get_run_logger

    state = final_state(info, allowance)
    extra = {OFF_TERMINAL: True} if on_terminal else {}
    log_summary(get_run_logger(), info, state, extra)  # type: ignore[arg-type]  # a LoggerAdapter, same methods
    return state


LEVELS = {"Completed": logging.INFO, "Cancelled": logging.WARNING, "Failed": logging.ERROR}
"""The verdict line's level: a Failed run's one ERROR record, so log-based alerting sees one per run."""


def log_summary(
    logger: logging.Logger, info: dict[str, Any], state: State[Any], extra: dict[str, Any] | None = None
) -> None:
    """One line with the verdict and counts (and spend), then one WARNING per kind of problem, each saying
    what to do (`run.verdict.warnings`)."""
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
    logger.log(LEVELS.get(str(state.name), logging.INFO), line, extra=extra)
    for warning in warnings(info):
        logger.warning(warning, extra=extra)


def summary_of(state: State[Any]) -> dict[str, Any]:
    """The run summary a flow run's final state carries; the run's own error when it raised."""
    data = state.result(raise_on_failure=False)
    if isinstance(data, RunEnded):
        return data.summary
    if isinstance(data, BaseException):
        raise data
    if not isinstance(data, dict):
        raise RuntimeError(f"the flow run ended {state.name} without a summary: {state.message}")
    return data


def ran_to_end(state_type: str | None, message: str | None) -> bool:
    """Whether a shard run ended by its own verdict (even Failed: some requests not done), rather than
    crashing or being cancelled before it recorded anything."""
    return state_type == "COMPLETED" or (state_type == "FAILED" and (message or "").startswith(PREFIX))


OFF_TERMINAL = "imagebatch_off_terminal"
"""A log record's attribute (`extra`) for lines Prefect's log keeps but a terminal's console skips."""


class TaskRunNoise(logging.Filter):
    """Prefect's lines about each task run go to DEBUG: "Finished in state ..." (one per request for runs
    of up to 100 requests, at INFO, or at ERROR for a Failed batch), and "Task run failed with state: ..."
    (an ERROR per batch not done, with a bogus `NoneType: None` traceback: Prefect logs it with
    `exc_info` where there is no exception). The UI's task-run list shows each batch's state and counts,
    and the flow's log says it once, in its verdict. Other task-run lines (a real exception) pass."""

    QUIET = ("Finished in state", "Task run failed with state:")

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.QUIET):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


class EngineNoise(logging.Filter):
    """Drops the engine's "exited with unexpected exception" record (and its traceback) when the
    exception is a `RunEnded`: the run's own verdict, raised again by Prefect's `run_flow` (see the top)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], RunEnded))


class OffTerminal(logging.Filter):
    """On a console handler: drops the records marked `OFF_TERMINAL` (the terminal prints them itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, OFF_TERMINAL, False)


def _engine_loggers_quiet() -> None:
    """`EngineNoise` on the loggers Prefect's engine reports a flow run's end with: installed once, for
    good, since the engine logs after the flow's body (and every block of ours) has returned."""
    for name in ("prefect.flow_runs", "prefect.engine", "prefect.flow_engine"):
        target = logging.getLogger(name)
        if not any(isinstance(f, EngineNoise) for f in target.filters):
            target.addFilter(EngineNoise())


_engine_loggers_quiet()


@contextlib.contextmanager
def quiet_task_runs(on_terminal: bool = False) -> Iterator[None]:
    """`TaskRunNoise` on Prefect's task-run logger while the flow runs; with `on_terminal`, `OffTerminal`
    on the console handlers too."""
    from prefect.logging.handlers import PrefectConsoleHandler

    target = logging.getLogger("prefect.task_runs")
    noise, off = TaskRunNoise(), OffTerminal()
    target.addFilter(noise)
    names = ["", *(n for n in logging.root.manager.loggerDict if n.startswith("prefect"))]
    found = (h for n in names for h in logging.getLogger(n).handlers)
    handlers = {h for h in found if isinstance(h, PrefectConsoleHandler)}
    for handler in handlers if on_terminal else ():
        handler.addFilter(off)
    try:
        yield
    finally:
        target.removeFilter(noise)
        for handler in handlers:
            handler.removeFilter(off)


@dataclass
class Ending:
    """What `concluding` yields: the flow's body sets `summary`; once the block has ended, `state` is the
    flow run's final state."""

    allowance: Allowance | None
    on_terminal: bool
    summary: dict[str, Any] | None = None
    """The run summary the body returns (`run.modes`), set as its last step."""
    reached: State[Any] | None = None

    @property
    def state(self) -> State[Any]:
        """The final state `concluding` reached (RuntimeError when the body ended without a summary)."""
        if self.reached is None:
            raise RuntimeError("the run ended without a summary")
        return self.reached


@contextlib.contextmanager
def concluding(options: RunOptions, role: ShardRole) -> Iterator[Ending]:
    """The frame of a flow run: while the block runs, Prefect's per-task-run lines are quiet
    (`quiet_task_runs`) and, where no terminal handles the signals (`RunHooks.signals` unset: a worker,
    `serve`, a Python caller), the run stops gracefully on SIGTERM or SIGINT and never dies of a closed
    output pipe (`run.graceful_stop`); as it ends, the summary the block set becomes the final state
    (`conclude`, with `options`' allowance), and a `Refused` run a Failed state (`refused`)."""
    allowance = parse_allowance(options.outcome.allow_failures)
    # A sharded run's parent sends nothing: it waits out its shards' own stop, then writes the records.
    parent = options.sharding.shards > 1 and role.shard is None
    with contextlib.ExitStack() as stack:
        hooks = current_hooks() or stack.enter_context(run_hooks(RunHooks()))
        on_terminal = hooks.signals is not None
        stack.enter_context(quiet_task_runs(on_terminal))
        if not on_terminal:
            stack.enter_context(safe_output())
            stack.enter_context(graceful_stop(hooks.control, SHARDED_STOP_GRACE if parent else STOP_GRACE))
        end = Ending(allowance, on_terminal)
        try:
            yield end
        except Refused as exc:
            end.reached = refused(exc)
            return
        if end.summary is None:
            raise RuntimeError("the flow's body ended without setting the run summary")
        end.reached = conclude(end.summary, allowance, on_terminal)


def refused(exc: Refused) -> State[Any]:
    """A deployment's run refused before it read or sent anything (`run.trust`): one ERROR line in its log
    and a Failed state whose message is that line (its data a `RunEnded`, so no engine traceback)."""
    from prefect.logging import get_run_logger

    message = REFUSED + str(exc)
    get_run_logger().error("Refused: %s", exc)
    return Failed(message=message, data=RunEnded(message, {"state": "refused", "refused": str(exc)}))


__all__ = ["NOT_DONE", "Allowance", "RunEnded", "conclude", "concluding", "final_state", "summary_of"]
