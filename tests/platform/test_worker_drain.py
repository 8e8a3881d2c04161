"""`imagebatch worker`'s stop sequence (`platform.worker.Drain`), with its clock, process table and signals
injected; tests/flows/test_worker_states.py runs it for real against a worker and a flow run."""

from __future__ import annotations

import signal
from typing import Any

from imagebatch.platform.worker import Drain


class FakeWorker:
    pid = 100


def drain(alive: set[int], now: list[float]) -> tuple[Drain, list[tuple[int, int]]]:
    sent: list[tuple[int, int]] = []
    stopper = Drain(
        FakeWorker(),  # type: ignore[arg-type]  # only its pid is read
        grace=40.0,
        clock=lambda: now[0],
        flow_runs=lambda worker: [201, 202] if worker == 100 else [],
        kill=lambda group, sig: sent.append((group, sig)),
        alive=lambda pid: pid in alive,
        stop_bound=10.0,
    )
    return stopper, sent


def test_the_flow_runs_get_sigterm_first_and_the_worker_once_they_have_ended() -> None:
    alive, now = {201, 202}, [0.0]
    stopper, sent = drain(alive, now)
    stopper.step()
    assert sent == []  # nothing before a signal
    stopper.on_signal(signal.SIGTERM)
    assert sent == [(201, signal.SIGTERM), (202, signal.SIGTERM)]
    stopper.step()
    alive.discard(201)
    stopper.step()
    assert sent[2:] == []  # 202 still stopping: the worker waits
    alive.discard(202)
    stopper.step()
    assert sent[2:] == [(100, signal.SIGTERM)]
    stopper.step()
    assert sent[3:] == []  # once


def test_the_worker_stops_after_the_grace_or_at_a_second_signal() -> None:
    alive, now = {201, 202}, [0.0]
    stopper, sent = drain(alive, now)
    stopper.on_signal(signal.SIGTERM)
    now[0] = 39.9
    stopper.step()
    assert (100, signal.SIGTERM) not in sent
    now[0] = 40.0
    stopper.step()
    assert sent[-1] == (100, signal.SIGTERM)

    again, sent_again = drain({201}, [0.0])
    again.on_signal(signal.SIGINT)
    again.on_signal(signal.SIGINT)
    assert sent_again[-1] == (100, signal.SIGTERM) and again.received == [signal.SIGINT, signal.SIGINT]


def test_a_worker_that_has_not_exited_stop_bound_seconds_after_its_stop_is_killed() -> None:
    now = [0.0]
    stopper, sent = drain(set(), now)  # the flow runs have ended already
    stopper.on_signal(signal.SIGTERM)
    stopper.step()
    assert sent[2:] == [(100, signal.SIGTERM)]  # nothing to wait for: the worker at once
    now[0] = 9.9
    stopper.step()
    assert sent[3:] == []
    now[0] = 10.0
    stopper.step()
    stopper.step()
    assert sent[3:] == [(100, signal.SIGKILL)]  # once


def test_flow_run_processes_are_the_workers_children_that_run_a_flow(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from imagebatch.platform.worker import flow_run_processes

    env = {**os.environ, "PREFECT__FLOW_RUN_ID": "00000000-0000-0000-0000-000000000001"}
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env) as child:
        try:
            assert flow_run_processes(os.getpid()) == [child.pid]
        finally:
            child.kill()
