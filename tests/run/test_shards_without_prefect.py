"""How the parent of a sharded run knows its shards' ends once Prefect's server is lost
(`run.shard_runs._Watch.turn_without_prefect`): from its own shard's process and the shards' locks in a
real output folder (held here by this process, as a shard's process holds its own), on a clock of the
test's. The whole of it against a real server killed mid-run: tests/platform/test_shards_lost_server.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prefect import flow

from imagebatch.run.constants import SHARD_GRACE
from imagebatch.run.shard_runs import (
    EXIT_WAIT,
    PATIENCE,
    UNKNOWN,
    _end_ours,
    _Failures,
    _guarded,
    _reap,
    _Shard,
    _signal_ours,
    _Watch,
)
from imagebatch.work.store import OutputStore

pytestmark = pytest.mark.usefixtures("prefect")  # a stop logs to the flow run's logger

GRACE = 30.0
NEVER_STARTED = 300.0


class Scene:
    """A parent's watch over two shards of an output folder, without Prefect, on a clock of the test's."""

    def __init__(self, out: Path, tracked: list[_Shard], stop: str | None = None) -> None:
        self.out, self.now, self.stop = out, 1000.0, stop
        store, clock, stop = OutputStore(out), (lambda: self.now), (lambda: self.stop)
        self.watch = _Watch(None, tracked, store, 2, clock, GRACE, 60.0, NEVER_STARTED, stop)
        self.tracked = tracked

    def hold(self, shard: int) -> AbstractContextManager[None]:
        """Shard `shard`'s lock, held as its process holds it while it sends."""
        return OutputStore(self.out, f"{shard}-of-2").backend.shard_hold()

    def turn(self, after: float = 0.0) -> bool:
        self.now += after
        return self.watch.turn_without_prefect()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing for a shard the parent started: it runs until stopped."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    yield process
    process.kill()
    process.wait()


def test_our_shard_has_ended_when_its_process_exits(tmp_path: Path) -> None:
    ours = _Shard(0, "run-0", 0.0, state="RUNNING", claimed_here=True)
    ours.here = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    ours.here.wait(timeout=60)
    here = Scene(tmp_path, [ours])
    assert here.turn() and ours.here is None
    assert ours.state == UNKNOWN and "its process exited (3)" in ours.message  # type: ignore[operator]


def test_our_shard_whose_lock_was_freed_has_ended_after_the_exit_wait_even_if_its_process_lingers(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Its records are written once its lock is free; Prefect's engine may hold its exit for minutes."""
    ours = _Shard(0, "run-0", 0.0, state="RUNNING", here=sleeper, claimed_here=True)
    here = Scene(tmp_path, [ours])
    with here.hold(0):
        assert not here.turn() and ours.seen_held
    assert not here.turn(1.0)  # seen free: from now
    assert not here.turn(EXIT_WAIT - 0.5) and ours.state == "RUNNING"
    assert here.turn(0.5) and ours.state == UNKNOWN and "still exiting" in ours.message  # type: ignore[operator]
    _end_ours(here.tracked)  # what the parent does as it leaves: stopped and reaped
    assert sleeper.poll() == -signal.SIGTERM


def test_our_shard_never_seen_holding_its_lock_is_waited_for_until_its_process_exits(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Still starting when the server was lost, for all the parent knows: its lock is not yet taken."""
    ours = _Shard(0, "run-0", 0.0, state="PENDING", here=sleeper, claimed_here=True)
    here = Scene(tmp_path, [ours])
    assert not here.turn()
    assert not here.turn(10 * SHARD_GRACE) and ours.state == "PENDING"
    sleeper.kill()
    sleeper.wait()
    assert here.turn() and ours.state == UNKNOWN


def test_a_workers_shard_has_ended_once_its_lock_has_been_free_for_the_grace(tmp_path: Path) -> None:
    theirs = _Shard(1, "run-1", 0.0, state="PENDING")
    here = Scene(tmp_path, [theirs])
    with here.hold(1):
        assert not here.turn()
        assert not here.turn(10 * GRACE) and theirs.seen_held  # it sends: as long as it takes
    assert not here.turn(1.0)  # seen free: from now
    assert not here.turn(GRACE)
    assert here.turn(1.0) and theirs.state == UNKNOWN
    assert "its lock free for 31 s after Prefect's server was lost" in theirs.message  # type: ignore[operator]


def test_a_workers_shard_never_seen_running_is_given_the_start_timeout(tmp_path: Path) -> None:
    """Claimed (Pending) when the server was lost and never seen holding its lock: a worker may still start
    it if the server comes back, so its lock must stay free for `never_started`, not the grace."""
    theirs = _Shard(1, "run-1", 0.0, state="PENDING")
    here = Scene(tmp_path, [theirs])
    assert not here.turn()
    assert not here.turn(NEVER_STARTED) and theirs.state == "PENDING"
    assert here.turn(1.0) and theirs.state == UNKNOWN


def test_a_stop_without_prefect_stops_our_shard_once_and_leaves_a_workers_shard_running(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """A worker's shard cannot be told to stop without the server; the parent waits for its own only."""
    ours = _Shard(0, "run-0", 0.0, state="RUNNING", here=sleeper, claimed_here=True)
    theirs = _Shard(1, "run-1", 0.0, state="RUNNING")
    here = Scene(tmp_path, [ours, theirs], stop="interrupted (SIGTERM)")

    @flow(name="a-stopping-parent")
    def parent() -> None:
        with here.hold(1):
            here.turn()  # ours may have exited by the end of the turn already
            assert sleeper.wait(timeout=60) == -signal.SIGTERM and ours.told_to_stop
            assert theirs.state == UNKNOWN and "still running on its worker" in theirs.message  # type: ignore[operator]
            assert here.turn() and ours.state == UNKNOWN  # its exit seen

    parent()


def test_our_shard_told_to_stop_is_neither_signalled_again_nor_killed_as_the_parent_leaves(
    tmp_path: Path,
) -> None:
    """A second SIGTERM would abandon its requests in flight (`run.graceful_stop`): the parent's stop sends
    one, and the parent leaving on an error before the shard has ended sends none more, nor kills it."""
    from helpers.prefect_server import wait_for

    counts = tmp_path / "sigterms"
    code = (
        "import signal, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: open({str(counts)!r}, 'a').write('x'))\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        ours = _Shard(0, "run-0", 0.0, state="RUNNING", here=child, claimed_here=True)
        _signal_ours([ours])
        wait_for("the shard's SIGTERM handled", counts.exists, 60)
        _signal_ours([ours])
        _end_ours([ours])
        assert ours.told_to_stop and child.poll() is None and counts.read_text() == "x"
    finally:
        child.kill()
        child.wait()
        assert child.stdout is not None
        child.stdout.close()


class Unanswered:
    """Prefect's client where the server answers every call with `status` (None: no answer at all)."""

    def __init__(self, status: int | None) -> None:
        self.status = status

    def __getattr__(self, name: str) -> Any:
        def call(*_args: Any, **_kwargs: Any) -> Any:
            request = httpx.Request("GET", "http://127.0.0.1:9/api/flow_runs/x")
            if self.status is None:
                raise httpx.ConnectError("connection refused", request=request)
            response = httpx.Response(self.status, request=request)
            raise httpx.HTTPStatusError(f"{self.status}", request=request, response=response)

        return call


@pytest.mark.parametrize("status", [None, 429, 500, 503])
def test_turns_that_fail_are_asked_again_then_count_the_server_lost_after_the_patience(
    tmp_path: Path, status: int | None
) -> None:
    """A server that answers its health check but fails every call about the shards (a bug, a bad row):
    the parent asks again each turn, and after `PATIENCE` seconds of failures counts it as lost, so that
    its records are written from the output rather than never."""
    theirs = _Shard(1, "run-1", 0.0, state="RUNNING")
    here = Scene(tmp_path, [theirs])
    here.watch.client = Unanswered(status)
    failed = _Failures(lambda: here.now)

    @flow(name="a-parent-whose-server-fails")
    def parent() -> list[str]:
        steps = [_guarded(here.watch.turn, 2.0, lambda: False, failed)]
        here.now += PATIENCE - 1.0
        steps.append(_guarded(here.watch.turn, 2.0, lambda: False, failed))
        here.now += 1.0
        steps.append(_guarded(here.watch.turn, 2.0, lambda: False, failed))
        return steps

    assert parent() == ["wait", "wait", "lost"]


def test_a_turn_refused_by_the_server_raises(tmp_path: Path) -> None:
    """A 4xx is an answer (a bug of ours, or a run deleted): never asked again for ever."""
    here = Scene(tmp_path, [_Shard(1, "run-1", 0.0, state="RUNNING")])
    here.watch.client = Unanswered(404)
    with pytest.raises(httpx.HTTPStatusError):
        _guarded(here.watch.turn, 2.0, lambda: False, _Failures(lambda: here.now))


def test_a_stop_reaches_our_shard_while_every_call_to_the_server_fails(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """The parent's stop signals its own shard before it asks the server anything: a server that does not
    answer never keeps our shard sending."""
    ours = _Shard(0, "run-0", 0.0, state="RUNNING", here=sleeper, claimed_here=True)
    here = Scene(tmp_path, [ours], stop="interrupted (SIGTERM)")
    here.watch.client = Unanswered(None)

    @flow(name="a-stopping-parent-whose-server-fails")
    def parent() -> str:
        return _guarded(here.watch.turn, 2.0, lambda: False, _Failures(lambda: here.now))

    assert parent() == "wait"
    assert sleeper.wait(timeout=60) == -signal.SIGTERM and ours.told_to_stop


def test_our_exited_shard_is_kept_for_the_next_turn_when_the_server_fails_to_say_how_it_ended() -> None:
    """`_reap` reads the run of a shard process that exited; a call that fails leaves the process known,
    so the next turn reads it again (forgotten, the shard looked like a worker's and waited the grace)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=60)
    ours = _Shard(0, "run-0", 0.0, state="RUNNING", here=process, claimed_here=True)
    with pytest.raises(httpx.ConnectError):
        _reap(Unanswered(None), [ours], 2, stopping=False)
    assert ours.here is process


@pytest.mark.parametrize(("status", "step"), [(None, "lost"), (503, "wait")])
def test_once_the_health_checks_lost_the_server_a_refused_call_writes_it_off_and_a_stall_does_not(
    tmp_path: Path, status: int | None, step: str
) -> None:
    """A server killed refuses connections: written off at once. One that stalls (SQLite's lock: its
    health checks time out too, and the run's guard counts it lost) answers 503 or late: asked again."""
    here = Scene(tmp_path, [_Shard(1, "run-1", 0.0, state="RUNNING")])
    here.watch.client = Unanswered(status)

    @flow(name="a-parent-whose-health-checks-failed")
    def parent() -> str:
        return _guarded(here.watch.turn, 2.0, lambda: True, _Failures(lambda: here.now))

    assert parent() == step
