"""The manifest's field reference: one entry per field (its type, default and rules), written once here.

docs/gen_reference.py renders it into docs/reference/manifest-fields.md, with the routes each field is
taken on read from `fields.routes_for` and the numbers read from the constants the checker enforces, so
the manual cannot say something other than what `imagebatch validate` checks (tests/test_docs_reference.py
compares the page with a fresh rendering).
"""

from __future__ import annotations

from dataclasses import dataclass

from imagebatch.gateway.constants import (
    ASPECT_RATIOS,
    COMPAT_IMAGE_MODEL,
    DEFAULT_ASPECT_RATIO,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_IMAGES_API_SIZE,
    DEFAULT_MAX_TOKENS,
    DEFAULT_NATIVE_MODEL,
    IMAGE_SIZES,
    IMAGES_API_SIZES,
    MAX_IMAGES_HEADER,
    MAX_IMAGES_MAX,
    MAX_IMAGES_MIN,
    MAX_UPLOAD_BYTES,
    NATIVE_MODELS,
)

from .fields import METADATA_PREFIX, NOT_TYPOS, RESULTS_ONLY_COLUMNS, SETTINGS, routes_for
from .models import ID_PATTERN, MANIFEST_ROUTES, MAX_COUNT
from .read import MAX_DEPTH


@dataclass(frozen=True)
class FieldDoc:
    """One manifest field as a user reads it: a CSV column or a JSON key of the same name."""

    name: str
    type: str
    """What the cell or key holds, e.g. "text", "integer", "paths"."""
    default: str
    """What an empty cell or a missing key means ("required" when there is none)."""
    rules: str
    """What is accepted, in a sentence or two of Markdown."""

    @property
    def routes(self) -> list[str]:
        """The routes on which the field may be given (elsewhere it is refused with a hint)."""
        return routes_for(self.name)


def _codes(values: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{v}`" for v in values)


def _ratios() -> str:
    """Each set of ratios with the models that take it (`native-image-pro`: 1:1, ...)."""
    models: dict[tuple[str, ...], list[str]] = {}
    for model, ratios in ASPECT_RATIOS.items():
        models.setdefault(ratios, []).append(model)
    return "; ".join(f"{_codes(names)}: {_codes(ratios)}" for ratios, names in models.items())


FIELDS: tuple[FieldDoc, ...] = (
    FieldDoc(
        "id",
        "text",
        "required",
        f"Unique in the manifest and safe as a file name: `{ID_PATTERN.pattern}`. Ids equal but for case are "
        "refused (their files would collide on a case-insensitive file system), and so are Windows device "
        "names (`CON`, `PRN`, `AUX`, `NUL`, `COM1`-`COM9`, `LPT1`-`LPT9`, in any case, with or without an "
        "extension: `nul.txt`) and ids ending in `.`. Outputs go to `images/<id>/`.",
    ),
    FieldDoc(
        "prompt",
        "text (a template)",
        "required",
        "The instruction. May name other columns of its row as `{column}` "
        "(`Studio photo of {product_name} in {colour}`); `{{` and `}}` are literal braces. Line endings "
        "become `\\n` and outer whitespace is stripped before it is sent.",
    ),
    FieldDoc(
        "model",
        "text",
        f"`{DEFAULT_NATIVE_MODEL}` (`{COMPAT_IMAGE_MODEL}` on the images route)",
        f"An image model: {_codes(NATIVE_MODELS)} (native and chat routes) or `{COMPAT_IMAGE_MODEL}` "
        "(images route); any model id on the text routes, which need one.",
    ),
    FieldDoc(
        "route",
        "text",
        "from the model",
        f"One of {_codes(MANIFEST_ROUTES)}. Without it a native model means `native` and "
        f"`{COMPAT_IMAGE_MODEL}` means `images`; any other model needs a route. `images` is the generations "
        "route, or the edits route when the job has a reference image.",
    ),
    FieldDoc(
        "aspect_ratio",
        "text",
        f"`{DEFAULT_ASPECT_RATIO}`",
        f"The model's ratios: {_ratios()}. An empty cell and an explicit `{DEFAULT_ASPECT_RATIO}` give the "
        "same key.",
    ),
    FieldDoc(
        "image_size",
        "text",
        f"`{DEFAULT_IMAGE_SIZE}`",
        f"{_codes(IMAGE_SIZES)}, case-sensitive (`1k` is refused with a hint).",
    ),
    FieldDoc(
        "size",
        "text",
        f"`{DEFAULT_IMAGES_API_SIZE}`",
        f"{_codes(list(IMAGES_API_SIZES))}.",
    ),
    FieldDoc(
        "reference_images",
        "paths",
        "none",
        "Images to edit or draw from: paths relative to the manifest's folder (`;`-separated in a CSV cell, "
        "a list in JSON), or objects of the manifest's bucket. Each a regular PNG or JPEG file under "
        f"{MAX_UPLOAD_BYTES:,} bytes, inside the files root ([Security](../security.md#files-root)).",
    ),
    FieldDoc(
        "mask",
        "path",
        "none",
        "A PNG or JPEG with alpha, of the same format and size as the first reference image: its "
        "transparent pixels mark what the edit may redraw.",
    ),
    FieldDoc(
        "count",
        "integer",
        "1",
        f"How many images: that many separate requests, each with its own idempotency key, 1 to {MAX_COUNT} "
        "(a guard against a typo, not a rule of the service: split bigger needs over several rows).",
    ),
    FieldDoc(
        "max_images",
        "integer",
        "none",
        f"Sent as `{MAX_IMAGES_HEADER}`, {MAX_IMAGES_MIN} to {MAX_IMAGES_MAX}: the most images one answer "
        "may hold (it caps, it does not guarantee).",
    ),
    FieldDoc("max_tokens", "integer", str(DEFAULT_MAX_TOKENS), "The longest reply, in tokens."),
    FieldDoc(
        "turns",
        "list (JSON only)",
        "none",
        "Follow-up edit instructions run in order as a multi-turn edit, each a string or "
        '`{"prompt": ..., "reference_images": [...]}`. Each turn is checked on its own, its problems named '
        "`turns[2]`, `turns[0].reference_images`.",
    ),
)
"""Every manifest field, in the order `fields.KNOWN_FIELDS` lists them (a test keeps the two equal)."""

METADATA = (
    "Any other column or key is metadata: kept as text and carried into `results.csv` (and usable as "
    "`{column}` in a prompt and in an export's file names). A name that is a near miss of a field is "
    "refused rather than kept, so a job never runs with a default instead of what the row asked for: "
    "another case or separator (`Aspect Ratio`, `imageSize`), a plural, or a typo within "
    "one edit (`promt`, `modle`) of a field of 5 to 7 letters and two edits (`aspect_ration`, `image_sise`) "
    "of a longer one (letters and digits compared, a swap of two neighbours counted as one edit). A "
    f"metadata name meant as it is starts with `{METADATA_PREFIX}` (`{METADATA_PREFIX}image_sise`, in "
    "any case), in every format; it is kept whole, prefix included. Common catalog words near a field "
    f"({_codes(sorted(NOT_TYPOS))}) are metadata as they are. A name that is also a column of "
    f"`results.csv` is refused, as its values would be lost there: {_codes(RESULTS_ONLY_COLUMNS)} "
    "(rename it, e.g. `source_status`). No field, value or name may hold a NUL character."
)

JSON_SETTINGS = (
    f"A JSON manifest's `defaults` fill in what a job leaves out; a route's field (say `image_size`) only "
    "reaches the jobs whose route takes it, so one `defaults` object serves a mixed manifest. "
    f"{_codes(SETTINGS)} in `defaults` is a setting of the manifest, not of its jobs: a folder or a list of "
    "folders, relative to the manifest's folder, that can only narrow where its files come from. A JSON "
    f"document (or a JSON Lines line) nests at most {MAX_DEPTH} levels."
)
