"""Which manifest field belongs to which route, and the look-alike names a user may have meant."""

from __future__ import annotations

import re
from typing import Any

from .models import (
    MANIFEST_ROUTES,
)

# --- which field belongs where ----------------------------------------------------------------------

KNOWN_FIELDS: tuple[str, ...] = (
    "id", "prompt", "model", "route", "aspect_ratio", "image_size", "size", "reference_images", "mask",
    "count", "max_images", "max_tokens", "turns",
)  # fmt: skip
COMMON_FIELDS = frozenset({"id", "prompt", "model", "route", "count"})
ROUTE_FIELDS: dict[str, frozenset[str]] = {
    "native": frozenset({"aspect_ratio", "image_size", "max_images", "reference_images", "turns"}),
    "chat": frozenset({"aspect_ratio", "image_size", "max_images"}),
    "images": frozenset({"size", "reference_images", "mask"}),
    "messages": frozenset({"max_tokens"}),
    "responses": frozenset(),
}
RESULTS_ONLY_COLUMNS: tuple[str, ...] = (
    "job_id", "request_index", "turn_index", "variant", "status", "paths", "images", "width", "height",
    "mime_type", "idempotency_key", "attempts", "finish_reason", "error", "request_id",
)  # fmt: skip
"""The columns of results.csv (`work.store.RESULT_COLUMNS`) that are not manifest fields. A metadata
column of one of these names would be overwritten there by the request's own value, so it is refused at
check time (a test keeps this list equal to the store's)."""
SETTINGS: tuple[str, ...] = ("files_root",)
"""Keys of a JSON manifest's `defaults` that set the manifest, not its jobs (see `check.JobChecker`)."""
ROUTE_SPECIFIC_FIELDS: tuple[str, ...] = tuple(f for f in KNOWN_FIELDS if f not in COMMON_FIELDS)
# Where each misplaced field should have gone, said the way a user fixes it.
MISPLACED_HINTS: dict[str, str] = {
    "size": "on the native and chat routes use image_size (1K, 2K, 4K) and aspect_ratio",
    "image_size": "on the images route use size, e.g. 1024x1024 or 1536x1024",
    "aspect_ratio": "on the images route the ratio comes from size, e.g. 1536x1024 is 3:2",
    "max_images": "the images route delivers one image per request; use count for more",
    "reference_images": "reference-image edits run on the native or images route",
    "mask": "masked edits run on the images route (model compat-image-2)",
    "turns": "edit chains run on the native route",
    "max_tokens": "max_tokens is for the messages route",
}


def routes_for(field: str) -> list[str]:
    """The manifest routes on which `field` may be given."""
    return [r for r in MANIFEST_ROUTES if field in COMMON_FIELDS or field in ROUTE_FIELDS[r]]


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


# A column that is almost a field name would otherwise be kept, silently, as metadata, and the job would
# run with a default instead of what the user wrote. Only near-certain look-alikes are listed, because a
# false alarm would block a valid manifest.
def _lookalikes() -> dict[str, str]:
    table = {"n": "count", "refs": "reference_images", "references": "reference_images"}
    for field in KNOWN_FIELDS:
        for variant in (_norm(field), _norm(field) + "s", _norm(field).removesuffix("s")):
            table.setdefault(variant, field)
    return table


_LOOKALIKES = _lookalikes()


def looks_like_field(name: str) -> str | None:
    """The field a non-field column name was probably meant to be (`Aspect Ratio` -> aspect_ratio)."""
    if name in KNOWN_FIELDS:
        return None
    return _LOOKALIKES.get(_norm(name))


# --- names and values that cannot be metadata ----------------------------------------------------------

NUL_MESSAGE = "holds a NUL character (\\0), which no field may hold"
NUL_HINT = "remove it; broken exports often leave one"


def has_nul(value: Any) -> bool:
    """Whether a row's value (text, or a JSON list or object, at most `read.MAX_DEPTH` deep) holds a NUL."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(has_nul(v) for v in value)
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    return False


def shown(name: str) -> str:
    """A column or key name as a problem shows it (a NUL character as `\\0`)."""
    return name.replace("\x00", "\\0")


def name_fault(name: str) -> tuple[str, str | None] | None:
    """Why a column or key that is not a field cannot be metadata, or None when it can."""
    if "\x00" in name:
        return "the name " + NUL_MESSAGE, NUL_HINT
    if name in RESULTS_ONLY_COLUMNS:
        return (
            f"{name!r} is also a column of results.csv (each request's own {name}), where this metadata "
            "would be lost",
            f"rename the column, e.g. to 'source_{name}'",
        )
    if name in SETTINGS:
        where = "a JSON manifest's defaults, or --files-root"
        return f"{name} is set for the whole manifest ({where}), not per job", None
    return None
