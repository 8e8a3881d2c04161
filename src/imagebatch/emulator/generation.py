"""The steps every generating route shares, once its request is known to be valid:

count the attempt, pick the fault, wait the latency, render, bill, then answer (or wait, or hang up).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from imagebatch.gateway.constants import Route

from .bodies import refused
from .chance import choose_fault, digest, unit
from .edge import DropConnection
from .errors import ServiceError
from .render import MIME_TYPES, ImageFormat, RenderSpec
from .settings import STATUS_FAULTS
from .state import EmulatorState, RequestLogEntry

M = TypeVar("M", bound=BaseModel)

FAULT_MESSAGES: dict[int, str] = {
    401: "invalid API key",
    402: "insufficient funds: top up your balance",
    408: "request timeout",
    409: "conflict: a request with this Idempotency-Key is in progress",
    425: "too early: retry later",
    429: "rate limit exceeded or service overloaded",
    500: "generation error: check the outcome before resending",
    502: "bad gateway",
    503: "service unavailable",
}


def validate(model: type[M], body: object) -> M:
    """Validate `body` with one of the emulator's request models (`bodies`); map its error to the spec's
    error answer (`model_not_found`, a model outside the public set, is a 404 like one in the URL path)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_failure(exc) from None


def validation_failure(exc: ValidationError) -> ServiceError:
    status, code, message = refused(exc)
    return ServiceError(status, message, code)


def text_tokens(text: str) -> int:
    """A rough token count (four characters a token), enough to make usage figures plausible."""
    return max(1, math.ceil(len(text) / 4))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass(frozen=True)
class Attempt:
    """One attempt of one request that passed validation."""

    key: str
    """What attempts are counted by: the Idempotency-Key, or a digest of the body without one."""
    number: int
    fault: str | None
    route: Route
    model: str
    prompt: str

    def chance(self, seed: int, *what: object) -> float:
        """A number in [0, 1) fixed by (seed, key, what): the same key always gets the same answer shape."""
        return unit(seed, "shape", self.key, *what)


async def begin(
    emu: EmulatorState,
    record: RequestLogEntry,
    *,
    route: Route,
    model: str,
    prompt: str,
    fingerprint: bytes,
) -> Attempt:
    """Count the attempt and apply its fault: a status fault raises here (nothing generated, nothing
    billed); otherwise wait the latency and return the attempt for the route to generate."""
    record.route, record.model = route.value, model
    refused = emu.admit(record)
    if refused is not None:  # a limit, not an attempt: nothing counted, generated or billed
        record.limit, retry_after = refused
        headers = {"Retry-After": str(retry_after)}
        if record.limit.startswith("overload"):
            status = int(record.limit.split()[1])
            raise ServiceError(
                status,
                f"the service is overloaded (emulated burst); retry after {retry_after} s",
                headers=headers,
            )
        what = "requests per minute" if record.limit == "rpm" else "generations in flight"
        raise ServiceError(
            429,
            f"rate limit exceeded: too many {what} for this key; retry after {retry_after} s",
            "rate_limit_exceeded",
            headers=headers,
        )
    key = record.idempotency_key or "body:" + digest(route.value, fingerprint).hex()[:32]
    number = emu.next_attempt(key)
    settings = emu.settings
    fault = choose_fault(
        settings.faults, seed=settings.seed, route=route, key=key, prompt=prompt, attempt=number
    )
    record.route, record.model, record.attempt, record.fault = route.value, model, number, fault
    if fault in STATUS_FAULTS:
        status = int(fault)
        raise ServiceError(status, f"{FAULT_MESSAGES[status]} (emulated fault)")
    if settings.latency:
        await settings.sleep(settings.latency)
    return Attempt(key=key, number=number, fault=fault, route=route, model=model, prompt=prompt)


async def finish(
    emu: EmulatorState,
    record: RequestLogEntry,
    attempt: Attempt,
    response: Response,
    *,
    images: int,
    usage: Mapping[str, object],
) -> Response:
    """Bill the generation, then answer: now, after `slow_seconds` (`slow`), or never (`drop`).

    The entry is written before any `slow` wait so that a client that gave up can already see it.
    """
    emu.bill(
        route=attempt.route.value,
        model=attempt.model,
        images=images,
        usage=usage,
        idempotency_key=record.idempotency_key,
        request_id=record.request_id,
        status="drop" if attempt.fault == "drop" else response.status_code,
        fault=attempt.fault,
        attempt=attempt.number,
        prompt=attempt.prompt,
    )
    if attempt.fault == "slow":
        await emu.settings.sleep(emu.settings.slow_seconds)
    if attempt.fault == "drop":
        return DropConnection()
    return response


def delivered_count(emu: EmulatorState, attempt: Attempt, cap: int) -> int:
    """How many images to deliver under X-Service-Max-Images `cap`: 1..cap, or exactly cap."""
    settings = emu.settings
    if settings.max_images_policy == "cap":
        return cap
    return 1 + int(attempt.chance(settings.seed, "count") * cap)


def image_format(emu: EmulatorState, attempt: Attempt, index: int) -> ImageFormat:
    return "JPEG" if attempt.chance(emu.settings.seed, "jpeg", index) < emu.settings.jpeg_rate else "PNG"


async def render(emu: EmulatorState, spec: RenderSpec) -> tuple[str, bytes]:
    """Render off the event loop (a 4K PNG takes a few hundred ms); return (mime type, bytes)."""
    data = await run_in_threadpool(emu.renderer.render, spec)
    return MIME_TYPES[spec.fmt], data


def no_query(request: Request) -> None:
    """The spec's routes take no query parameters (in particular no `alt=sse` streaming, no `?key=`)."""
    if request.query_params:
        names = ", ".join(sorted(request.query_params.keys()))
        hint = "; an API key goes in a header, never in the URL" if "key" in request.query_params else ""
        raise ServiceError(
            400, f"query parameters are not supported here (got {names}); streaming is not{hint}"
        )
