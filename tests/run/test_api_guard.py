"""The guard that keeps Prefect's API off a run's critical path (issue 21 #2), with a scripted probe."""

from __future__ import annotations

import queue
import threading
from typing import Any

from helpers.health import health_server
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from imagebatch.run.api_guard import MISSES, NOTE, STOPPED_ANSWERING, PrefectGuard

WAIT = 60.0  # generous bounds on events that come at once


class Probe:
    """Answers the guard's health checks from a queue of scripted answers (blocks until one is given)."""

    def __init__(self) -> None:
        self.answers: queue.Queue[bool] = queue.Queue()

    def __call__(self) -> bool:
        return self.answers.get(timeout=WAIT)


def test_a_stuck_call_never_holds_the_caller_and_only_the_latest_progress_is_sent() -> None:
    guard = PrefectGuard("http://127.0.0.1:1/api", probe=lambda: True, every=WAIT)
    stuck, sent = threading.Event(), []
    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 5}):
        guard.start()
        try:
            guard.later("stuck", lambda: stuck.wait(WAIT))  # a call retrying against a dead server
            for percent in (10, 20, 30):
                guard.later("progress", lambda p=percent: sent.append(p))  # returns at once
            assert not guard.call(lambda: sent.append("summary"), bound=0.01)  # waited its bound only
            stuck.set()
            assert guard.call(lambda: sent.append("end"), bound=WAIT)
            assert sent == [30, "summary", "end"]
        finally:
            guard.close()


def test_a_server_that_stops_answering_is_lost_and_prefect_stops_retrying() -> None:
    probe = Probe()
    guard = PrefectGuard("http://127.0.0.1:1/api", probe=probe, every=0)
    stuck = threading.Event()
    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 5}):
        guard.start()
        try:
            guard.later("stuck", lambda: stuck.wait(WAIT))
            waiting: list[bool] = []
            caller = threading.Thread(target=lambda: waiting.append(guard.call(lambda: None, bound=WAIT)))
            caller.start()
            probe.answers.put(True)
            for _ in range(MISSES - 1):
                probe.answers.put(False)
            assert not guard.lost.wait(0.05)  # a miss or two is not a loss
            probe.answers.put(False)
            assert (
                guard.lost.wait(WAIT) and guard.note and guard.note.startswith(f"{NOTE}: {STOPPED_ANSWERING}")
            )
            caller.join(WAIT)
            assert waiting == [False]  # the waiting call gave up with the server, not after its bound
            assert PREFECT_CLIENT_MAX_RETRIES.value() == 0  # Prefect's own calls: once, no retries
            assert not guard.call(lambda: None) and guard.later("x", lambda: None) is None
        finally:
            stuck.set()
            guard.close()
    assert PREFECT_CLIENT_MAX_RETRIES.value() != 0  # only the run's settings were changed


def test_a_loss_after_run_json_was_written_is_written_there_too() -> None:
    guard = PrefectGuard("http://127.0.0.1:1/api", probe=lambda: True)
    saved: list[dict[str, Any]] = []
    info: dict[str, Any] = {"state": "finished", "prefect": {"flow_run_id": "x"}}
    guard.records_written(info, lambda i: saved.append(dict(i)))
    guard.finish()
    assert saved == []  # nothing lost, nothing to add
    guard.lose("a test")
    guard.finish()
    guard.finish()
    assert len(saved) == 1 and saved[0]["prefect"]["incomplete"] == guard.note
    assert guard.note == f"{NOTE}: a test; the output folder's records are complete"


def test_the_probes_of_a_run_share_one_connection_closed_when_the_watch_ends() -> None:
    """A client made for each probe (`httpx.get`) cost ~50 ms of CPU every second of every run (its TLS
    context): the probes share one client, so twenty of them come over one kept-alive connection, which
    the guard closes as it stops watching."""
    with health_server() as (api_url, handler):
        guard = PrefectGuard(api_url, every=0).start()
        try:
            for _ in range(20):
                assert handler.probes.acquire(timeout=WAIT)
            assert not handler.ended.is_set()  # kept alive from probe to probe
        finally:
            guard.close()
        assert handler.ended.wait(WAIT)  # the guard closed its connection
        assert not guard.lost.is_set() and handler.connections == 1, handler.connections
