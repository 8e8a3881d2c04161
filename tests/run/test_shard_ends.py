"""How the parent of a sharded run learns that a shard has ended (`run.shard_runs`), on the session's Prefect
server: the races of a stop that a loaded machine makes likely (the whole stop on real workers:
tests/platform/test_worker_sharded_stop.py).

- The shard process the parent started exits right after it reported its end: the parent's last read of
  its state is older than the exit, and a stale read must not overwrite the shard's own end with Crashed.
- The parent's SIGTERM reaches a shard process that has not begun its flow run yet (still importing): the
  shard never started, so it is Cancelled as not started, not Crashed.
- A shard whose end the parent knows is not asked about again: a stop waits on no server answer for it.
- The shard process the parent started reported its end but does not exit (its last log lines wait on a
  server that does not answer): the parent waits `EXIT_WAIT` seconds for it, then goes on and stops it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import pytest
from prefect import flow

from imagebatch.run.shard_runs import EXIT_WAIT, _end_ours, _reap, _refresh, _Shard, _stop_all

pytestmark = pytest.mark.usefixtures("prefect")


@flow(name="a-shard")
def a_shard() -> None:
    """Stands for the shard deployment's flow: only its runs' states matter here."""


class CountingClient:
    """Prefect's sync client, counting the runs it reads."""

    def __init__(self, client: Any) -> None:
        self.client, self.reads = client, 0

    def read_flow_run(self, run_id: Any) -> Any:
        self.reads += 1
        return self.client.read_flow_run(run_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def _run_in(client: Any, *states: Any) -> Any:
    from prefect.states import Scheduled

    run = client.create_flow_run(a_shard, state=Scheduled())  # as `run_deployment` creates a shard
    for state in states:
        client.set_flow_run_state(run.id, state, force=True)
    return run.id


def _exited(command: list[str], signum: int | None = None) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    if signum is not None:
        process.send_signal(signum)
    process.wait(timeout=60)
    return process


def test_a_shard_that_reported_its_end_just_before_it_exited_keeps_its_end() -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Pending, Running

    with get_client(sync_client=True) as client:
        run_id = _run_in(client, Pending(), Running(), Cancelled(message="stopped: interrupted (SIGTERM)"))
        # The parent last read it Running; the process reported Cancelled and exited since.
        shard = _Shard(0, run_id, 0.0, state="RUNNING", here=_exited([sys.executable, "-c", "pass"]))
        _reap(client, [shard], 2, stopping=True)
        assert shard.here is None and shard.state == "CANCELLED"
        assert client.read_flow_run(run_id).state.type.value == "CANCELLED"


def test_a_shard_our_stop_reached_before_its_flow_run_began_is_cancelled_as_not_started() -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Pending

    with get_client(sync_client=True) as client:
        run_id = _run_in(client, Pending())  # claimed by the parent, its process still starting
        sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
        shard = _Shard(0, run_id, 0.0, state="PENDING", here=_exited(sleeper, signal.SIGTERM))
        _reap(client, [shard], 2, stopping=True)
        state = client.read_flow_run(run_id).state
        assert (state.type.value, shard.state) == ("CANCELLED", "CANCELLED")
        assert state.message == "shard 0-of-2: not started; the sharded run stopped"


def test_a_shard_process_that_died_while_the_run_went_on_is_crashed() -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Pending, Running

    with get_client(sync_client=True) as client:
        run_id = _run_in(client, Pending(), Running())
        shard = _Shard(1, run_id, 0.0, state="RUNNING", here=_exited([sys.executable, "-c", "exit(3)"]))
        _reap(client, [shard], 2, stopping=False)
        state = client.read_flow_run(run_id).state
        assert state.type.value == "CRASHED" == shard.state
        assert state.message == "shard 1-of-2: its process exited (3) before it ended"


def test_a_stopped_runs_shards_that_ended_are_not_read_again() -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Pending, Running

    with get_client(sync_client=True) as client:
        waiting = _run_in(client)  # Scheduled: no worker took it
        running = _run_in(client, Pending(), Running())
        done = _run_in(client, Pending(), Running(), Completed())
        reads = a_parent_stops([str(waiting), str(running), str(done)])
        assert reads == {"before": 3, "after": 1}  # after the stop, only the one still running
        assert client.read_flow_run(waiting).state.type.value == "CANCELLED"
        assert client.read_flow_run(running).state.type.value == "CANCELLING"


@flow(name="a-sharded-parent")
def a_parent_stops(run_ids: list[str]) -> dict[str, int]:
    """A sharded run's parent (its stop logs to its flow run) that reads its shards, stops, reads again."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as real:
        client = CountingClient(real)
        tracked = [_Shard(i, run_id, 0.0) for i, run_id in enumerate(run_ids)]
        _refresh(client, tracked, lambda: 0.0)
        assert [s.state for s in tracked] == ["SCHEDULED", "RUNNING", "COMPLETED"]
        before, client.reads = client.reads, 0
        _stop_all(client, tracked, 3, "interrupted (SIGTERM)")
        assert tracked[0].state == "CANCELLED"  # known from our own Cancelled, not read back
        _refresh(client, tracked, lambda: 0.0)
        assert tracked[1].state == "CANCELLING"
        return {"before": before, "after": client.reads}


def test_a_shard_process_that_lingers_after_its_end_is_waited_for_a_bounded_time_then_stopped() -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Pending, Running

    now = [100.0]
    lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with get_client(sync_client=True) as client:
            run_id = _run_in(client, Pending(), Running())
            shard = _Shard(0, run_id, 0.0, here=lingering)
            _refresh(client, [shard], lambda: now[0])
            assert shard.state == "RUNNING" and not shard.done(now[0])
            client.set_flow_run_state(run_id, Cancelled(), force=True)  # its end, reported
            _refresh(client, [shard], lambda: now[0])
            assert shard.state == "CANCELLED" and not shard.done(now[0])  # its process gets time to exit
            now[0] += EXIT_WAIT - 0.5
            assert not shard.done(now[0])
            now[0] += 0.5
            assert shard.done(now[0])  # and no more
        _end_ours([shard])
        assert lingering.wait(timeout=60) == -signal.SIGTERM
    finally:
        lingering.kill()
        lingering.wait()
