"""The account-wide limit (issue 11, item 3): `imagebatch limits` creates Prefect global concurrency limits,
and a run that names one holds a slot of it for each request on the wire, so the service never sees more
requests at once than the limit, whatever the run's own --concurrency."""

from __future__ import annotations

import itertools
import logging
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import Rendezvous, catalog, cli, peak_in_flight, run_now

from imagebatch.errors import UsageError
from imagebatch.platform.limits import set_limits
from imagebatch.run.limits import (
    LINGER_SECONDS,
    REUSE_SECONDS,
    SLOT_LEASE_SECONDS,
    SlotBroker,
    rate_limit_name,
)


def read_limit(name: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return None


pytestmark = pytest.mark.usefixtures("prefect")  # every test here asks Prefect's server for its limits


def test_limits_creates_updates_and_removes_the_limits(capsys: Any) -> None:
    code, out, _ = cli(capsys, "limits", "--name", "t-create", "--concurrency", "3", "--per-minute", "120")
    assert code == 0 and "t-create: 3 requests on the wire at once" in out and "120 a minute" in out
    assert read_limit("t-create").limit == 3
    rate = read_limit(rate_limit_name("t-create"))
    assert rate.limit == 120 and rate.slot_decay_per_second == pytest.approx(2.0)
    code, _, _ = cli(capsys, "limits", "--name", "t-create", "--concurrency", "5", "--per-minute", "0")
    assert code == 0 and read_limit("t-create").limit == 5 and read_limit(rate_limit_name("t-create")) is None


def test_a_global_limit_bounds_requests_on_the_wire_below_the_runs_concurrency(
    service_env: Any, tmp_path: Path, capsys: Any
) -> None:
    assert cli(capsys, "limits", "--name", "t-wire", "--concurrency", "2")[0] == 0
    service_env.configure(latency=0.05)
    manifest = catalog(tmp_path / "m.csv", 24)
    info = run_now(manifest, tmp_path / "limited", concurrency=8, global_limit="t-wire", adaptive=False)
    assert info["counts"]["succeeded"] == 24 and info["options"]["global_limit"] == "t-wire"
    assert peak_in_flight(service_env.requests()) <= 2
    assert set(Counter(r["idempotency_key"] for r in service_env.requests()).values()) == {1}
    assert read_limit("t-wire").active_slots == 0  # every slot given back

    service_env.reset()
    service_env.configure(latency=0.05, jpeg_rate=0.0, sleep=Rendezvous(3))
    run_now(manifest, tmp_path / "unlimited", concurrency=8, adaptive=False)
    assert peak_in_flight(service_env.requests()) > 2  # the same run without it: the limit did the bounding


def test_a_limit_the_server_does_not_have_is_refused_before_anything_is_sent(
    service_env: Any, tmp_path: Path
) -> None:
    with pytest.raises(UsageError, match=r"no global concurrency limit 't-missing'.*imagebatch limits"):
        run_now(catalog(tmp_path / "m.csv", 2), tmp_path / "out", global_limit="t-missing", adaptive=False)
    assert service_env.requests() == []


def _take_in_turn(broker: SlotBroker, threads: int, each: int) -> int:
    """`threads` threads each hold a slot `each` times in turn; return the most held at once."""
    lock = threading.Lock()
    held = peak = 0

    def one(_: int) -> None:
        nonlocal held, peak
        for _ in range(each):
            with broker():
                with lock:
                    held += 1
                    peak = max(peak, held)
                with lock:
                    held -= 1

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads)))
    return peak


def test_a_run_passes_its_slots_from_request_to_request_without_the_server() -> None:
    """The broker asks Prefect's server for a lease only when no request of the run gives one back:
    80 slots taken by 8 threads under a limit of 2 cost the server a handful of leases, not 80."""
    set_limits("t-broker", 2, None)
    with SlotBroker("t-broker") as broker:
        peak = _take_in_turn(broker, threads=8, each=10)
    assert peak <= 2
    assert broker.granted + broker.passed_on == 80
    assert broker.passed_on > 10 * broker.granted
    assert read_limit("t-broker").active_slots == 0  # every lease given back at the end


def test_a_lease_older_than_reuse_seconds_goes_back_to_the_server() -> None:
    """Each slot returns to the server every `reuse_seconds`, where other runs waiting for the limit can
    take it: with a clock that moves past it between any two readings, no lease is ever passed on."""
    set_limits("t-stale", 2, None)
    ticks = itertools.count(step=REUSE_SECONDS + 1)
    with SlotBroker("t-stale", clock=lambda: float(next(ticks))) as broker:
        peak = _take_in_turn(broker, threads=4, each=5)
    assert peak <= 2
    assert (broker.granted, broker.passed_on) == (20, 0)
    assert read_limit("t-stale").active_slots == 0


def test_a_lease_waits_a_moment_for_the_runs_next_request_then_goes_back() -> None:
    """Between one unit's end and the next unit's start no request of the run waits, so the lease lingers
    `linger_seconds` for the next request, and goes back to the server after that."""
    set_limits("t-linger", 1, None)
    now = [0.0]
    with SlotBroker("t-linger", clock=lambda: now[0], keeper=False) as broker:
        with broker():
            pass
        now[0] += LINGER_SECONDS / 2
        with broker():  # the same lease, not a second one from the server
            pass
        assert (broker.granted, broker.passed_on) == (1, 1)
        assert broker.tend() == (0, 0) and read_limit("t-linger").active_slots == 1
        now[0] += LINGER_SECONDS
        assert broker.tend() == (1, 0) and read_limit("t-linger").active_slots == 0


def test_the_leases_held_are_renewed_past_half_a_lease(caplog: pytest.LogCaptureFixture) -> None:
    set_limits("t-renew", 1, None)
    now = [0.0]
    with SlotBroker("t-renew", clock=lambda: now[0], keeper=False) as broker:
        with broker():
            assert broker.tend() == (0, 0)
            now[0] += SLOT_LEASE_SECONDS / 2
            assert broker.tend() == (0, 1)  # accepted by the server: a refused renewal logs a warning
            assert broker.tend() == (0, 0)
            assert read_limit("t-renew").active_slots == 1
    assert read_limit("t-renew").active_slots == 0  # past reuse_seconds: given back as the attempt ended
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_limit_deleted_during_a_run_fails_the_request_instead_of_running_it_unlimited() -> None:
    from prefect.client.orchestration import get_client

    set_limits("t-gone", 2, None)
    with SlotBroker("t-gone") as broker:
        with get_client(sync_client=True) as client:
            client.delete_global_concurrency_limit_by_name("t-gone")
        with pytest.raises(UsageError, match="no longer has the global concurrency limit 't-gone'"):
            with broker():
                pass


def test_a_refusal_from_the_server_reaches_every_waiting_request_and_none_hangs() -> None:
    """A limit of 0 makes Prefect's server refuse each ask (422: more slots asked than the limit): every
    request waiting for a slot gets the error, and the next request asks again."""
    import httpx

    set_limits("t-zero", 0, None)
    with SlotBroker("t-zero") as broker:
        errors: list[httpx.HTTPStatusError] = []

        def one(_: int) -> None:
            try:
                with broker():
                    pass
            except httpx.HTTPStatusError as exc:
                errors.append(exc)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, range(8)))
    assert len(errors) == 8 and {e.response.status_code for e in errors} == {422}
    assert broker.granted == broker.passed_on == 0
