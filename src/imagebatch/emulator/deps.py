"""Typed FastAPI dependencies shared by the routers: state, request record, auth per route, headers, body.

FastAPI resolves a route's dependencies in declaration order (those of the decorator first), which is how the
check order of the README (path, then auth, then headers, then body) is enforced.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request

from imagebatch.gateway.constants import (
    COMPAT_VERSION_HEADER,
    MAX_IMAGES_HEADER,
    MESSAGES_KEY_HEADER,
    NATIVE_KEY_HEADER,
    Route,
)

from .edge import record_of
from .errors import ServiceError
from .spec import MAX_IMAGES_RANGE
from .state import EmulatorState, RequestLogEntry


def get_emulator(request: Request) -> EmulatorState:
    state: EmulatorState = request.app.state.emulator
    return state


def get_record(request: Request) -> RequestLogEntry:
    return record_of(request.scope)


EmulatorDep = Annotated[EmulatorState, Depends(get_emulator)]
RecordDep = Annotated[RequestLogEntry, Depends(get_record)]


def mark_route(route: Route) -> Callable[[RequestLogEntry], None]:
    """A dependency that notes in the request log which route the path matched."""

    def mark(record: RecordDep) -> None:
        record.route = route.value

    return mark


# --- auth ----------------------------------------------------------------------------------------


def _bearer_token(request: Request) -> str | None:
    value = request.headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        raise ServiceError(401, "Authorization must be 'Bearer <API_KEY>'", "invalid_api_key")
    return token.strip()


def _check_key(emu: EmulatorState, given: str | None, how: str) -> None:
    if not given:
        raise ServiceError(401, f"missing API key: send {how}", "missing_api_key")
    if not hmac.compare_digest(given.encode(), emu.settings.api_key.encode()):
        # Never echo the key back: it might be another provider's real key.
        raise ServiceError(401, "invalid API key", "invalid_api_key")


def bearer_auth(request: Request, emu: EmulatorDep) -> None:
    """Chat, images and responses routes: `Authorization: Bearer <API_KEY>` only."""
    _check_key(emu, _bearer_token(request), "'Authorization: Bearer <API_KEY>'")


def native_auth(request: Request, emu: EmulatorDep) -> None:
    """Native route: `x-native-api-key` or Bearer, one of the two."""
    native_key = request.headers.get(NATIVE_KEY_HEADER)
    if native_key is not None and "authorization" in request.headers:
        raise ServiceError(
            401, f"send either {NATIVE_KEY_HEADER} or Authorization: Bearer, not both", "invalid_api_key"
        )
    given = native_key if native_key is not None else _bearer_token(request)
    _check_key(emu, given, f"'{NATIVE_KEY_HEADER}: <API_KEY>' or 'Authorization: Bearer <API_KEY>'")


def messages_auth(request: Request, emu: EmulatorDep) -> None:
    """Messages route: `x-api-key` plus `compat-version`; Bearer is refused."""
    if "authorization" in request.headers:
        raise ServiceError(
            401,
            f"the messages route does not accept Authorization: Bearer; send {MESSAGES_KEY_HEADER}",
            "invalid_api_key",
        )
    _check_key(emu, request.headers.get(MESSAGES_KEY_HEADER), f"'{MESSAGES_KEY_HEADER}: <API_KEY>'")
    if not request.headers.get(COMPAT_VERSION_HEADER, "").strip():
        raise ServiceError(401, f"the {COMPAT_VERSION_HEADER} header is required", "missing_compat_version")


# --- headers and body ----------------------------------------------------------------------------


def max_images(request: Request) -> int:
    """`X-Service-Max-Images`: an integer 1..4, default 1."""
    values = request.headers.getlist(MAX_IMAGES_HEADER)
    if not values:
        return MAX_IMAGES_RANGE[0]
    value = values[0].strip()
    if len(values) > 1 or not (value.isascii() and value.isdigit()):
        raise ServiceError(400, f"{MAX_IMAGES_HEADER} must be one integer from 1 to 4, not {values!r}")
    number = int(value)
    if number not in MAX_IMAGES_RANGE:
        raise ServiceError(400, f"{MAX_IMAGES_HEADER} must be from 1 to 4, not {number}")
    return number


MaxImagesDep = Annotated[int, Depends(max_images)]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object; 400 for another content type, invalid JSON or a non-object."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise ServiceError(400, f"Content-Type must be application/json, not {media_type or 'missing'!r}")
    raw = await request.body()
    try:
        body = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ServiceError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ServiceError(400, "the request body must be a JSON object")
    return body


JsonBodyDep = Annotated[dict[str, Any], Depends(json_body)]
