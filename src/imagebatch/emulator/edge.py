"""The outermost ASGI layer: request id on every answer, the request log, and dropped connections.

It sits outside Starlette's own error middleware (see `EmulatorApp.build_middleware_stack`) so that it
sees every answer, including framework 404/405/500s, and so that the `send` it receives is the server's
own, which is what lets it close a connection without answering.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from imagebatch.gateway.constants import IDEMPOTENCY_HEADER, REQUEST_ID_HEADER

from .errors import error_body
from .guard import BodyGuard
from .settings import ServerLimits
from .state import EmulatorState, RequestLogEntry

logger = logging.getLogger("imagebatch.emulator")

RECORD_SCOPE_KEY = "imagebatch.emulator.record"


class DropConnection(Response):
    """Returned by a handler to have the connection closed without any HTTP response."""

    def __init__(self) -> None:
        super().__init__(status_code=599)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Send nothing; the edge layer sees the flag once the app returns and closes the connection.
        scope[RECORD_SCOPE_KEY].drop = True


def record_of(scope: Scope) -> RequestLogEntry:
    record: RequestLogEntry = scope[RECORD_SCOPE_KEY]
    return record


async def _close_connection(send: Send) -> bool:
    """Close the client connection under the running request, without a response. Return success.

    ASGI has no message for "hang up", so this reaches uvicorn's transport through its bound `send`
    (the h11 and httptools protocols both keep it on `cycle.transport`). We then yield to the loop until
    uvicorn has seen the connection lost, so it does not try to answer 500 itself.
    """
    cycle: Any = getattr(send, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        return False
    transport.close()
    for _ in range(100):
        if getattr(cycle, "disconnected", True):
            break
        await asyncio.sleep(0)
    return True


class EdgeMiddleware:
    """Assign a request id, log the request, add `x-request-id` to the answer, carry out drops, bound
    the body (`BodyGuard`)."""

    def __init__(self, app: ASGIApp, state: EmulatorState, limits: ServerLimits) -> None:
        self.app = app
        self.state = state
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        record = self.state.open_request(scope["method"], scope["path"], headers.get(IDEMPOTENCY_HEADER))
        scope[RECORD_SCOPE_KEY] = record
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = record.request_id
                record.status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                record.ended = time.time()  # before the last byte leaves: a client never sees it unset
            await send(message)

        guard = BodyGuard(receive, send_with_id, self.limits, headers.get("content-length"))
        try:
            if guard.too_large:
                await guard.refuse_too_large()
            else:
                await self._serve(scope, guard.receive, guard.send, send, record, lambda: started)
        finally:
            if record.ended is None:  # no answer (a drop, an error before one)
                record.ended = time.time()
            self.state.release(record)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send_with_id: Send,
        send: Send,
        record: RequestLogEntry,
        started: Any,
    ) -> None:
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # Starlette's error middleware has already answered 500 (our handler, spec body) and
            # re-raised only so servers can log it; log it here instead of letting uvicorn print it twice.
            if not started():
                logger.exception("unhandled error in emulator")
                await _send_500(send_with_id)
            return
        if record.drop and not started():
            record.status = "drop"
            if not await _close_connection(send):
                raise ConnectionAbortedError("emulator fault: connection dropped without a response")


async def _send_500(send: Send) -> None:
    body = json.dumps(error_body(500, "emulator internal error", "internal_error")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 500,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
