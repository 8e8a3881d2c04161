"""What the client hands back: the results of a call, and the events of each attempt for an observer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from .constants import Route

# --- what the caller gets back -----------------------------------------------------------------------


@dataclass(frozen=True)
class GeneratedImage:
    """One final image, its type and size read from its bytes (not from what the response declared)."""

    data: bytes
    mime_type: str
    width: int
    height: int


@dataclass(frozen=True)
class ImageResult:
    """A generation that delivered one or more final images."""

    images: list[GeneratedImage]
    text: str | None = None
    finish_reason: str | None = None
    prompt_feedback: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    request_id: str | None = None
    attempts: int = 1
    model_content: dict[str, Any] | None = None
    """Native route: the candidate's complete `content`, to send back unaltered in an edit history."""


@dataclass(frozen=True)
class NoImageResult:
    """A 200 answer that carries no final image (safety, refusal): what the service said instead."""

    text: str | None = None
    finish_reason: str | None = None
    prompt_feedback: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    request_id: str | None = None
    attempts: int = 1
    model_content: dict[str, Any] | None = None


@dataclass(frozen=True)
class TextResult:
    """The answer of a text relay route: its text, usage, and the whole body as returned."""

    text: str
    raw: dict[str, Any]
    usage: dict[str, Any] | None = None
    request_id: str | None = None
    attempts: int = 1


GenerationResult = ImageResult | NoImageResult


@dataclass(frozen=True)
class ImageUpload:
    """An input image (a reference image or a mask): its bytes, read once by the caller, and its type."""

    data: bytes
    filename: str = "image.png"
    mime_type: str = "image/png"


# --- attempt reporting ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptStarted:
    """Reported before an attempt is sent."""

    route: Route
    model: str
    idempotency_key: str
    attempt: int
    started_at: datetime


@dataclass(frozen=True)
class AttemptFinished:
    """Reported after an attempt returned (or failed to)."""

    route: Route
    model: str
    idempotency_key: str
    attempt: int
    started_at: datetime
    duration: float
    status: int | None
    """HTTP status, or None when no answer came back."""
    outcome: Literal["ok", "error", "no_answer", "not_sent"]
    request_id: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    retry_in: float | None = None
    """The wait before the next attempt, or None when this was the last."""
    images: int = 0
    usage: dict[str, Any] | None = None


AttemptEvent = AttemptStarted | AttemptFinished


class AttemptObserver(Protocol):
    def __call__(self, event: AttemptEvent, /) -> None: ...
