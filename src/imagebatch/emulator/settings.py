"""Configuration of one emulator instance: the key it accepts, its seed, latency, image mix and faults.

Everything that makes the emulator behave one way or another enters through `EmulatorSettings`, which is
passed to `create_app`; there is no module-level settings object.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from imagebatch.gateway.constants import Route

# A status fault answers with that HTTP status and generates nothing (nothing is billed).
StatusFault = Literal["401", "402", "408", "409", "425", "429", "500", "502", "503"]
# `slow`: generate (billed), then wait `slow_seconds` before answering 200.
# `drop`: generate (billed), then close the connection without any HTTP response.
# `no_image`: answer 200 without a final image (native: finishReason SAFETY; chat: text only).
FaultOutcome = Literal[StatusFault, "slow", "drop", "no_image"]
# `ok` is only meaningful in a script: "this attempt is answered normally".
ScriptOutcome = Literal[FaultOutcome, "ok"]

STATUS_FAULTS: tuple[str, ...] = get_args(StatusFault)
FAULT_OUTCOMES: tuple[str, ...] = (*STATUS_FAULTS, "slow", "drop", "no_image")


def _outcome_str(value: Any) -> Any:
    """Accept `503` as well as `"503"`, so JSON and Python callers can write statuses as numbers."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class _StrictSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScriptedFault(_StrictSettings):
    """The first `len(outcomes)` attempts of each matching Idempotency-Key get these outcomes, in order."""

    outcomes: list[ScriptOutcome] = Field(min_length=1)
    """Outcome of attempt 1, 2, ...; `ok` answers that attempt normally. Later attempts fall through."""
    match: str | None = None
    """Only requests whose Idempotency-Key or prompt contains this substring; None: every request."""
    routes: list[Route] | None = None
    """Only these routes; None: every route."""

    @field_validator("outcomes", mode="before")
    @classmethod
    def _numbers_ok(cls, v: Any) -> Any:
        return [_outcome_str(x) for x in v] if isinstance(v, list | tuple) else v

    def applies(self, route: Route, key: str, prompt: str) -> bool:
        if self.routes is not None and route not in self.routes:
            return False
        return self.match is None or self.match in key or self.match in prompt


class FaultConfig(_StrictSettings):
    """Faults: scripted sequences first, then probabilistic rates. Deterministic given the seed."""

    rates: dict[FaultOutcome, float] = Field(default_factory=dict)
    """Probability of each outcome per attempt (sum at most 1), decided from (seed, key, attempt)."""
    scripts: list[ScriptedFault] = Field(default_factory=list)
    """Scripted sequences; the first script that applies to a request and still has an outcome for this
    attempt number decides it."""

    @field_validator("rates", mode="before")
    @classmethod
    def _numbers_ok(cls, v: Any) -> Any:
        return {_outcome_str(k): r for k, r in v.items()} if isinstance(v, dict) else v

    @model_validator(mode="after")
    def _rates_are_probabilities(self) -> FaultConfig:
        for outcome, rate in self.rates.items():
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"fault rate of {outcome} must be between 0 and 1, not {rate}")
        if sum(self.rates.values()) > 1.0 + 1e-9:
            raise ValueError("fault rates add up to more than 1")
        return self


class OverloadBursts(_StrictSettings):
    """Periodic overload: for the first `length` seconds of every `every` of the emulator's clock, every
    generation is refused with `status` (429 or 503) and a `Retry-After` until the burst ends. A fault
    of the service's capacity, not of one request: not an attempt, not billed."""

    every: float = Field(gt=0)
    length: float = Field(gt=0)
    status: Literal[429, 503] = 503

    @model_validator(mode="after")
    def _shorter_than_the_period(self) -> OverloadBursts:
        if self.length >= self.every:
            raise ValueError("an overload burst must be shorter than its period")
        return self


def parse_bursts(text: str) -> OverloadBursts:
    """`EVERY:LENGTH[:STATUS]` seconds, e.g. `60:5` or `30:2:429`."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"expected EVERY:LENGTH[:STATUS], not {text!r}")
    fields: dict[str, Any] = {"every": float(parts[0]), "length": float(parts[1])}
    if len(parts) == 3:
        fields["status"] = int(parts[2])
    return OverloadBursts(**fields)


class ServerLimits(_StrictSettings):
    """What one client can make the server hold or wait for (unbounded, a 100 MB body would be read
    whole, idle connections would exhaust file descriptors). Fixed when the server starts; see the
    README's "Limits"."""

    max_body_bytes: int = Field(default=128 * 2**20, ge=1)
    """A larger request body gets 413 and the connection is closed: at once by its Content-Length, or as
    soon as a chunked body passes it. 128 MiB: above the spec's 50 MB per file, so a 50 MB image inline in
    base64 (67 MB) or an edit's 50 MB source and 50 MB mask fit."""
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)
    """The request line and headers (h11's limit; over it, 400)."""
    header_timeout: float = Field(default=10.0, gt=0)
    """Seconds from a new connection, or from the first byte of a further request on it, to the end of
    the request's headers; then the connection is closed without an answer."""
    body_timeout: float = Field(default=120.0, gt=0)
    """Seconds from the end of the headers to the end of the body; then 408 and the connection closed."""
    idle_timeout: float = Field(default=5.0, gt=0)
    """Seconds a kept-alive connection may wait for its next request (uvicorn's `timeout_keep_alive`)."""
    max_connections: int = Field(default=1000, ge=1)
    """Open connections at most; one more is answered 503 (`Retry-After: 1`) and closed. The server
    lowers it to fit the process's file-descriptor limit (`ulimit -n`; see `server._within_descriptors`):
    352 under the common limit of 1024."""


class EmulatorSettings(BaseModel):
    """Settings of one emulator app. Immutable: change them with `model_copy(update=...)`."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    api_key: str = Field(min_length=1)
    """The only key the service routes accept."""
    seed: int = 0
    """Seeds images, response structure, probabilistic faults and (unless `signing_secret`) signatures."""
    latency: float = Field(default=0.0, ge=0.0)
    """Seconds each generation takes, slept before answering."""
    slow_seconds: float = Field(default=660.0, ge=0.0)
    """How long a `slow` fault waits before answering; the default is past the spec's 650 s timeout."""
    jpeg_rate: float = Field(default=0.25, ge=0.0, le=1.0)
    """Fraction of native and chat images returned as JPEG instead of PNG."""
    thought_image_rate: float = Field(default=0.3, ge=0.0, le=1.0)
    """Fraction of native answers that carry an intermediate `thought: true` image."""
    max_images_policy: Literal["random", "cap"] = "random"
    """`random`: deliver 1..X-Service-Max-Images images (deterministic per key); `cap`: exactly the cap."""
    faults: FaultConfig = Field(default_factory=FaultConfig)
    signing_secret: str | None = None
    """Key material of `thoughtSignature`; None derives it from `seed`, so restarts keep signatures valid."""
    render_cache_size: int = Field(default=16, ge=0)
    """Rendered images kept (LRU) so that repeated 4K renders cost nothing."""
    rpm: int | None = Field(default=None, ge=1)
    """Rate limit: generations started per rolling minute for the key; over it, 429 with `Retry-After`.
    None: no limit (the default)."""
    max_in_flight: int | None = Field(default=None, ge=1)
    """Concurrency limit: generations in flight at once for the key; over it, 429 `Retry-After: 1`."""
    overload: OverloadBursts | None = None
    """Periodic overload bursts (off by default)."""
    log_contents: bool = False
    """Keep each native request's `contents` and the model content answered in the request log (`contents`,
    `answer`): what a test compares an edit's history with. Off by default: it holds every image sent."""
    clock: Callable[[], float] = time.monotonic
    """The clock of the rate limit's window (tests pass a fake one)."""
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    """Awaited for latency and `slow`; tests can pass a recorder."""

    def public_dict(self) -> dict[str, Any]:
        """The settings as JSON, without the key, the secret, or the sleep and clock functions."""
        return self.model_dump(mode="json", exclude={"api_key", "signing_secret", "sleep", "clock"})


def parse_rate(text: str) -> tuple[str, float]:
    """Parse a `--fault` value such as `503:0.1` into (outcome, rate)."""
    outcome, sep, rate = text.partition(":")
    if not sep:
        raise ValueError(f"expected OUTCOME:RATE such as 503:0.1, not {text!r}")
    if outcome not in FAULT_OUTCOMES:
        raise ValueError(f"unknown fault outcome {outcome!r}; choose from {', '.join(FAULT_OUTCOMES)}")
    return outcome, float(rate)


def parse_script(text: str) -> ScriptedFault:
    """Parse a `--script` value such as `503,503` or `503,ok,drop@cat` (only keys/prompts with `cat`)."""
    outcomes, sep, match = text.partition("@")
    return ScriptedFault(
        outcomes=[o.strip() for o in outcomes.split(",") if o.strip()],  # type: ignore[misc]
        match=match if sep else None,
    )
