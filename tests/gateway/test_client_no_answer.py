"""GatewayClient against the emulator over real HTTP: an attempt whose request reached the service and got
no answer (the connection dropped after the request was read, or an answer slower than the client's
timeout) is `unknown` on every route and never resent, so the emulator's ledger bills each idempotency key
once; an attempt that never left (a refused connection) is retried on the schedule. No real waiting: the
client's `sleep` records its delays, and a `slow` answer is held until the client has given up."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest
from helpers.fake_gateway import ALL_ROUTES, RETRYING_ROUTES, ROUTES

from imagebatch.emulator import EmulatorServer
from imagebatch.gateway import GatewayClient
from imagebatch.gateway.errors import OutcomeUnknownError, ServiceUnreachableError

TIMEOUT = 1.5
"""The client's timeout in these tests (read, and connect and write too): a `slow` answer is held until the
client has timed out whatever its length, so it need not be short; a short one failed under load, when
connecting or writing took longer than it (an error before sending, which the schedule retries)."""


class Client:
    """A client of the session's emulator whose sleep only records the delays asked for."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.delays: list[float] = []
        self.client = GatewayClient(
            base_url, api_key, sleep=self.delays.append, image_timeout=TIMEOUT, text_timeout=TIMEOUT
        )


@pytest.fixture
def client(emulator: EmulatorServer) -> Iterator[Client]:
    made = Client(emulator.url, emulator.api_key)
    yield made
    made.client.close()


@pytest.fixture
def held_slow_answers(emulator: EmulatorServer) -> Iterator[threading.Event]:
    """A `slow` answer is held until the test sets the event (or it ends): a loaded machine may take
    longer than the emulator's slow wait to notice the client's timeout, and the answer must not win."""
    release = threading.Event()
    slow = emulator.state.settings.slow_seconds

    async def hold(seconds: float) -> None:
        if seconds == slow:
            await asyncio.to_thread(release.wait, 120)

    emulator.configure(sleep=hold)
    yield release
    release.set()


@pytest.mark.parametrize("name", ALL_ROUTES)
def test_a_dropped_connection_is_unknown_and_billed_once(
    emulator: EmulatorServer, client: Client, name: str
) -> None:
    """The reproduction of the issue, on every route: `drop` (generated and billed, then the connection
    closed with no answer) then `ok`: the second attempt would have billed the key again."""
    emulator.set_faults(scripts=[["drop", "ok"]])
    key = f"drop-{name}"
    with pytest.raises(OutcomeUnknownError, match="RemoteProtocolError") as info:
        ROUTES[name](client.client, idempotency_key=key)
    assert info.value.may_have_been_billed and info.value.attempts == 1
    assert client.delays == []
    assert [(e["status"], e["attempt"]) for e in emulator.ledger(idempotency_key=key)] == [("drop", 1)]
    assert [r["idempotency_key"] for r in emulator.requests()] == [key]


@pytest.mark.parametrize("name", ALL_ROUTES)
def test_an_answer_slower_than_the_timeout_is_unknown_and_billed_once(
    emulator: EmulatorServer, client: Client, held_slow_answers: threading.Event, name: str
) -> None:
    emulator.set_faults(scripts=[["slow", "ok"]])
    key = f"slow-{name}"
    with pytest.raises(OutcomeUnknownError, match="ReadTimeout") as info:
        ROUTES[name](client.client, idempotency_key=key)
    held_slow_answers.set()
    assert info.value.may_have_been_billed and info.value.attempts == 1
    assert client.delays == []
    assert [(e["fault"], e["attempt"]) for e in emulator.ledger(idempotency_key=key)] == [("slow", 1)]
    assert [r["idempotency_key"] for r in emulator.requests()] == [key]


@pytest.mark.parametrize("name", RETRYING_ROUTES)
def test_a_retryable_status_is_still_resent_on_the_schedule(
    emulator: EmulatorServer, client: Client, name: str
) -> None:
    """A 503 is an answer: nothing was generated, so the schedule resends it, and the key is billed once."""
    emulator.set_faults(scripts=[[503, "ok"]])
    key = f"busy-{name}"
    result = ROUTES[name](client.client, idempotency_key=key)
    assert result.attempts == 2 and client.delays == [3]
    assert [e["attempt"] for e in emulator.ledger(idempotency_key=key)] == [2]


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("name", RETRYING_ROUTES)
def test_a_refused_connection_is_resent_on_the_schedule(name: str) -> None:
    """Nothing left this machine: the images and text relay routes try four times, 3 s, 8 s, 15 s apart."""
    client = Client(f"http://127.0.0.1:{closed_port()}", "k" * 32)
    with client.client, pytest.raises(ServiceUnreachableError, match="refused") as info:
        ROUTES[name](client.client)
    assert info.value.attempts == 4 and not info.value.may_have_been_billed
    assert client.delays == [3, 8, 15]
