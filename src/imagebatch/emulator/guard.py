"""The server's bounds (`ServerLimits`): on connections and request heads in the HTTP protocol, on bodies
in the ASGI layer.

uvicorn alone reads any body whole, waits for ever for a request on a new connection (its keep-alive
timeout only runs between requests) and accepts connections until the process runs out of file
descriptors, then logs "Too many open files" for each accept. So:

- `limited_protocol(limits)`: uvicorn's h11 protocol, plus a connection cap (one over it is answered 503
  at once, in the spec's error body, and closed: no request is read, nothing is logged) and a header
  timeout (a connection that has not sent a whole request head within `header_timeout` is closed);
- `BodyGuard`: the `receive` the app reads its body through; a Content-Length over `max_body_bytes` is
  refused before the body is read (`too_large`), a chunked body as soon as it passes it, and a body not
  received within `body_timeout` of the head gets 408. Each refusal closes the connection.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import h11
from starlette.types import Message, Receive, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import error_body
from .settings import ServerLimits

REFUSED_LINGER = 1.0
"""Seconds a refused connection stays half-open (our side shut) for its request to arrive and be
discarded: closing at once, with the request unread, would reset the connection and could lose the 503."""


def _answer(status: int, reason: str, message: str, code: str | None = None) -> bytes:
    body = json.dumps(error_body(status, message, code)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "retry-after: 1\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class _LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap and a header timeout (see the module's docstring)."""

    limits: ClassVar[ServerLimits]
    _head_timer: asyncio.TimerHandle | None = None
    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        open_now, cap = len(self.connections), self.limits.max_connections
        if open_now > cap:
            self._refuse(linger=open_now <= 2 * cap)
        else:
            self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # a refused connection's request is read only to be dropped
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            if self._head_timer is None:  # a further request has begun: its head is timed from here
                self._arm_head_timer()
        else:
            self._disarm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, linger: bool) -> None:
        """Answer 503 and close; with `linger`, after the client's request (see `REFUSED_LINGER`). Beyond
        twice the cap a flood is closed at once, so descriptors stay under twice the cap."""
        self._refused = True
        message = f"the emulator has {self.limits.max_connections} connections open; retry later"
        try:
            self.transport.write(_answer(503, "Service Unavailable", message))
            if linger and self.transport.can_write_eof():
                self.transport.write_eof()
                self.loop.call_later(min(REFUSED_LINGER, self.limits.header_timeout), self.transport.close)
                return
        except OSError:  # the client is already gone
            pass
        self.transport.close()


def limited_protocol(limits: ServerLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol class bound to `limits` (uvicorn builds one protocol per connection)."""
    return type("LimitedH11Protocol", (_LimitedH11Protocol,), {"limits": limits})


class BodyGuard:
    """The app's `receive`, bounded by `max_body_bytes` and `body_timeout`; answers a refusal itself.

    Once it has refused, the app reads a disconnect and whatever it sends is dropped (`send`); the
    refusal carries `Connection: close`, so uvicorn closes the connection and reads no more of the body.
    After the body is complete, `receive` is the server's own (a handler may wait on a disconnect)."""

    def __init__(
        self, receive: Receive, send: Send, limits: ServerLimits, content_length: str | None
    ) -> None:
        self._receive = receive
        self._send = send
        self.limits = limits
        self.refused = False
        self._received = 0
        self._done = False
        self._deadline = asyncio.get_running_loop().time() + limits.body_timeout
        self.too_large = content_length is not None and (
            not content_length.strip().isdigit() or int(content_length) > limits.max_body_bytes
        )

    async def refuse_too_large(self) -> None:
        limit = self.limits.max_body_bytes
        await self._refuse(413, f"the request body is larger than the emulator's limit of {limit} bytes")

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        if self._done:
            return await self._receive()
        try:
            async with asyncio.timeout(self._deadline - asyncio.get_running_loop().time()):
                message = await self._receive()
        except TimeoutError:
            seconds = self.limits.body_timeout
            await self._refuse(408, f"the request body did not arrive within {seconds:g} s")
            return {"type": "http.disconnect"}
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            self._done = not message.get("more_body", False)
            if self._received > self.limits.max_body_bytes:
                await self.refuse_too_large()
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if not self.refused:
            await self._send(message)

    async def _refuse(self, status: int, message: str) -> None:
        self.refused = True
        body = json.dumps(error_body(status, message)).encode()
        headers: list[tuple[bytes, bytes]] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        start: dict[str, Any] = {"type": "http.response.start", "status": status, "headers": headers}
        await self._send(start)
        await self._send({"type": "http.response.body", "body": body})
