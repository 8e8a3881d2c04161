"""The emulator's error answers: one exception, the spec's error body, and the handlers that make every
error (including Starlette's own 404/405 and FastAPI's 422) come out in that body."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from imagebatch.gateway.errors import ErrorBody

logger = logging.getLogger("imagebatch.emulator")

# status -> (error.type, default error.code). The spec names only `invalid_request` and
# `unsupported_endpoint`; the rest are our choice (see the emulator README's table).
ERROR_KINDS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    402: ("billing_error", "insufficient_funds"),
    403: ("permission_error", "forbidden"),
    404: ("not_found_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("timeout_error", "request_timeout"),
    409: ("conflict_error", "conflict"),
    413: ("invalid_request_error", "request_too_large"),
    425: ("too_early_error", "too_early"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", "generation_error"),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "service_unavailable"),
}


class ServiceError(Exception):
    """Raise anywhere in a request to answer with the spec's error body."""

    def __init__(
        self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or ERROR_KINDS.get(status, ("error", "error"))[1]
        self.headers = headers or {}


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """The spec's error body: `error.message`, `error.type`, `error.code`, and a top-level `message`."""
    kind, default_code = ERROR_KINDS.get(status, ("server_error" if status >= 500 else "error", "error"))
    return ErrorBody.of(message, kind, code or default_code).model_dump()


def error_response(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code), status_code=status)


async def _service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    response = error_response(exc.status, exc.message, exc.code)
    response.headers.update(exc.headers)
    return response


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status == 404:
        message = f"no route {request.method} {request.url.path}; check the base address and API version"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}; use POST"
    else:
        message = str(exc.detail) if exc.detail else HTTPStatus(status).phrase
    response = error_response(status, message)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def _request_validation(request: Request, exc: Exception) -> JSONResponse:
    # Only path parameters go through FastAPI's own validation here; anything it refuses is a bad request.
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ()))
    return error_response(400, f"{loc}: {first.get('msg', 'invalid request')}")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, ClientDisconnect):
        # The client left mid-body, or BodyGuard refused the body: no one to answer, nothing to log.
        return error_response(400, "the client disconnected before the request body was complete")
    logger.exception("emulator bug while answering %s %s", request.method, request.url.path)
    return error_response(500, f"emulator internal error: {type(exc).__name__}", "internal_error")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error the framework or our code raises into the spec's error body."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(Exception, _unexpected)
