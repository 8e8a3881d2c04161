"""One manifest row (of any format) as a typed input model, and pydantic's errors said in the manifest's
terms (field, message, hint)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
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
    DEFAULT_IMAGES_API_SIZE,
    IMAGE_SIZES,
    IMAGES_API_SIZES,
    MAX_IMAGES_HEADER,
    MAX_IMAGES_MAX,
    MAX_IMAGES_MIN,
)
from imagebatch.gateway.models import check_image_size

from .fields import nearest_name
from .models import (
    ID_PATTERN,
    MAX_COUNT,
    WINDOWS_RESERVED_NAMES,
    id_fault,
    is_safe_id,
)

# --- the input model: one row of any format, types checked -------------------------------------------


def _custom(kind: str, message: str, hint: str | None = None) -> PydanticCustomError:
    # The message travels in the context rather than the template, so braces in user values are inert.
    return PydanticCustomError(kind, "{msg}", {"msg": message, "hint": hint})


def clean_text(value: Any) -> Any:
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


Text = Annotated[str | None, BeforeValidator(clean_text)]
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


_TURN_KEYS = (("prompt", "prompt"), ("referenceimages", "reference_images"))


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
        meant = nearest_name(str(loc[-1]), _TURN_KEYS)
        hint = f"did you mean {meant!r}?" if meant else None
        return FieldIssue(top, path, "a turn has only prompt and reference_images", hint)
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
    """Drop absent values (None, empty or blank text) and clean the text of the rest (see `clean_text`)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, str):  # `clean_text`, inlined: it runs for every cell of every row
            if "\r" in value:
                value = value.replace("\r\n", "\n").replace("\r", "\n")
            value = value.strip() or None
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
