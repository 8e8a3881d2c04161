"""Which manifest field belongs to which route, and the look-alike names a user may have meant."""

from __future__ import annotations

import re
from typing import Any

from imagebatch.gateway.constants import (
    DEFAULT_ASPECT_RATIO,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_IMAGES_API_SIZE,
    DEFAULT_MAX_TOKENS,
)

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
PARAMETER_DEFAULTS: dict[str, Any] = {
    "aspect_ratio": DEFAULT_ASPECT_RATIO,
    "image_size": DEFAULT_IMAGE_SIZE,
    "size": DEFAULT_IMAGES_API_SIZE,
    "max_images": 1,
    "max_tokens": DEFAULT_MAX_TOKENS,
}
"""The request parameters' defaults, the one place they are written: the checker fills in a job's own
route's parameters from it (`route_parameters`), so a Job holds what is sent and hashed; a parameter of
another route is None in the job."""


def route_parameters(route: str, given: dict[str, Any]) -> dict[str, Any]:
    """Each request parameter of a job on `route`: its given value, else its default; None off the route."""
    taken = ROUTE_FIELDS[route]
    return {f: given.get(f, default) if f in taken else None for f, default in PARAMETER_DEFAULTS.items()}


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


METADATA_PREFIX = "meta."
"""A column or key whose name starts with this (in any case: `meta.size`, `Meta.Size`) is metadata on
purpose, never taken for a misspelt field: the way to keep a column whose name is close to a field's.
The name is kept whole, prefix included (`{meta.size}` in a prompt, `meta.size` in results.csv)."""

NOT_TYPOS: frozenset[str] = frozenset(
    {"mode", "modal", "motel", "mount", "court", "counter", "country", "county", "amount", "router"}
)
"""Common metadata names (normalised: lower case, letters and digits) one edit from a field name, which a
catalog holds for their own sake: kept as metadata without a word."""


def is_declared_metadata(name: str) -> bool:
    """Whether `name` is declared metadata by its prefix (`METADATA_PREFIX`)."""
    return name[: len(METADATA_PREFIX)].lower() == METADATA_PREFIX


def edit_distance(a: str, b: str, limit: int) -> int:
    """The Damerau-Levenshtein distance of `a` and `b` (optimal string alignment: insertions, deletions,
    substitutions, and swaps of two neighbours), or `limit + 1` when it is more than `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before: list[int] = []
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        above, row = row, [i] + [0] * len(b)
        for j, cb in enumerate(b, start=1):
            cost = ca != cb
            row[j] = min(above[j] + 1, row[j - 1] + 1, above[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], before[j - 2] + 1)
        if min(row) > limit:
            return limit + 1
        before = above
    return min(row[-1], limit + 1)


def _reach(field: str) -> int:
    """How many edits from a field's (normalised) name a column may be and still be taken for it: none for
    a short name (`size` is one edit from `site`, `mask` from `task`), one up to 7 letters, two beyond."""
    return 0 if len(field) <= 4 else 1 if len(field) <= 7 else 2


# A column that is almost a field name would otherwise be kept, silently, as metadata, and the job would
# run with a default instead of what the user wrote (`aspect_ration`: 1:1 for the 4:5 asked).
def _lookalikes() -> dict[str, str]:
    table = {"n": "count", "refs": "reference_images", "references": "reference_images"}
    for field in KNOWN_FIELDS:
        for variant in (_norm(field), _norm(field) + "s", _norm(field).removesuffix("s")):
            table.setdefault(variant, field)
    return table


_LOOKALIKES = _lookalikes()
_NORMS = tuple((_norm(field), field) for field in KNOWN_FIELDS)


def nearest_name(name: str, candidates: tuple[tuple[str, str], ...]) -> str | None:
    """The candidate (normalised, name) `name` is within its reach of (see `_reach`), the nearest first."""
    norm = _norm(name)
    if not norm or norm in NOT_TYPOS:
        return None
    best: tuple[int, str] | None = None
    for target, candidate in candidates:
        if (reach := _reach(target)) and (d := edit_distance(norm, target, reach)) <= reach:
            if best is None or d < best[0]:
                best = (d, candidate)
    return best[1] if best else None


def looks_like_field(name: str) -> str | None:
    """The field a non-field column name was probably meant to be (`Aspect Ratio`, `aspect_ration` ->
    aspect_ratio); None for a field, a declared metadata name (`meta.` prefix) or any other name."""
    if name in KNOWN_FIELDS or is_declared_metadata(name):
        return None
    return _LOOKALIKES.get(_norm(name)) or nearest_name(name, _NORMS)


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
