"""Issue 20: the flow run's final state, its log, its task runs, the graceful stop's pieces, output to a
dead pipe, and each run's own report. Runs of the flow use the session's Prefect harness and emulator."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import cli, read_results, run_flow, write_jsonl

from imagebatch.errors import UsageError
from imagebatch.run.dispatch import RunControl
from imagebatch.run.final_state import TaskRunNoise, final_state, ran_to_end
from imagebatch.run.graceful_stop import SafeStream, Stopper, safe_output
from imagebatch.run.hooks import RunHooks, run_hooks
from imagebatch.run.verdict import Allowance, parse_allowance

ALL_DONE = {"succeeded": 4, "skipped": 2}


def info(counts: dict[str, int], **more: Any) -> dict[str, Any]:
    return {"counts": counts, "out": "/out", "stopped": None, **more}


def test_completed_only_when_every_request_is_done() -> None:
    state = final_state(info(ALL_DONE))
    assert state.is_completed()
    assert state.message == "imagebatch: 6 requests done (4 succeeded, 2 skipped)"
    short = final_state(info({"succeeded": 5, "no_image": 1}))
    assert short.is_failed() and short.name == "Failed"  # Prefect's own name: "on Failed" automations fire
    assert short.message == "imagebatch: 1 of 6 requests not done (5 succeeded, 1 no_image)"
    for status in ("failed", "unknown", "not_attempted"):
        assert final_state(info({"succeeded": 1, status: 1})).is_failed()


def test_a_401_stop_is_failed_with_its_reason_first() -> None:
    why = "the service refused the API key (HTTP 401): set IMAGEBATCH_API_KEY to a valid key"
    state = final_state(info({"failed": 1, "not_attempted": 5}, stopped=why))
    assert state.is_failed()
    assert (
        state.message == f"imagebatch: stopped: {why}; 6 of 6 requests not done (1 failed, 5 not_attempted)"
    )
    assert ran_to_end("FAILED", state.message) and not ran_to_end("FAILED", "Flow run encountered an error")


def test_a_signal_stop_is_cancelled_and_unwritten_records_fail() -> None:
    stopped = final_state(info({"succeeded": 2, "not_attempted": 4}, stopped="interrupted (SIGTERM)"))
    assert stopped.is_cancelled() and "interrupted (SIGTERM)" in str(stopped.message)
    unwritten = final_state(info(ALL_DONE, unwritten=["results.csv not written: disk full"]))
    assert unwritten.is_failed() and "results.csv not written" in str(unwritten.message)


def test_allow_failures_by_count_and_share_but_never_past_a_stop() -> None:
    short = {"succeeded": 38, "failed": 1, "no_image": 1}
    assert final_state(info(short), Allowance(count=2)).is_completed()
    assert "(within --allow-failures 2)" in str(final_state(info(short), Allowance(count=2)).message)
    assert final_state(info(short), Allowance(count=1)).is_failed()
    assert final_state(info(short), parse_allowance("5%")).is_completed()  # 2 of 40
    assert final_state(info(short), parse_allowance("4.9%")).is_failed()
    capped = info({"succeeded": 39, "not_attempted": 1}, stopped="--max-images 39 reached")
    assert final_state(capped, Allowance(count=10)).is_failed()


@pytest.mark.parametrize("text", ["-1", "x", "101%", "1.5", "%"])
def test_allow_failures_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(UsageError, match="--allow-failures"):
        parse_allowance(text)
    assert parse_allowance(None) is None and parse_allowance("0") == Allowance(count=0)


def test_the_first_signal_stops_gracefully_and_the_grace_or_a_second_abandons() -> None:
    control, timers, abandoned = RunControl(), [], []
    log = _Lines()  # the stop is logged from a thread of its own: wait for it, so it lands in no later test
    stopper = Stopper(
        control, grace=25.0, abandon=lambda why, sig: abandoned.append((why, sig)),
        timer=lambda seconds, action: timers.append((seconds, action)) or _Cancellable(), log=log,  # type: ignore[arg-type]
    )  # fmt: skip
    stopper(signal.SIGTERM)
    assert control.reason == "interrupted (SIGTERM)" and not abandoned
    assert log.logged.wait(60) and log.lines[0].startswith("Stopping (SIGTERM): no new requests")
    [(seconds, expire)] = timers
    assert seconds == 25.0
    expire()
    assert abandoned == [
        (
            "requests in flight abandoned (not finished 25 s after SIGTERM): "
            "a rerun reports them as 'unknown'",
            15,
        )
    ]
    stopper(signal.SIGTERM)
    assert abandoned[-1][0].startswith("requests in flight abandoned (a second SIGTERM)")


class _Cancellable:
    def cancel(self) -> None:
        pass


class _Lines:
    """A logger's `warning`, kept: the lines, and an event once one is logged."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.logged = threading.Event()

    def warning(self, message: str, *args: Any) -> None:
        self.lines.append(message % args)
        self.logged.set()


def test_output_to_a_pipe_without_reader_never_raises(capfd: pytest.CaptureFixture[str]) -> None:
    """Before: Prefect's console handler writes through rich, which answers EPIPE with SystemExit."""
    from prefect.logging.handlers import PrefectConsoleHandler

    read, write = os.pipe()
    os.close(read)
    stream = os.fdopen(write, "w", buffering=1)
    handler = PrefectConsoleHandler(stream=stream)
    target = logging.getLogger("prefect.test-dead-pipe")
    target.addHandler(handler)
    target.propagate = False
    try:
        with pytest.raises(SystemExit):  # what crashed the runs of a worker that had died
            handler.console.print("x")
        handler.console.quiet = False
        with safe_output():
            assert isinstance(handler.stream, SafeStream)
            target.warning("nobody reads this")
            handler.console.print("nor this")
        assert handler.stream is stream  # restored
    finally:
        target.removeHandler(handler)
        with pytest.raises(OSError):
            stream.close()


def test_finished_in_state_lines_go_to_debug(caplog: pytest.LogCaptureFixture) -> None:
    """The filter `quiet_task_runs` puts on `prefect.task_runs`, here on a logger of our own (Prefect's
    would send these lines to its API, which outside a flow run only warns)."""
    target = logging.getLogger("imagebatch.test-task-runs")
    noise = TaskRunNoise()
    target.addFilter(noise)
    try:
        with caplog.at_level(logging.INFO, logger="imagebatch.test-task-runs"):
            target.info("Finished in state Completed()")
            target.error("Finished in state Failed('1 of 1 requests not done')")
            target.warning("Task run retrying")
        assert [r.getMessage() for r in caplog.records] == ["Task run retrying"]
        with caplog.at_level(logging.DEBUG, logger="imagebatch.test-task-runs"):
            target.info("Finished in state Completed()")
        assert caplog.records[-1].levelname == "DEBUG"
    finally:
        target.removeFilter(noise)


def _no_image_manifest(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "m.jsonl",
        [{"id": f"p{i}", "prompt": f"product {i}" + (" noimage" if i == 2 else "")} for i in range(4)],
    )


def _server_logs_and_task_states(
    flow_run_id: str, until: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's log on the server once it holds a line containing `until` (the last lines reach the server
    a moment after the run ends: bounded wait), and its task runs."""
    import time

    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        while True:
            body = {"logs": {"flow_run_id": {"any_": [flow_run_id]}}}
            logs = client.request("POST", "/logs/filter", json=body).json()
            if any(until in log["message"] for log in logs) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        body = {"flow_runs": {"id": {"any_": [flow_run_id]}}}
        tasks = client.request("POST", "/task_runs/filter", json=body).json()
    return logs, tasks


def test_a_run_with_one_no_image_ends_failed_with_its_counts_and_a_warning(
    service_env: Any, tmp_path: Path
) -> None:
    from imagebatch.emulator.settings import FaultConfig, parse_script
    from imagebatch.flows.batch import generate_from_manifest
    from imagebatch.run.final_state import summary_of

    service_env.configure(faults=FaultConfig(scripts=[parse_script("no_image@noimage")]))
    try:
        with run_hooks(RunHooks(sleep=lambda s: None)):
            manifest = str(_no_image_manifest(tmp_path))
            state = generate_from_manifest(manifest=manifest, out=str(tmp_path / "out"), return_state=True)
    finally:
        service_env.configure(faults=FaultConfig())
    summary = summary_of(state)
    assert state.is_failed()
    assert state.message == "imagebatch: 1 of 4 requests not done (3 succeeded, 1 no_image)"
    logs, tasks = _server_logs_and_task_states(summary["prefect"]["flow_run_id"], "without an image")
    warnings = [log["message"] for log in logs if log["level"] == logging.WARNING]
    assert any("1 request came back without an image" in w for w in warnings), warnings
    assert any(log["level"] == logging.ERROR and log["message"].startswith("Failed: 1 of 4") for log in logs)
    assert [log["level"] for log in logs if log["level"] >= logging.ERROR] == [logging.ERROR]  # the verdict
    assert not [log for log in logs if "NoneType: None" in log["message"] or "Traceback" in log["message"]]
    assert not [log for log in logs if log["message"].startswith("Finished in state") and log["task_run_id"]]
    by_name = {t["name"]: t["state_type"] for t in tasks}
    assert by_name == {"p0#0": "COMPLETED", "p1#0": "COMPLETED", "p2#0": "FAILED", "p3#0": "COMPLETED"}
    failed = next(t for t in tasks if t["name"] == "p2#0")
    assert failed["state"]["message"].startswith("1 of 1 request not done (1 no_image); first: p2#0")


def test_the_command_exits_1_then_0_when_the_failure_is_allowed(
    service_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from imagebatch.emulator.settings import FaultConfig, parse_script

    manifest = _no_image_manifest(tmp_path)
    service_env.configure(faults=FaultConfig(scripts=[parse_script("no_image,no_image@noimage")]))
    try:
        code, _, _ = cli(capsys, "run", str(manifest), "--out", str(tmp_path / "a"))
        assert code == 1
        code, _, _ = cli(
            capsys, "run", str(manifest), "--out", str(tmp_path / "b"), "--allow-failures", "25%"
        )
        assert code == 0
    finally:
        service_env.configure(faults=FaultConfig())
    assert Counter(r["status"] for r in read_results(tmp_path / "b")) == {"succeeded": 3, "no_image": 1}
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(tmp_path / "c"), "--allow-failures", "some")
    assert code == 2 and "--allow-failures 'some'" in err


def test_each_run_keeps_its_own_report_and_report_html_is_the_newest(
    service_env: Any, examples: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with run_hooks(RunHooks(sleep=lambda s: None)):
        first = run_flow(manifest=str(examples / "catalog.csv"), out=str(out))
    with run_hooks(RunHooks(sleep=lambda s: None)):
        second = run_flow(manifest=str(examples / "catalog.csv"), out=str(out))
    copies = sorted(out.glob("report.*.html"))
    assert [p.name for p in copies] == sorted(Path(i["run_report"]).name for i in (first, second))
    assert first["prefect"]["flow_run_id"][:8] in first["run_report"]
    assert "run: finished" in Path(first["run_report"]).read_text()
    assert (out / "report.html").read_text() == Path(second["run_report"]).read_text()
    assert "skipped" in Path(second["run_report"]).read_text()


def test_a_failed_or_cancelled_state_carries_the_summary_in_an_exception() -> None:
    """Prefect's engine reads a Failed or Cancelled state's data as an exception (issue 30 #4)."""
    from imagebatch.run.final_state import RunEnded, summary_of

    for summary in (info({"succeeded": 1, "failed": 1}), info({"not_attempted": 2}, stopped="interrupted")):
        state = final_state(summary)
        assert isinstance(state.data, RunEnded) and str(state.data) == state.message
        assert summary_of(state) == summary
    assert summary_of(final_state(info(ALL_DONE))) == info(ALL_DONE)


def test_prefects_engine_ends_a_failed_run_without_a_traceback(
    prefect: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What a worker's flow process does (`prefect.engine` -> `run_flow(..., error_logger=...)`): the
    state's exception is raised again to the engine, which logged it as "unexpected exception" with its
    traceback; the verdict was logged already. On the session's Prefect harness: not on a server Prefect
    would start by itself, nor on one the machine's settings name."""
    from prefect import flow
    from prefect.flow_engine import run_flow

    from imagebatch.run.final_state import RunEnded

    @flow(name="ends-failed")
    def ends_failed() -> Any:
        return final_state(info({"succeeded": 1, "no_image": 1}))

    caplog.set_level(logging.INFO)
    with pytest.raises(RunEnded):
        run_flow(ends_failed, error_logger=logging.getLogger("prefect.flow_runs"))  # type: ignore[arg-type]
    text = caplog.text
    assert "Finished in state Failed('imagebatch: 1 of 2 requests not done" in text
    assert "unexpected exception" not in text and "Traceback" not in text, text


def test_the_terminal_says_each_kind_of_problem_once_without_errors(
    service_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 30 #5: six requests without an image and one 429 on the terminal: one line per kind of
    problem, no ERROR record per request (nor its `NoneType: None`), no traceback."""
    from imagebatch.emulator.settings import FaultConfig, parse_script

    rows = [{"id": f"p{i}", "prompt": f"product {i}" + (" bad" if i < 6 else "")} for i in range(8)]
    manifest = write_jsonl(tmp_path / "m.jsonl", rows)
    scripts = [parse_script("no_image@bad"), parse_script("429,429,429,429@product 7")]
    service_env.configure(faults=FaultConfig(scripts=scripts))
    try:
        code, _, err = cli(capsys, "run", str(manifest), "--out", str(tmp_path / "out"))
    finally:
        service_env.configure(faults=FaultConfig())
    assert code == 1
    for noise in ("ERROR", "NoneType: None", "Traceback", "Task run failed"):
        assert noise not in err, err
    assert err.count("6 requests came back without an image") == 1, err
    assert err.count("1 request failed on HTTP 429") == 1, err


@pytest.mark.parametrize("ends", ["summary", "refused", "no summary"])
def test_concluding_turns_what_its_block_ends_with_into_the_final_state(prefect: str, ends: str) -> None:
    """The `with` a flow's body runs in: the summary the block sets becomes the final state by the
    verdict's rule (here one request not done, within `--allow-failures 1`), a `Refused` raised in it a
    Failed state saying so, and a block that sets no summary fails the run rather than ending Completed."""
    from prefect import flow
    from prefect.states import State

    from imagebatch.options import RunOptions, ShardRole
    from imagebatch.run.final_state import concluding
    from imagebatch.run.trust import REFUSED, Refused

    @flow
    def body() -> State[Any]:
        with concluding(RunOptions.from_flat(allow_failures="1"), ShardRole()) as end:
            if ends == "refused":
                raise Refused("out is not the deployment's")
            if ends == "summary":
                end.summary = info({"succeeded": 3, "failed": 1})
        return end.state

    state = body(return_state=True)
    if ends == "summary":
        assert state.is_completed(), state.message
        assert (
            state.message
            == "imagebatch: 1 of 4 requests not done (3 succeeded, 1 failed) (within --allow-failures 1)"
        )
    elif ends == "refused":
        assert state.is_failed() and state.message == REFUSED + "out is not the deployment's"
    else:
        assert state.is_failed() and "ended without setting the run summary" in str(state.message)
