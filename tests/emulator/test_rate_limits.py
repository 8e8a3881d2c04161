"""The emulator's limits, off by default (issue 10, item 2): `rpm` (generations started per rolling
minute) and `max_in_flight` (generations at once), answered with the spec's 429 body and `Retry-After`,
not counted as attempts and not billed. The minute is a fake clock; nothing sleeps."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from helpers.emulator import assert_error, native_body, post

from imagebatch.emulator import EmulatorServer
from imagebatch.gateway.constants import Route


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def native(emulator: EmulatorServer, key: str) -> Any:
    return post(emulator, Route.NATIVE, native_body(f"boat {key}"), key=key)


def test_no_limit_by_default(emulator: EmulatorServer) -> None:
    assert all(native(emulator, f"k{i}").status_code == 200 for i in range(12))


def test_rpm_refuses_the_request_over_the_minute_and_says_when(emulator: EmulatorServer) -> None:
    clock = Clock()
    emulator.configure(rpm=3, clock=clock)
    for i in range(3):
        clock.now += 10
        assert native(emulator, f"r{i}").status_code == 200
    clock.now += 5  # the first start was 25 s ago: 35 s to wait
    refused = native(emulator, "r3")
    body = assert_error(refused, 429, "rate_limit_exceeded")
    assert refused.headers["retry-after"] == "35" and "requests per minute" in body["error"]["message"]
    assert [e["idempotency_key"] for e in emulator.ledger()] == ["r0", "r1", "r2"]  # not billed
    log = emulator.requests()[-1]
    assert (log["status"], log["limit"], log["attempt"]) == (429, "rpm", None)  # not an attempt
    clock.now += 35  # the first start leaves the window
    assert native(emulator, "r3").status_code == 200
    assert emulator.attempts()["r3"] == 1


def test_max_in_flight_refuses_while_generations_are_running(emulator: EmulatorServer) -> None:
    release = threading.Event()
    entered = threading.Semaphore(0)

    async def held(_seconds: float) -> None:
        entered.release()
        await asyncio.to_thread(release.wait)

    # An earlier test's request the client gave up on (a `slow` fault) may still be running: wait for it.
    deadline = time.monotonic() + 30
    while emulator.state.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert emulator.state.in_flight == 0
    emulator.configure(max_in_flight=2, latency=1.0, sleep=held)
    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(native, emulator, f"f{i}") for i in range(2)]
        assert entered.acquire(timeout=30) and entered.acquire(timeout=30)
        refused = native(emulator, "f2")
        assert_error(refused, 429, "rate_limit_exceeded")
        assert refused.headers["retry-after"] == "1" and emulator.requests()[-1]["limit"] == "max_in_flight"
        release.set()
        assert [f.result(timeout=30).status_code for f in running] == [200, 200]
    emulator.configure(latency=0.0)
    assert native(emulator, "f2").status_code == 200
    ended = [r for r in emulator.requests() if r["status"] == 200]
    assert all(r["ended"] is not None and r["ended"] >= r["time"] for r in ended)


def test_the_client_waits_what_retry_after_says_on_the_images_route(emulator: EmulatorServer) -> None:
    """The emulator's minute runs on a fake clock that the client's injected sleep moves forward: the
    second request is refused (429, Retry-After 60), waited for, and then sent again successfully."""
    from imagebatch.gateway import GatewayClient
    from imagebatch.gateway.requests import images_generation

    clock = Clock()
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.now += seconds

    emulator.configure(rpm=1, clock=clock)
    with GatewayClient(emulator.url, emulator.api_key, sleep=sleep) as client:
        first = client.send(images_generation(prompt="a lamp"), idempotency_key="ra-1")
        second = client.send(images_generation(prompt="a desk"), idempotency_key="ra-2")
    assert first.attempts == 1 and second.attempts == 2
    assert waits == [60.0]  # Retry-After (60 s), not the spec's first step (3 s)
    assert [e["idempotency_key"] for e in emulator.ledger()] == ["ra-1", "ra-2"]


def test_overload_bursts_refuse_everything_for_a_while_then_pass(emulator: EmulatorServer) -> None:
    from imagebatch.emulator.settings import parse_bursts

    clock = Clock()
    clock.now = 600.0  # the start of a period of 60 s
    emulator.configure(clock=clock, overload=parse_bursts("60:5"))
    refused = native(emulator, "o1")
    assert_error(refused, 503)
    assert refused.headers["retry-after"] == "5" and emulator.requests()[-1]["limit"] == "overload 503"
    clock.now += 5
    assert native(emulator, "o1").status_code == 200
    assert [e["idempotency_key"] for e in emulator.ledger()] == ["o1"] and emulator.attempts()["o1"] == 1
