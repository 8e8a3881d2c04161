"""One typed model of an export's options (`ExportOptions`): the command's flags (`cli.export`), the
`export_deliverables` flow's `options` parameter and `delivery.export.export` all read it, so that each
option's type, default, bounds and description are written once (Prefect's UI shows the descriptions).

Where the export goes (OUT, DEST) and how it is run (the pool, the progress line) are not options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from imagebatch.delivery.convert import DEFAULT_BACKGROUND, Conversion, Format
from imagebatch.delivery.naming import DEFAULT_TEMPLATE


@dataclass(frozen=True)
class Flag:
    """How a field appears on the command line besides its name (`--max-side` for `max_side`)."""

    metavar: str | None = None
    flag: str | None = None


class ExportOptions(BaseModel):
    """What an export makes of OUT's images: their names, which images, and the deliverables' format."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str | None, Flag(metavar="TEMPLATE")] = Field(
        default=None,
        description="Each file's path in DEST over results.csv's columns and {variant} {n} {ext} {key12}, "
        f"e.g. '{{sku}}/{{colour}}.{{ext}}'. Default: '{DEFAULT_TEMPLATE}'.",
    )
    approved_only: bool = Field(
        default=False,
        description="Only images whose last review decision is approved; off: every succeeded image.",
    )
    format: Format | None = Field(
        default=None, description="The deliverables' format. Default: each image's own."
    )
    max_side: Annotated[int | None, Flag(metavar="N")] = Field(
        default=None, ge=1, description="Shrink images longer than N px (never enlarged)."
    )
    quality: Annotated[int | None, Flag(metavar="Q")] = Field(
        default=None,
        ge=1,
        le=100,
        description="JPEG/WebP quality 1-100. Default: 90 when an image is re-encoded.",
    )
    background: Annotated[str, Flag(metavar="COLOR")] = Field(
        default=DEFAULT_BACKGROUND,
        description="What transparency is flattened onto for JPEG, and the canvas's colour: a name, "
        "#rrggbb or rgb(r,g,b).",
    )
    canvas: Annotated[str | None, Flag(metavar="WxH")] = Field(
        default=None,
        description="Every image exactly W x H px: shrunk to fit if larger (never enlarged), centred on "
        "the background (at most 100 megapixels).",
    )
    slug: bool = Field(
        default=False, description="Clean names: each value lower-case, spaces (and '/') to '-'."
    )
    prune: bool = Field(
        default=False,
        description="Remove an earlier export's files this one does not deliver (off: move them to "
        "DEST/.superseded/DATE/); one changed since export wrote it is moved there all the same.",
    )
    overwrite: bool = Field(
        default=False,
        description="Replace a file in DEST with other bytes that no earlier export wrote, keeping it in "
        "DEST/.superseded/DATE/ (off: refuse).",
    )
    workers: Annotated[int | None, Flag(metavar="N")] = Field(
        default=None, ge=1, description="Images converted at once. Default: every core."
    )

    @model_validator(mode="after")
    def _convertible(self) -> ExportOptions:
        self.conversion()  # a ValueError naming the option (a quality for png, an unknown colour...)
        return self

    def conversion(self) -> Conversion:
        """What every deliverable is made into (`convert.Conversion`)."""
        return Conversion.from_options(self.format, self.max_side, self.quality, self.background, self.canvas)


def flag_of(name: str) -> str:
    """The command line's flag of a field: `--max-side` for `max_side`."""
    info = ExportOptions.model_fields[name]
    return flag_info(info).flag or "--" + name.replace("_", "-")


def flag_info(info: FieldInfo) -> Flag:
    return next((m for m in info.metadata if isinstance(m, Flag)), Flag())


def problem(exc: ValidationError) -> str:
    """A refusal of the options as one line naming the flag, its value and the rule: `--quality 0: from 1
    to 100`."""
    error = exc.errors()[0]
    names = [str(part) for part in error["loc"] if str(part) in ExportOptions.model_fields]
    message = str(error["msg"]).removeprefix("Value error, ")
    if not names:
        return message  # the conversion's own refusal names its option
    name, value = names[-1], error.get("input")
    bounds = {
        k: getattr(m, k)
        for m in ExportOptions.model_fields[name].metadata
        for k in ("ge", "le")
        if getattr(m, k, None) is not None
    }
    if error["type"] in ("greater_than_equal", "less_than_equal") and "le" in bounds:
        return f"{flag_of(name)} {value}: from {bounds['ge']} to {bounds['le']}"
    if error["type"] == "greater_than_equal":
        return f"{flag_of(name)} {value}: {bounds['ge']} or more"
    return f"{flag_of(name)} {value!r}: {message}"


def from_given(values: dict[str, Any]) -> ExportOptions:
    """The options from those given (None: not given, the model's default)."""
    return ExportOptions.model_validate({k: v for k, v in values.items() if v is not None})
