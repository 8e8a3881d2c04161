"""The names of `imagebatch export`'s deliverables: a template (`--name`) over results.csv's columns,
and the checks every rendered name passes before anything is written.

A template is Python's format syntax with plain names only: `{sku}/{colour}.{ext}`,
`{job_id}/{request_index:03d}-{n}.{ext}`. A field is a column of results.csv (the manifest's metadata
columns are there, next to `job_id`, `request_index`, `turn_index`, `model`, ...) or a built-in
(`BUILTINS`); a built-in wins over a metadata column of the same name. Attribute and index lookups
(`{a.b}`, `{a[0]}`), conversions (`{a!r}`) and nested fields are refused: a template is data. A format
spec is Python's (`03d`, `>8`, `.2f`), its width and precision at most `MAX_NAME_BYTES`: a name longer
than that is refused anyway, and `{job_id:>999999999}` would be a gigabyte before the check. The `c`
type (a number as a character) is refused with the template: it makes control characters of small
numbers and overflows on large ones.

A rendered name is a relative, `/`-separated path that every common file system and object store takes
as it is: no absolute path, no `.`/`..` or empty segment, no hidden segment (one starting with `.`:
usually an empty value before an extension), no `\\ : * ? " < > |` and no control, format or separator
character (Unicode's categories Cc, Cf, Zl and Zp: U+0085, U+2028, a right-to-left mark or override, a
zero-width space; `REFUSED_CATEGORIES`), no segment that shows nothing, no segment starting with a space
or ending in a space or a dot, no Windows device name (`CON`, `nul.jpg`, `COM1`...), at most 255 bytes a
segment and 1,024 in all. A value with something in it but nothing visible (a zero-width space alone,
spaces) is refused, with `--slug` too. Two names that differ only in case or Unicode normalisation are
one name (they would be one file on macOS or Windows, or after a copy there), and a name may not be a
folder of another. A value may not hold a `/` (it would make folders the template does not ask for);
`--slug` makes every value a clean name part instead (`slug`; the invisible characters it does not turn
into `-` are refused all the same). `name_for` applies every one of these rules to one row: export and
`validate --name` both call it.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

BUILTINS = {
    "variant": "the image's variant (1 for a first sample)",
    "n": "the image's number within its row, from 1 (a row of a request for several images has several)",
    "ext": "the deliverable's extension: png, jpg or webp",
    "key12": "the first 12 hex digits of the request's idempotency key",
}
"""Template fields every export has, besides results.csv's columns."""
DEFAULT_TEMPLATE = "{job_id}/{request_index}-{turn_index}-{n}.{ext}"
"""Unique by construction: one job id per manifest row, and export delivers one variant of each
request (job, request, turn), each of its images numbered."""

_REFUSED_CHARS = re.compile(r'[\x00-\x1f\x7f\\:*?"<>|]')
_DEVICE_NAMES = re.compile(r"(?i)^(con|prn|aux|nul|com[0-9¹²³]|lpt[0-9¹²³])(\..*)?$")
REFUSED_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")
"""Unicode's control, format and line/paragraph separator characters (U+0085 is a control): invisible
or worse in a file's name: a zero-width space, a right-to-left mark, a bidirectional override that
shows `gpj.exe` as `exe.jpg`."""
MAX_SEGMENT_BYTES = 255
MAX_NAME_BYTES = 1024
_SPEC = re.compile(
    r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d*)[,_]?(?:\.(?P<precision>\d+))?(?P<type>[bcdeEfFgGnosxX%]?)",
    re.DOTALL,
)
"""Python's format spec mini-language, its width and precision caught to be bounded."""


class TemplateError(ValueError):
    """A `--name` template that cannot be used (its syntax, or a field that is not a column)."""


@dataclass(frozen=True)
class NameTemplate:
    text: str
    fields: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> NameTemplate:
        """Parse `text`, refusing what is not a plain `{name}` or `{name:spec}` field."""
        fields: list[str] = []
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise TemplateError(f"--name {text!r}: {exc}") from None
        for _, field, spec, conversion in parsed:
            if field is None:
                continue
            if field == "" or field.isdigit():
                raise TemplateError(f"--name {text!r}: every field needs a column's name, as in {{sku}}")
            if "." in field or "[" in field or conversion or (spec and "{" in spec):
                raise TemplateError(
                    f"--name {text!r}: {{{field}}} must be a plain column name (no '.', '[', '!' or "
                    "nested field)"
                )
            if spec and (why := _spec_fault(spec)):
                raise TemplateError(f"--name {text!r}: {{{field}:{spec}}} {why}")
            fields.append(field)
        if not fields:
            raise TemplateError(f"--name {text!r} has no field: every image would get the same name")
        return cls(text, tuple(dict.fromkeys(fields)))

    def unknown(self, columns: Iterable[str]) -> list[str]:
        """The fields that are neither a column of `columns` nor a built-in."""
        known = set(columns) | set(BUILTINS)
        return [f for f in self.fields if f not in known]

    def render(self, values: Mapping[str, object]) -> str:
        """The name for one image; raises TemplateError if a format spec does not fit its value."""
        try:
            return self.text.format_map(values)
        except (ValueError, TypeError, OverflowError) as exc:
            raise TemplateError(str(exc)) from None


def _spec_fault(spec: str) -> str | None:
    """Why a field's format spec cannot be used (not a format spec, or wider than a name may be)."""
    match = _SPEC.fullmatch(spec)
    if match is None:
        return "has an invalid format spec"
    if match["type"] == "c":  # a number as a character: a control character, or an OverflowError
        return "makes a character of a number (':c'), which a name cannot hold: use 'd'"
    for part in ("width", "precision"):
        if (digits := match[part]) and (len(digits) > 5 or int(digits) > MAX_NAME_BYTES):
            return f"asks for a {part} of {digits}; a name is at most {MAX_NAME_BYTES:,} bytes"
    return None


def unsafe(name: str) -> str | None:
    """Why `name` cannot be a deliverable's path, or None if it can."""
    if not name:
        return "the name is empty"
    if name.startswith("/"):
        return "an absolute path"
    if len(name.encode()) > MAX_NAME_BYTES:
        return f"longer than {MAX_NAME_BYTES} bytes"
    for segment in name.split("/"):
        if segment == "":
            return "an empty segment ('//', or a '/' at the end)"
        if segment in (".", ".."):
            return f"a {segment!r} segment"
        if bad := _REFUSED_CHARS.search(segment):
            return f"the character {bad.group()!r}, which file systems refuse"
        if bad_char := _refused_char(segment):
            return bad_char
        if not visible(segment):
            return f"the segment {segment!r} shows nothing (only spaces or invisible characters)"
        if segment.startswith("."):
            return f"the hidden segment {segment!r} (an empty value before an extension?)"
        if segment.startswith(" "):
            return f"the segment {segment!r} starts with a space"
        if segment[-1] in " .":
            return f"the segment {segment!r} ends in {segment[-1]!r}, which Windows drops"
        if _DEVICE_NAMES.match(segment):
            return f"{segment!r} is a device name on Windows"
        if len(segment.encode()) > MAX_SEGMENT_BYTES:
            return f"a segment longer than {MAX_SEGMENT_BYTES} bytes"
    return None


def _refused_char(text: str) -> str | None:
    """Why `text` holds a character of `REFUSED_CATEGORIES` (the first, by its code point), or None."""
    for ch in text:
        if unicodedata.category(ch) in REFUSED_CATEGORIES:
            what = unicodedata.name(ch, "a control character")
            return f"the invisible character U+{ord(ch):04X} ({what}), which a name may not hold"
    return None


def visible(text: str) -> bool:
    """Whether `text` shows anything: a character that is neither a space (of any width) nor one of
    `REFUSED_CATEGORIES`."""
    return any(
        not ch.isspace() and unicodedata.category(ch) not in (*REFUSED_CATEGORIES, "Zs") for ch in text
    )


def folded(name: str) -> str:
    """The form two names share if a case-insensitive or normalising file system makes them one."""
    return unicodedata.normalize("NFC", name).casefold()


def clashes(names: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """The pairs of labels whose names are one file, or where one is a folder of the other, with the
    name: `names` maps a label (the row it comes from) to its rendered name."""
    first: dict[str, str] = {}
    found = []
    for label, name in names.items():
        key = folded(name)
        if key in first:
            found.append((first[key], label, name))
        else:
            first[key] = label
    for label, name in names.items():
        parts = folded(name).split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder in first:
                found.append((first[folder], label, name))
    return found


_SLUG_DROPPED = re.compile(r'[\s/\x00-\x1f\x7f\\:*?"<>|]+')


def slug(value: str) -> str:
    """`value` as a clean name part (`--slug`): Unicode compatibility forms folded, lower case, every run
    of spaces and characters a file system refuses (or a `/`) one `-`, no `-` or `.` at either end."""
    text = unicodedata.normalize("NFKC", value).lower()
    return _SLUG_DROPPED.sub("-", text).strip("-. ")


def name_for(template: NameTemplate, values: Mapping[str, object], *, slugged: bool = False) -> str:
    """The checked name of one row: each of its fields' text values (built-ins aside) slugged when asked,
    else refused when one holds a `/`; then rendered and checked whole (`unsafe`). Raises TemplateError
    saying why."""
    values = dict(values)
    for field in template.fields:
        value = values.get(field)
        if field in BUILTINS or not isinstance(value, str):
            continue
        if value and not visible(value):
            raise TemplateError(
                f"{{{field}}} is {value!r}: nothing visible in it (a name needs something to show)"
            )
        if slugged:
            values[field] = slug(value)
        elif "/" in value:
            raise TemplateError(
                f"{{{field}}} is {value!r}: a '/' inside a value would make folders (--slug makes it '-')"
            )
    try:
        name = template.render(values)
    except TemplateError as exc:
        raise TemplateError(f"--name {template.text!r} does not fit its values: {exc}") from None
    if why := unsafe(name):
        raise TemplateError(f"its name {name!r} is refused: {why}")
    return name
