"""Checking raw manifest rows against the spec and the files on disk, and turning good rows into Jobs.

The spec's value sets and rules are not restated here: they come from `imagebatch.gateway.constants` and
`imagebatch.gateway.models`, the one table the client and the emulator also use. What this module adds is
what only a manifest has: which field belongs to which route, defaults, templates, ids and files.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from imagebatch.gateway.constants import (
    ASPECT_RATIOS,
    COMPAT_IMAGE_MODEL,
    DEFAULT_ASPECT_RATIO,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_IMAGES_API_SIZE,
    DEFAULT_MAX_TOKENS,
    DEFAULT_NATIVE_MODEL,
    IMAGE_MODELS,
    IMAGE_SIZES,
    IMAGES_API_SIZES,
    MAX_IMAGES_HEADER,
    MAX_IMAGES_MAX,
    MAX_IMAGES_MIN,
    MAX_UPLOAD_BYTES,
    NATIVE_MODELS,
)
from imagebatch.gateway.imagefile import ImageInfo, NotAnImageError, inspect_image, mask_problems
from imagebatch.gateway.models import check_aspect_ratio, check_image_size, check_text_model

from .manifest_models import (
    ID_PATTERN,
    MANIFEST_ROUTES,
    MAX_COUNT,
    MAX_NATIVE_IMAGE_BYTES,
    WINDOWS_RESERVED_NAMES,
    Job,
    Location,
    Problem,
    Turn,
    id_fault,
    is_safe_id,
)
from .manifest_read import RawManifest, RawRow

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
ROUTE_SPECIFIC_FIELDS: tuple[str, ...] = tuple(f for f in KNOWN_FIELDS if f not in COMMON_FIELDS)
# Where each misplaced field should have gone, said the way a user fixes it.
_MISPLACED_HINTS: dict[str, str] = {
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


# --- templates ---------------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


class TemplateError(ValueError):
    """A prompt template that cannot be filled in; `issues` lists (message, hint) for every fault."""

    def __init__(self, issues: list[tuple[str, str | None]]) -> None:
        super().__init__("; ".join(m for m, _ in issues))
        self.issues = issues


def template_value(value: Any) -> str | None:
    """How a row's value reads inside a prompt; None for a list or object (not allowed)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return None


@functools.lru_cache(maxsize=1024)
def _parse_template(template: str) -> tuple[tuple[int, str, str | None], ...]:
    """Split a template once into (kind, text, hint) segments: 0 literal, 1 placeholder, 2 fault.

    Cached: a catalog's rows usually share one template, so it is parsed once, not once per row.
    """
    segments: list[tuple[int, str, str | None]] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(template):
        if match.start() > pos:
            segments.append((0, template[pos : match.start()], None))
        pos = match.end()
        token, name = match.group(0), match.group(1)
        if token in ("{{", "}}"):
            segments.append((0, token[0], None))
        elif name is None:
            segments.append((2, f"unmatched {token!r} in the prompt", "write {{ or }} for a literal brace"))
        elif not name.strip():
            segments.append((2, "empty placeholder {} in the prompt", "write {{}} for literal braces"))
        elif name.strip() == "prompt":
            segments.append((2, "the placeholder {prompt} would make the prompt contain itself", None))
        else:
            segments.append((1, name.strip(), None))
    if pos < len(template):
        segments.append((0, template[pos:], None))
    return tuple(segments)


def render_prompt(template: str, values: Mapping[str, Any]) -> str:
    """Fill `{column}` placeholders from `values`; `{{` and `}}` are literal braces.

    Raises TemplateError listing every placeholder that names no column (with the nearest column name as
    a hint), every unmatched brace and every placeholder naming a list or object.
    """
    if "{" not in template and "}" not in template:
        return template
    issues: list[tuple[str, str | None]] = []
    parts: list[str] = []
    for kind, text, hint in _parse_template(template):
        if kind == 0:
            parts.append(text)
        elif kind == 2:
            issues.append((text, hint))
        elif text not in values:
            close = difflib.get_close_matches(text, [str(k) for k in values], n=1, cutoff=0.6)
            hint = f"did you mean {{{close[0]}}}?" if close else "write {{ and }} for literal braces"
            issues.append((f"placeholder {{{text}}} names no column of this row", hint))
        elif (value := template_value(values[text])) is None:
            issues.append((f"placeholder {{{text}}} names a list or object, not a value", None))
        else:
            parts.append(value)
    if issues:
        raise TemplateError(issues)
    return "".join(parts)


# --- the input model: one row of any format, types checked -------------------------------------------


def _custom(kind: str, message: str, hint: str | None = None) -> PydanticCustomError:
    # The message travels in the context rather than the template, so braces in user values are inert.
    return PydanticCustomError(kind, "{msg}", {"msg": message, "hint": hint})


def _text(value: Any) -> Any:
    """Strip text and read an empty cell as absent; normalise line endings so a CSV saved on Windows and
    on Unix gives the same prompt, hence the same idempotency key."""
    if isinstance(value, str):
        if "\r" in value:
            value = value.replace("\r\n", "\n").replace("\r", "\n")
        return value.strip() or None
    return value


def _paths(value: Any) -> Any:
    """`a.png;b.png` (a CSV cell) or a JSON list -> a list of path strings."""
    if value is None:
        return []
    if isinstance(value, str):
        return [p.strip() for p in value.split(";") if p.strip()]
    if isinstance(value, list):
        return [
            p.strip() if isinstance(p, str) else p
            for p in value
            if not (isinstance(p, str) and not p.strip())
        ]
    return value


def _whole_number(name: str, low: int, high: int | None, hint_high: str | None = None) -> BeforeValidator:
    span = f"from {low} to {high}" if high is not None else f"of at least {low}"

    def parse(value: Any) -> int | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            number = int(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            raise _custom("whole_number", f"{name} must be a whole number {span}, not {value!r}")
        if number < low or (high is not None and number > high):
            hint = hint_high if high is not None and number > high else None
            raise _custom("out_of_range", f"{name} must be a whole number {span}, not {number}", hint)
        return number

    return BeforeValidator(parse)


def _turns(value: Any) -> Any:
    """None means no turns; a list is checked turn by turn in `validate_input`, never here."""
    if value is None:
        return []
    if isinstance(value, list):
        raise ValueError("turns are validated one at a time by validate_input")
    return value  # not a list: refused as such by pydantic


Text = Annotated[str | None, BeforeValidator(_text)]
# JobInput's text fields are cleaned by `clean_row` before validation (cheaper than a validator per field).
PlainText = str | None
Paths = Annotated[list[str], BeforeValidator(_paths)]


class TurnInput(BaseModel):
    """A follow-up instruction as written: an object, or just its prompt as a string."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    prompt: Text = None
    reference_images: Paths = []

    @model_validator(mode="before")
    @classmethod
    def _string_is_prompt(cls, value: Any) -> Any:
        return {"prompt": value} if isinstance(value, str) else value


class JobInput(BaseModel):
    """The fields of one job as written in any of the three formats, with their types checked.

    CSV headers and JSON keys are these names. Rules that involve two fields (route and model, ratio and
    model, a field on the wrong route) and the files on disk are checked by `JobChecker`.
    """

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    id: PlainText = None
    prompt: PlainText = None
    model: PlainText = None
    route: PlainText = None
    aspect_ratio: PlainText = None
    image_size: PlainText = None
    size: PlainText = None
    reference_images: Paths = Field(default_factory=list)
    mask: PlainText = None
    count: Annotated[
        int | None, _whole_number("count", 1, MAX_COUNT, "split bigger batches over several rows")
    ] = None
    max_images: Annotated[
        int | None,
        _whole_number(
            f"max_images ({MAX_IMAGES_HEADER})",
            MAX_IMAGES_MIN,
            MAX_IMAGES_MAX,
            "for a fixed number of images use count: one request per image",
        ),
    ] = None
    max_tokens: Annotated[int | None, _whole_number("max_tokens", 1, None)] = None
    turns: Annotated[list[TurnInput | None], BeforeValidator(_turns)] = Field(default_factory=list)
    """Filled in by `validate_input`, which checks each turn on its own so that one malformed turn does not
    hide the problems of the others; None stands for a turn too malformed to check further (reported)."""

    @field_validator("id")
    @classmethod
    def _safe_id(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not ID_PATTERN.fullmatch(value):
            safe = re.sub(r"[^A-Za-z0-9._-]+", "-", value).lstrip("-._")[:128].rstrip(".")
            raise _custom(
                "unsafe_id",
                f"id {value!r} is not safe as a file name: use letters, digits, '.', '_' and '-', "
                "starting with a letter or digit, at most 128 characters",
                f"e.g. {safe!r}" if safe and is_safe_id(safe) else None,
            )
        if (fault := id_fault(value)) is not None:
            stem, dot, rest = value.rstrip(".").partition(".")
            safe = f"{stem}_{dot}{rest}" if stem.upper() in WINDOWS_RESERVED_NAMES else stem + dot + rest
            raise _custom(
                "unsafe_id",
                f"id {value!r} is not safe as a file or folder name on Windows: {fault}",
                f"e.g. {safe!r}" if is_safe_id(safe) else None,
            )
        return value

    @field_validator("image_size")
    @classmethod
    def _image_size(cls, value: str | None) -> str | None:
        try:
            return check_image_size(value)
        except PydanticCustomError as exc:
            upper = (value or "").upper()
            raise _custom(
                "image_size", exc.message(), f"did you mean {upper!r}?" if upper in IMAGE_SIZES else None
            ) from None

    @field_validator("size")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is None or value in IMAGES_API_SIZES:
            return value
        guess = re.sub("\\s*[xX*\u00d7]\\s*", "x", value.strip().lower())
        if guess in IMAGES_API_SIZES:
            hint: str | None = f"did you mean {guess!r}?"
        elif value.upper() in IMAGE_SIZES:
            hint = "1K, 2K and 4K are image_size values of the native and chat routes; "
            hint += f"the images route takes a pixel size such as {DEFAULT_IMAGES_API_SIZE}"
        else:
            hint = None
        raise _custom("size", f"size must be one of {', '.join(IMAGES_API_SIZES)}, not {value!r}", hint)


@dataclass(frozen=True, slots=True)
class FieldIssue:
    top: str
    """The top-level field at fault."""
    field: str
    """The field path as shown, e.g. `turns[1].prompt`."""
    message: str
    hint: str | None = None


_TYPE_MESSAGES = {
    "string_type": "must be text",
    "list_type": "must be a list",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
}


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith("function-"):
            out += f".{part}" if out else str(part)
    return out


def _issue(err: Any, prefix: tuple[Any, ...] = ()) -> FieldIssue:
    """A pydantic error as a FieldIssue; `prefix` locates a turn (`("turns", 2)`) validated on its own.

    The `top` of a turn's issue is the turn's own field (`turns[2].prompt`), or the turn (`turns[2]`), so
    that the turn's other fields and the other turns are still checked.
    """
    loc = prefix + tuple(err["loc"])
    path = _field_path(loc)
    top = _field_path(loc[:3]) if prefix else str(loc[0])
    ctx = err.get("ctx") or {}
    if "msg" in ctx:
        return FieldIssue(top, path, ctx["msg"], ctx.get("hint"))
    if err["type"] == "extra_forbidden" and prefix:
        return FieldIssue(top, path, "a turn has only prompt and reference_images")
    message = _TYPE_MESSAGES.get(err["type"], err["msg"])
    if err["type"] in ("model_type", "model_attributes_type") and prefix and len(loc) == 2:
        message = "each turn must be an object with a prompt, or a string"
    return FieldIssue(top, path, message)


def validate_turn(index: int, value: Any) -> tuple[TurnInput | None, list[FieldIssue]]:
    """Type-check one turn of `turns`; issues are named `turns[i]` or `turns[i].field`.

    A turn with faulty fields is validated again without them, so its other fields are still checked;
    a turn that is not an object or a string gives None.
    """
    try:
        return TurnInput.model_validate(value), []
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    issues = [_issue(err, ("turns", index)) for err in errors]
    if not isinstance(value, dict) or any(not err["loc"] for err in errors):
        return None, issues
    bad = {err["loc"][0] for err in errors}
    try:
        return TurnInput.model_validate({k: v for k, v in value.items() if k not in bad}), issues
    except ValidationError:  # pragma: no cover - the faulty keys are gone
        return None, issues


def clean_row(data: Mapping[str, Any]) -> dict[str, Any]:
    """Drop absent values (None, empty or blank text) and clean the text of the rest (see `_text`)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, str):
            value = _text(value)
        if value is not None:
            out[key] = value
    return out


def validate_input(data: Mapping[str, Any]) -> tuple[JobInput, list[FieldIssue]]:
    """Type-check the known fields of one row, reporting every faulty field.

    On failure the row is validated again without its faulty fields, so the other checks still see the
    fields that are fine (pydantic gives all-or-nothing models). A list of turns is checked turn by turn
    (`validate_turn`): a malformed turn becomes None in `turns` and the other turns are kept, so their
    problems (a prompt placeholder, a missing file) are reported too.
    """
    data = clean_row(data)
    turns: list[TurnInput | None] | None = None
    issues: list[FieldIssue] = []
    if isinstance(data.get("turns"), list):
        turns = []
        for index, value in enumerate(data["turns"]):
            turn, turn_issues = validate_turn(index, value)
            turns.append(turn)
            issues.extend(turn_issues)
        data = {k: v for k, v in data.items() if k != "turns"}
    try:
        inp = JobInput.model_validate(data)
    except ValidationError as exc:
        row_issues = [_issue(err) for err in exc.errors(include_url=False)]
        bad = {issue.top for issue in row_issues}
        inp = JobInput.model_validate({k: v for k, v in data.items() if k not in bad})
        issues = row_issues + issues
    if turns is not None:
        inp = inp.model_copy(update={"turns": turns})
    return inp, issues


# --- files -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileFacts:
    """What one referenced file is; read once per manifest however many rows name it."""

    path: Path
    """Resolved absolute path."""
    size: int | None = None
    """Bytes, when the file could be looked at. Limits depend on the route: see `size_fault`."""
    sha256: str | None = None
    info: ImageInfo | None = None
    error: str | None = None
    """Why the file cannot be used, or None."""
    hint: str | None = None


def _looks_like(data: bytes) -> str | None:
    kinds = {b"GIF8": "GIF", b"BM": "BMP", b"II*\x00": "TIFF", b"MM\x00*": "TIFF", b"%PDF": "PDF"}
    for magic, kind in kinds.items():
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    if data[4:12] in (b"ftypheic", b"ftypheix", b"ftypmif1", b"ftypavif"):
        return "HEIC/AVIF"
    return None


_READ_LIMIT = max(MAX_UPLOAD_BYTES, MAX_NATIVE_IMAGE_BYTES)
_SIZE_HINT = "downscale or recompress it"


def size_fault(size: int | None, route: str | None) -> str | None:
    """Why a file of `size` bytes cannot be sent on `route` (a manifest route, None when unknown), or None.

    On the images route the limit is the service's ("each under 50 MB", the edits route). The spec shows
    no limit for inline images on the native route: there the limit is imagebatch's own guard,
    `MAX_NATIVE_IMAGE_BYTES`, and the message says so.
    """
    if size is None:
        return None
    if route == "images":
        if size < MAX_UPLOAD_BYTES:
            return None
        return (
            f"the file is {size:,} bytes; files must be under {MAX_UPLOAD_BYTES:,} bytes on the images "
            "route (the service's limit)"
        )
    if route == "native":
        if size < MAX_NATIVE_IMAGE_BYTES:
            return None
        return (
            f"the file is {size:,} bytes; reference images must be under {MAX_NATIVE_IMAGE_BYTES:,} bytes "
            "on the native route (imagebatch's own guard: the spec gives no limit for inline images there)"
        )
    limit = min(MAX_UPLOAD_BYTES, MAX_NATIVE_IMAGE_BYTES)
    if size < limit:
        return None
    return (
        f"the file is {size:,} bytes; files must be under {limit:,} bytes (the service's limit on the "
        "images route, imagebatch's own guard on the native route)"
    )


class FileChecker:
    """Inspects referenced files, each distinct file once (cached by the text and by resolved path)."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self._by_text: dict[str, FileFacts] = {}
        self._by_path: dict[Path, FileFacts] = {}
        self._listings: dict[Path, list[str]] = {}
        self.reads = 0
        """How many files were read (for tests of the cache)."""

    def check(self, text: str) -> FileFacts:
        facts = self._by_text.get(text)
        if facts is None:
            # Backslashes: a manifest written on Windows must resolve the same way everywhere.
            path = Path(os.path.normpath(self.base_dir / Path(text.replace("\\", "/")).expanduser()))
            path = path.resolve()
            facts = self._by_path.get(path)
            if facts is None:
                facts = self._by_path[path] = self._inspect(path)
            self._by_text[text] = facts
        return facts

    def _inspect(self, path: Path) -> FileFacts:
        try:
            st = path.stat()
        except FileNotFoundError:
            return FileFacts(path, error=f"file not found (looked for {path})", hint=self._nearby(path))
        except OSError as exc:
            return FileFacts(path, error=f"cannot read the file: {exc.strerror}")
        if stat.S_ISDIR(st.st_mode):
            return FileFacts(path, error="is a folder, not a file")
        # Size first, from stat: a 4 GB file named by mistake must not be read just to be refused. The
        # route's own limit is applied by `size_fault`; this is only the most any route takes.
        if st.st_size >= _READ_LIMIT:
            return FileFacts(
                path,
                size=st.st_size,
                error=f"the file is {st.st_size:,} bytes; each file must be under {_READ_LIMIT:,} bytes",
                hint=_SIZE_HINT,
            )
        try:
            data = path.read_bytes()
        except OSError as exc:
            return FileFacts(path, error=f"cannot read the file: {exc.strerror}")
        self.reads += 1
        try:
            info = inspect_image(data)
        except NotAnImageError as exc:
            kind = _looks_like(data)
            hint = f"it looks like a {kind} file; convert it to PNG or JPEG" if kind else None
            return FileFacts(path, error=str(exc), hint=hint)
        return FileFacts(path, size=len(data), sha256=hashlib.sha256(data).hexdigest(), info=info)

    def _nearby(self, path: Path) -> str | None:
        parent = path.parent
        if parent not in self._listings:
            try:
                self._listings[parent] = sorted(os.listdir(parent))
            except OSError:
                self._listings[parent] = []
        close = difflib.get_close_matches(path.name, self._listings[parent], n=1, cutoff=0.6)
        return f"did you mean {close[0]!r}?" if close else None


# --- the checker -------------------------------------------------------------------------------------


def _ratio_hint(model: str, ratio: str) -> str | None:
    supported = ASPECT_RATIOS[model]
    guess = re.sub("\\s*[xX/:\u00d7]\\s*", ":", ratio.strip())
    if guess != ratio and guess in supported:
        return f"did you mean {guess!r}?"
    others = [m for m, ratios in ASPECT_RATIOS.items() if ratio in ratios]
    if others:
        return f"{ratio} is supported by {' and '.join(others)}"
    return None


def _serves(route: str, model: str | None) -> bool:
    """Whether `route` serves `model` (a text route serves any model that is not an image model)."""
    if route in ("native", "chat"):
        return model in NATIVE_MODELS
    if route == "images":
        return model == COMPAT_IMAGE_MODEL
    return model is not None and model not in IMAGE_MODELS


def _model_hint(model: str, candidates: tuple[str, ...]) -> str | None:
    close = difflib.get_close_matches(model, candidates, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


class JobChecker:
    """Checks rows one at a time, remembering what spans rows (ids, files, reported columns).

    Every problem of every row is collected in `problems`; `check` returns a Job only for a clean row.
    """

    def __init__(self, raw: RawManifest, base_dir: Path) -> None:
        self.format = raw.format
        self.files = FileChecker(base_dir)
        self.problems: list[Problem] = []
        self._ids: dict[str, tuple[str, str]] = {}  # casefolded id -> (id, location)
        self._metadata_columns: dict[str, None] = {}  # an ordered set
        self._reported_keys: set[str] = set()
        self._absent_columns: set[str] = set()
        self._defaults_raw: dict[str, Any] = {}
        self._defaults = JobInput()
        self._defaults_set: frozenset[str] = frozenset()
        if raw.format == "csv":
            self._check_header(raw)
        else:
            self._check_defaults(raw.defaults)

    @property
    def metadata_columns(self) -> list[str]:
        return list(self._metadata_columns)

    # -- whole-file checks --------------------------------------------------------------------------

    def _check_header(self, raw: RawManifest) -> None:
        columns = raw.columns or []
        line = raw.header_line
        for required in ("id", "prompt"):
            if required not in columns:
                self._absent_columns.add(required)
                self.problems.append(
                    Problem(
                        line, None, required, f"the manifest has no {required!r} column; every job needs one"
                    )
                )
        for name in columns:
            self._reported_keys.add(name)
            if name == "turns":
                self.problems.append(
                    Problem(
                        line, None, "turns", "edit chains (turns) can only be written in JSON or JSON Lines"
                    )
                )
            elif (meant := looks_like_field(name)) is not None:
                self.problems.append(self._lookalike(line, "line", None, name, meant))
            elif name not in KNOWN_FIELDS:
                self._metadata_columns[name] = None

    def _check_defaults(self, defaults: dict[str, Any]) -> None:
        self._defaults_raw = defaults
        if not defaults:
            return

        def add(field: str, message: str, hint: str | None = None) -> None:
            self.problems.append(Problem(None, None, f"defaults.{field}", message, hint))

        if "id" in defaults:
            add("id", "an id cannot be a default: every job needs its own")
        known = {k: v for k, v in defaults.items() if k in KNOWN_FIELDS and k != "id"}
        self._defaults, issues = validate_input(known)
        for issue in issues:
            add(issue.field, issue.message, issue.hint)
        # A faulty default turn (`turns[1]`) keeps all default turns from the jobs: it is reported here once.
        tops = {i.top.split("[", 1)[0] for i in issues}
        self._defaults_set = frozenset(
            f for f in KNOWN_FIELDS if f in known and f not in tops and self._given(self._defaults, f)
        )
        for key, value in defaults.items():
            if key in KNOWN_FIELDS:
                continue
            self._reported_keys.add(key)
            if (meant := looks_like_field(key)) is not None:
                self.problems.append(
                    Problem(None, None, f"defaults.{key}", *self._lookalike_text(key, meant))
                )
            elif template_value(value) is None:
                add(key, "metadata values must be text, numbers or true/false, not a list or object")
            else:
                self._metadata_columns[key] = None

    @staticmethod
    def _lookalike_text(name: str, meant: str) -> tuple[str, str]:
        return (
            f"{name!r} is not a field name, so it would be kept as metadata and not used",
            f"did you mean {meant!r}? field names are lower case with underscores",
        )

    def _lookalike(
        self, line: int | None, unit: Location, job_id: str | None, name: str, meant: str
    ) -> Problem:
        return Problem(line, job_id, name, *self._lookalike_text(name, meant), unit=unit)

    @staticmethod
    def _given(inp: JobInput, field: str) -> bool:
        value = getattr(inp, field)
        return value is not None and value != []

    # -- one row ------------------------------------------------------------------------------------

    def check(self, row: RawRow) -> Job | None:
        """Check one row; append its problems to `problems`; return its Job when it has none."""
        values = row.values
        raw_id = values.get("id")
        shown_id = raw_id.strip() or None if isinstance(raw_id, str) else template_value(raw_id) or None
        location = f"line {row.line}" if row.unit == "line" else f"job #{row.line}"
        from_defaults: set[str] = set()
        problems: list[Problem] = []

        def add(field: str | None, message: str, hint: str | None = None) -> None:
            if field in from_defaults:
                message += " (value from defaults)"
            problems.append(Problem(row.line, shown_id, field, message, hint, row.unit))

        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in values.items():
            if key in KNOWN_FIELDS:
                known[key] = value
            else:
                extra[key] = value
                if key not in self._reported_keys:
                    # JSON keys vary by job: report a look-alike once, at the first job that has it.
                    self._reported_keys.add(key)
                    if (meant := looks_like_field(key)) is not None:
                        problems.append(self._lookalike(row.line, row.unit, shown_id, key, meant))
                        continue
                    self._metadata_columns[key] = None
        if self.format == "csv":
            known.pop("turns", None)  # reported once, at the header

        inp, issues = validate_input(known)
        for issue in issues:
            add(issue.field, issue.message, issue.hint)
        bad = {issue.top for issue in issues}

        def value(field: str) -> Any:
            own = getattr(inp, field)
            if own is not None and own != []:
                return own
            if field in self._defaults_set and field not in bad:
                from_defaults.add(field)
                return getattr(self._defaults, field)
            return own

        # id
        job_id = inp.id
        if job_id is None and "id" not in bad and "id" not in self._absent_columns:
            add("id", "id is required: every job needs a unique id")
        elif job_id is not None:
            self._check_unique(job_id, location, add)

        # route and model
        route: str | None = None
        model: str | None = None
        if not {"route", "model"} & bad:
            route_given = value("route")
            if inp.model is None and inp.route is not None and not _serves(inp.route, self._defaults.model):
                # Like any route-specific default, a default model reaches only the jobs whose route serves
                # it: one defaults object can then serve a manifest mixing routes.
                model_given = None
            else:
                model_given = value("model")
            route, model = self._resolve(route_given, model_given, add)

        # route-specific fields: defaults apply only where they belong, a job's own field must belong
        given: dict[str, Any] = {}
        for field in ROUTE_SPECIFIC_FIELDS:
            if field in bad:
                continue
            if self._given(inp, field):
                if route is not None and field not in ROUTE_FIELDS[route]:
                    routes = " and ".join(routes_for(field))
                    add(
                        field,
                        f"{field} does not apply to the {route} route, only to {routes}",
                        _MISPLACED_HINTS[field],
                    )
                    continue
                given[field] = getattr(inp, field)
            elif field in self._defaults_set and route is not None and field in ROUTE_FIELDS[route]:
                from_defaults.add(field)
                given[field] = getattr(self._defaults, field)

        if route in ("native", "chat") and model is not None and "aspect_ratio" in given:
            try:
                check_aspect_ratio(model, given["aspect_ratio"])
            except PydanticCustomError as exc:
                add("aspect_ratio", exc.message(), _ratio_hint(model, given["aspect_ratio"]))

        # prompt and turns, rendered against the whole row (defaults included)
        namespace = {**self._defaults_raw, **values} if self._defaults_raw else values
        prompt = self._render(value("prompt"), "prompt", namespace, add)
        if prompt is None and value("prompt") is None and "prompt" not in bad | self._absent_columns:
            add("prompt", "prompt is required")
        turns: list[Turn] = []
        for i, turn in enumerate(given.get("turns", [])):
            field = f"turns[{i}]"
            if turn is None:
                continue  # not a turn at all: reported by validate_input
            turn_prompt = self._render(turn.prompt, f"{field}.prompt", namespace, add)
            if turn.prompt is None and f"{field}.prompt" not in bad:
                add(f"{field}.prompt", "each turn needs a prompt")
            paths, hashes = self._files(turn.reference_images, f"{field}.reference_images", add, route)
            if turn_prompt is not None:
                turns.append(Turn(prompt=turn_prompt, reference_images=paths, reference_sha256=hashes))

        # files
        refs, ref_hashes = self._files(given.get("reference_images", []), "reference_images", add, route)
        mask_path: Path | None = None
        mask_hash: str | None = None
        if "mask" in given:
            if not given.get("reference_images"):
                add("mask", "a mask needs a reference image to apply to (it applies to the first)")
            mask_facts = self._file(given["mask"], "mask", add, route)
            if mask_facts is not None:
                mask_path, mask_hash = mask_facts.path, mask_facts.sha256
                first = (
                    self.files.check(given["reference_images"][0]) if given.get("reference_images") else None
                )
                self._check_mask(mask_facts, first, add)

        metadata = self._metadata(extra, add)

        if problems:
            self.problems.extend(problems)
            return None
        if job_id is None or route is None or model is None or prompt is None:
            return None  # an absent id or prompt column, reported once at the header
        image_route = route in ("native", "chat")
        return Job(
            id=job_id,
            line=row.line,
            location=location,
            prompt=prompt,
            model=model,
            route=route,
            aspect_ratio=given.get("aspect_ratio", DEFAULT_ASPECT_RATIO) if image_route else None,
            image_size=given.get("image_size", DEFAULT_IMAGE_SIZE) if image_route else None,
            size=given.get("size", DEFAULT_IMAGES_API_SIZE) if route == "images" else None,
            reference_images=refs,
            reference_sha256=ref_hashes,
            mask=mask_path,
            mask_sha256=mask_hash,
            count=value("count") or 1,
            max_images=given.get("max_images", 1) if image_route else None,
            max_tokens=given.get("max_tokens", DEFAULT_MAX_TOKENS) if route == "messages" else None,
            turns=turns,
            metadata=metadata,
        )

    def _check_unique(self, job_id: str, location: str, add: Callable[..., None]) -> None:
        key = job_id.casefold()
        first = self._ids.get(key)
        if first is None:
            self._ids[key] = (job_id, location)
        elif first[0] == job_id:
            add("id", f"duplicate id {job_id!r}: also used on {first[1]}")
        else:
            add(
                "id",
                f"id {job_id!r} differs from {first[0]!r} ({first[1]}) only by case",
                "their file names would collide on case-insensitive file systems",
            )

    def _resolve(
        self, route: str | None, model: str | None, add: Callable[..., None]
    ) -> tuple[str | None, str | None]:
        """The job's route and model, checked against each other; None for whichever is at fault."""
        if route is not None and route not in MANIFEST_ROUTES:
            lowered = route.strip().lower()
            hint = None
            if lowered in MANIFEST_ROUTES:
                hint = f"did you mean {lowered!r}?"
            elif lowered.startswith("images"):
                hint = "use 'images': generations or edits follow from reference_images"
            add("route", f"unknown route {route!r}; routes are {', '.join(MANIFEST_ROUTES)}", hint)
            return None, None
        if model is None:
            if route in ("messages", "responses"):
                add(
                    "model",
                    f"model is required on the {route} route: a text model ID from the service's catalog",
                )
                return route, None
            # The images routes serve one model; everything else defaults to the newest native model.
            model = COMPAT_IMAGE_MODEL if route == "images" else DEFAULT_NATIVE_MODEL
        if route is None:
            if model in NATIVE_MODELS:
                return "native", model
            if model == COMPAT_IMAGE_MODEL:
                return "images", model
            hint = _model_hint(model, IMAGE_MODELS)
            if hint:
                add("model", f"unknown model {model!r}; image models are {', '.join(IMAGE_MODELS)}", hint)
            else:
                add(
                    "route",
                    f"route is required: model {model!r} is not an image model, so no route follows from it",
                    "set route to messages or responses for a text model",
                )
            return None, None
        if route in ("native", "chat") and model not in NATIVE_MODELS:
            if model == COMPAT_IMAGE_MODEL:
                add(
                    "model",
                    f"{model} is served on the images route, not on the {route} route",
                    "set route to images",
                )
            else:
                add(
                    "model",
                    f"unknown model {model!r} for the {route} route; models: {', '.join(NATIVE_MODELS)}",
                    _model_hint(model, NATIVE_MODELS),
                )
            return route, None
        if route == "images" and model != COMPAT_IMAGE_MODEL:
            if model in NATIVE_MODELS:
                add(
                    "model",
                    f"{model} is not served on the images route (the service answers unsupported_endpoint)",
                    f"use route native or chat, or model {COMPAT_IMAGE_MODEL}",
                )
            else:
                add(
                    "model",
                    f"unknown model {model!r} for the images route; it serves {COMPAT_IMAGE_MODEL}",
                    _model_hint(model, (COMPAT_IMAGE_MODEL,)),
                )
            return route, None
        if route in ("messages", "responses"):
            try:
                check_text_model(model)
            except PydanticCustomError as exc:
                add("model", f"{exc.message()}; the {route} route relays text models", "use a text model ID")
                return route, None
        return route, model

    def _render(
        self, template: str | None, field: str, namespace: Mapping[str, Any], add: Callable[..., None]
    ) -> str | None:
        if template is None:
            return None
        try:
            rendered = render_prompt(template, namespace)
        except TemplateError as exc:
            for message, hint in exc.issues:
                add(field, message, hint)
            return None
        rendered = _text(rendered)
        if rendered is None:
            add(field, "the prompt is empty once its placeholders are filled in")
        return rendered

    def _file(self, text: str, field: str, add: Callable[..., None], route: str | None) -> FileFacts | None:
        facts = self.files.check(text)
        if (too_big := size_fault(facts.size, route)) is not None:
            add(field, f"{text}: {too_big}", _SIZE_HINT)
            return None
        if facts.error is not None:
            add(field, f"{text}: {facts.error}", facts.hint)
            return None
        return facts

    def _files(
        self, texts: list[str], field: str, add: Callable[..., None], route: str | None
    ) -> tuple[list[Path], list[str]]:
        paths: list[Path] = []
        hashes: list[str] = []
        for text in texts:
            facts = self._file(text, field, add, route)
            if facts is not None:
                assert facts.sha256 is not None
                paths.append(facts.path)
                hashes.append(facts.sha256)
        return paths, hashes

    @staticmethod
    def _check_mask(mask: FileFacts, first: FileFacts | None, add: Callable[..., None]) -> None:
        assert mask.info is not None
        for message, hint in mask_problems(mask.info, first.info if first is not None else None):
            add("mask", message, hint)

    def _metadata(self, extra: Mapping[str, Any], add: Callable[..., None]) -> dict[str, str]:
        metadata: dict[str, str] = {}
        merged = {**self._defaults_raw, **extra} if self._defaults_raw else extra
        for key, raw in merged.items():
            if key in KNOWN_FIELDS or key not in self._metadata_columns:
                continue  # a field, or a look-alike reported as a problem
            text = template_value(raw)
            if text is None:
                if key in extra:
                    add(key, "metadata values must be text, numbers or true/false, not a list or object")
                continue
            metadata[key] = text
        return metadata
