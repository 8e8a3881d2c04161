"""The data of a checked manifest: the problems found in it, its jobs and turns, and the manifest itself.

These are the shapes the rest of imagebatch consumes; `imagebatch.manifest` re-exports them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

from imagebatch.errors import Refusal
from imagebatch.gateway.constants import (
    IMAGE_ROUTES,
    MAX_UPLOAD_BYTES,
    TEXT_ROUTES,
    Route,
)
from imagebatch.storage.location import is_object_url, redact_urls


def _file_ref(value: Any) -> Any:
    """Text that is not an object's URL is a path (a `Job` built from plain data keeps its paths)."""
    return Path(value) if isinstance(value, str) and not is_object_url(value) else value


FileRef = Annotated[Path | str, BeforeValidator(_file_ref)]
"""Where a manifest, a reference image or a mask is: an absolute local path, or an object's URL
(`s3://bucket/key`, `gs://...`, `az://...`: text, since a `Path` would fold `s3://` into `s3:/`)."""

ManifestFormat = Literal["csv", "json", "jsonl", "xlsx", "parquet"]
"""The manifest formats' names as a type; each format's suffixes, reader and extra are in
`formats.FORMATS` (a test keeps the two equal)."""

MANIFEST_ROUTES: tuple[str, ...] = ("native", "chat", "images", "messages", "responses")
"""The values of a job's `route` field. `images` covers both images routes: generations without a
reference image, edits with one."""

MAX_COUNT = 100
"""Most requests one job may ask for with `count`. Not a rule of the service: a guard against a typo
(`1000` for `10`) turning into a thousand billed generations. Split bigger needs over several rows."""

MAX_NATIVE_IMAGE_BYTES = MAX_UPLOAD_BYTES
"""Largest reference image (exclusive) imagebatch sends inline on the native route. Not a rule of the
service: the spec states "each under 50 MB" only for the images edits route (`MAX_UPLOAD_BYTES`) and does
not show a maximum inline size for the native route. imagebatch's own guard, set to the same figure: a
file that big, base64-encoded into a JSON body, is a mistake rather than a reference image."""

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""The characters of a job id (match in full). An id is used in output file and folder names, so it must
also pass `id_fault` (no Windows device name, no trailing dot)."""

WINDOWS_RESERVED_NAMES: frozenset[str] = frozenset(
    {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}
)
"""Device names Windows will not use for a file or folder, in any case and with any extension
(`nul.txt` is NUL too)."""


def id_fault(job_id: str) -> str | None:
    """Why an id that matches `ID_PATTERN` is still unsafe as a file or folder name, or None when it is safe.

    Windows refuses reserved device names (`CON`, `nul.txt`: the part before the first dot is what counts)
    and drops trailing dots, so `abc.` would name the same folder as `abc`.
    """
    stem = job_id.split(".", 1)[0].upper()
    if stem in WINDOWS_RESERVED_NAMES:
        return f"{stem} is a reserved device name there, with or without an extension"
    if job_id.endswith("."):
        shared = job_id.rstrip(".")
        return f"it ends with '.', which Windows drops: its files would mix with those of {shared!r}"
    return None


def is_safe_id(job_id: str) -> bool:
    """Whether `job_id` is safe as a file and folder name on every system imagebatch runs on."""
    return ID_PATTERN.fullmatch(job_id) is not None and id_fault(job_id) is None


SAFE_ID = re.compile(
    r"(?!(?i:CON|PRN|AUX|NUL|COM[1-9]|LPT[1-9])(?:\.|\Z))[A-Za-z0-9][A-Za-z0-9._-]{0,127}(?<!\.)"
)
"""`is_safe_id` as one pattern (match in full): `ID_PATTERN`, and neither a Windows device name before the
first dot nor a trailing dot (`id_fault`). One match where a catalog's every row would otherwise take a
match and a call (a test keeps the two equal)."""


Location = Literal["line", "job", "row"]
"""How a row is named: `line 7` (CSV, JSON Lines: the physical line), `job #3` (JSON: the index in
`jobs`), `row 7` (XLSX: the spreadsheet's row number; Parquet: the record's number, from 1)."""


def location_text(unit: Location, line: int, sheet: str | None = None) -> str:
    """`line 7`, `job #3`, `row 7`, or `sheet 'Products' row 7`."""
    if unit == "job":
        return f"job #{line}"
    if unit == "row" and sheet is not None:
        return f"sheet {sheet!r} row {line}"
    return f"{unit} {line}"


_SAME_NAME_ROUTES = {
    route.value: route for route in (Route.NATIVE, Route.CHAT, Route.MESSAGES, Route.RESPONSES)
}


def wire_route(route: str, edits: bool = False) -> Route:
    """The HTTP route a manifest route reaches: `images` is `images_edits` with reference images (`edits`),
    else `images_generations` (the two serve the same models); the others keep their name."""
    if route == "images":
        return Route.IMAGES_EDITS if edits else Route.IMAGES_GENERATIONS
    return _SAME_NAME_ROUTES[route]  # a dict lookup: Route(...) is slow for 100k-job plans


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a manifest, named by its row and field, with a hint where one helps."""

    line: int | None
    """CSV: the physical line where the row starts (the header is line 1); JSON Lines: the line;
    JSON: the index of the job in `jobs`; XLSX: the spreadsheet's row (the header's included); Parquet:
    the record's number from 1 (see `unit`). None for a problem of the whole file."""
    job_id: str | None
    """The row's id, when it has one."""
    field: str | None
    """The field (column or key) at fault; None for a problem of the whole row or file."""
    message: str
    hint: str | None = None
    """A suggestion, e.g. `did you mean '1K'?`."""
    unit: Location = "line"
    """`line` (CSV, JSON Lines), `job` (a JSON manifest's job index, shown as `job #i`) or `row` (XLSX,
    Parquet)."""
    sheet: str | None = None
    """XLSX: the sheet the row is on (also named for a problem of the header row)."""

    @property
    def location(self) -> str:
        """`line 7`, `job #3`, `sheet 'Products' row 7`, or an empty string for a problem of the whole
        file."""
        if self.line is None:
            return ""
        return location_text(self.unit, self.line, self.sheet)

    def sort_key(self) -> tuple[int, int]:
        return (0 if self.line is None else 1, self.line or 0)

    def __str__(self) -> str:
        head = self.location
        if self.job_id:
            head = f"{head} (id={self.job_id})" if head else f"id={self.job_id}"
        if self.field:
            head = f"{head}, field {self.field}" if head else f"field {self.field}"
        text = f"{head}: {self.message}" if head else self.message
        # Some messages reused from the gateway already carry their hint; never say it twice.
        if self.hint and self.hint not in self.message:
            text += f" ({self.hint})"
        return redact_urls(text)  # a reference cell may hold `s3://KEY:SECRET@bucket/x.png?sig=...`


class ManifestError(Refusal):
    """A manifest that cannot be run; `problems` holds every problem found, not only the first."""

    def __init__(self, problems: list[Problem], path: Path | str | None = None) -> None:
        self.problems = sorted(problems, key=Problem.sort_key)
        self.path: FileRef | None = path if path is None or is_object_url(path) else Path(path)
        super().__init__(self._render())

    def _render(self) -> str:
        n = len(self.problems)
        where = f"{self.path}: " if self.path else ""
        head = f"{where}{n} problem{'s' if n != 1 else ''} in the manifest"
        return "\n".join([head, *(f"  {p}" for p in self.problems)])


class Turn(BaseModel):
    """A follow-up instruction in an edit chain (native route): one more billed generation."""

    model_config = ConfigDict(frozen=True)

    prompt: str
    """The rendered instruction, as sent."""
    reference_images: list[FileRef] = []
    """Extra images for this turn, as absolute paths (or objects' URLs), in order."""
    reference_sha256: list[str] = []
    """sha256 (hex) of each file in `reference_images`, read at validation time."""


class Job(BaseModel):
    """One checked row of a manifest, with defaults filled in for the fields its route uses.

    Fields that do not belong to the job's route are None (or empty), so the request a job describes is
    exactly what its fields say.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    """Unique within the manifest; safe as a file name."""
    line: int
    """Where the row is: see `Problem.line`."""
    location: str
    """`line 7` or `job #3`, for messages."""
    prompt: str
    """The rendered prompt (placeholders filled in): what is sent and hashed."""
    model: str
    route: str
    """The manifest route: `native`, `chat`, `images`, `messages` or `responses` (see `wire_route`)."""
    aspect_ratio: str | None = None
    """Native and chat: the ratio (default `1:1`)."""
    image_size: str | None = None
    """Native and chat: `1K`, `2K` or `4K` (default `1K`)."""
    size: str | None = None
    """Images route: one of the Images API sizes (default `1024x1024`)."""
    reference_images: list[FileRef] = []
    """Native and images routes: absolute paths (or objects' URLs), in order."""
    reference_sha256: list[str] = []
    """sha256 (hex) of each reference image's bytes, read at validation time."""
    mask: FileRef | None = None
    """Images route: a PNG/JPEG with alpha, same format and size as the first reference image."""
    mask_sha256: str | None = None
    count: int = 1
    """How many separate requests (each its own idempotency key)."""
    max_images: int | None = None
    """Native and chat: `X-Service-Max-Images`, 1 to 4 (default 1)."""
    max_tokens: int | None = None
    """Messages route: default 1024."""
    turns: list[Turn] = []
    """Native route: follow-up edit instructions, run in order after the prompt."""
    metadata: dict[str, str] = {}
    """Every other column of the row, carried into the results; never part of the idempotency key."""

    @property
    def wire_route(self) -> Route:
        """The HTTP route each request of this job uses."""
        return wire_route(self.route, edits=bool(self.reference_images))

    @property
    def images_per_request(self) -> int:
        """The most images one request of this job can deliver (and be billed for)."""
        route = self.wire_route
        if route in TEXT_ROUTES:
            return 0
        if route in (Route.NATIVE, Route.CHAT):
            return self.max_images or 1
        assert route in IMAGE_ROUTES
        return 1


_JOB_FIELDS = frozenset(Job.model_fields)
_new_job = Job.__new__
_set = object.__setattr__


def checked_job(values: dict[str, Any]) -> Job:
    """A Job of `values` that the checker has already checked, every field given (`values` is kept).

    What `Job.model_construct(fields_set, **values)` makes, at a tenth of its cost (0.6 us, not 6.7, a
    job): with every field given and checked there are no defaults to fill and nothing to validate, and
    all the jobs share one fields-set (validating again would make a 728-byte set per instance, 73 MB
    for a 100,000-row plan). A test keeps the two equal.
    """
    assert values.keys() == _JOB_FIELDS, sorted(values.keys() ^ _JOB_FIELDS)
    return job_of(values)


def job_of(values: dict[str, Any]) -> Job:
    """The Job whose fields' values are `values` (kept), as `checked_job` makes it, taken as they are: a
    job's own `__dict__` read back (`spool`)."""
    job = _new_job(Job)
    _set(job, "__dict__", values)
    _set(job, "__pydantic_fields_set__", _JOB_FIELDS)
    _set(job, "__pydantic_extra__", None)
    _set(job, "__pydantic_private__", None)
    return job


class Manifest(BaseModel):
    """A loaded and fully checked manifest."""

    model_config = ConfigDict(frozen=True)

    path: FileRef
    """The manifest file, absolute, or the object's URL."""
    sha256: str
    """sha256 (hex) of the manifest file's bytes."""
    format: ManifestFormat
    jobs: Sequence[Job]
    """The checked jobs, in manifest order: iterate them (as often as needed) and count them; a loaded
    manifest's are kept on disk (`spool.Jobs`), one built here from a list holds that list."""
    metadata_columns: list[str] = []
    """Names of the metadata columns, in order of first appearance (for results tables)."""
    sheet: str | None = None
    """XLSX: the sheet read (the first visible one unless named: `file.xlsx#Sheet`)."""

    @property
    def source(self) -> str:
        """The manifest as a run names it again (a shard's parameter, run.json): its path, and for a
        workbook the sheet read (`/abs/catalog.xlsx#Products`), so that a reload reads the same rows."""
        return f"{self.path}#{self.sheet}" if self.sheet is not None else str(self.path)

    @property
    def base_dir(self) -> FileRef:
        """The folder (or the object's prefix) that relative file paths in the manifest are resolved
        against."""
        if isinstance(self.path, str):
            from .sources import parent

            return parent(self.path)
        return self.path.parent
