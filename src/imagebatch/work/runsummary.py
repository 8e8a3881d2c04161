"""run.json as a typed, versioned model (`RunSummary`): what a run says of itself in its output location,
written at its start (`state: running`) and again as it ends. Every writer builds the model and every
reader parses the file through it, so that a field has one name and one type; the JSON schema is in
docs/reference/run-json.md (made by docs/gen_reference.py from this model).

Versions: `schema_version` is the model's `SCHEMA_VERSION`, written into every run.json. A run.json
without it (written before it existed) reads as version 1, which it is. A run.json of a newer version
than this imagebatch knows is refused in one line (upgrade imagebatch), as is one whose field has the
wrong type (the line names the file and the field): a report built on a misread record would be wrong
without saying so. Fields this model does not name are kept as they are when the file is written again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from imagebatch.storage.bounded import RecordError

SCHEMA_VERSION = 1
"""The version of run.json this model reads and writes."""

RunState = Literal["running", "finished", "stopped", "crashed", "abandoned"]
"""A run's state (`RunSummary.state` says what each means)."""


def _iso(value: str) -> str:
    datetime.fromisoformat(value)  # a ValueError for a time that is not ISO 8601
    return value


IsoTime = Annotated[str, AfterValidator(_iso)]
"""A time as ISO 8601 text with its offset, as the run wrote it (kept as written)."""


class Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class Previous(Part):
    """The run before this one, which had died running (`crashed`), as this run found it."""

    started_at: IsoTime | None = None
    state: RunState | None = None
    stopped: str | None = None
    noticed_at: IsoTime | None = None


class Redo(Part):
    """What a `--redo` run was to send (`work.variants.RedoSummary.info`)."""

    variants: int = Field(ge=0)
    kinds: dict[str, int] = {}
    edits: int = Field(default=0, ge=0)
    new_samples: int = Field(default=0, ge=0)
    fallback: int = Field(default=0, ge=0)
    fallback_reasons: dict[str, int] = {}


class Spend(Part):
    """The run's estimated spend, with a price table: what succeeded cost, and what `unknown` requests may
    have cost."""

    spent: float
    in_doubt: float
    currency: str
    unpriced: list[str] = []
    """Models the plan asks images of that the table does not price."""


class PrefectSide(Part):
    """What the run was in Prefect: its flow run (null for a run settled without Prefect: `started`
    false), its task runs, and what Prefect's server did not record when it was lost (`incomplete`)."""

    flow_run_id: str | None = None
    task_runs: int | None = Field(default=None, ge=0)
    started: bool | None = None
    incomplete: str | None = None


class RunSummary(BaseModel):
    """run.json. `state`, `started_at` and the options are written when the run starts; the rest as it
    ends (`counts`, `usage`, `spend`...), or when it is found dead (`crashed`, `noticed_at`)."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = Field(
        default=SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION, description="This file's version of the format."
    )
    manifest: str | None = Field(default=None, description="The manifest (a workbook's as `path#Sheet`).")
    manifest_sha256: str | None = Field(default=None, description="The manifest's sha256 as the run read it.")
    out: str | None = Field(default=None, description="The output location: a folder's path or a URL.")
    service: str | None = Field(default=None, description="The service's URL, or `embedded emulator`.")
    options: dict[str, Any] = Field(
        default={}, description="Every run option by its name (`RunOptions.flat`), and a shard's number."
    )
    versions: dict[str, str] = Field(default={}, description="imagebatch's and Prefect's versions.")
    started_at: IsoTime | None = Field(default=None, description="When the run started (ISO 8601).")
    ended_at: IsoTime | None = Field(default=None, description="When it ended; null while it runs.")
    state: RunState = Field(
        description="running (until the run writes its end), finished, stopped (early: a budget, Ctrl-C, "
        "a lost service), crashed (its process died; set by the next run or report), abandoned (a second "
        "signal ended it with requests in flight)."
    )
    requests: int | None = Field(default=None, ge=0, description="The requests planned, variants included.")
    sent: int | None = Field(default=None, ge=0, description="The requests this run sent.")
    previous: Previous | None = Field(
        default=None, description="The run before, found dead (crashed) as this one started."
    )
    redo: Redo | None = Field(default=None, description="What a `--redo` run was to send.")
    usage: list[dict[str, Any]] = Field(
        default=[], description="usage-summary.csv's rows: by route and model, requests, images, tokens."
    )
    spend: Spend | None = Field(
        default=None, description="With prices: the estimated spend and what unknown requests may cost."
    )
    rate_limited: int | None = Field(default=None, ge=0, description="Requests failed on HTTP 429.")
    counts: dict[str, int] | None = Field(default=None, description="This run's requests by status.")
    superseded: int | None = Field(default=None, ge=0, description="Old no_image rows a redo replaced.")
    stopped: str | None = Field(default=None, description="Why the run stopped early, or ended.")
    noticed_at: IsoTime | None = Field(default=None, description="When a dead run was found (crashed).")
    prefect: PrefectSide | None = Field(
        default=None, description="Its flow run and task runs, or that Prefect was not started or lost."
    )
    shard_runs: list[dict[str, Any]] | None = Field(
        default=None,
        description="A sharded run's shards: number, flow run, state (UNKNOWN: Prefect was lost), message.",
    )
    report: str | None = Field(default=None, description="The report's first page.")
    run_report: str | None = Field(default=None, description="This run's own copy of the report.")
    unwritten: list[str] | None = Field(default=None, description="Records that could not be written.")

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> RunSummary:
        """The model of what a writer has (a run's summary as a dict), at this version; ValueError (a
        bug of ours, never a person's input) if a field has the wrong type. A value JSON has no type
        for (the report's Path, a Counter) is taken as JSON would write it."""
        plain = json.loads(json.dumps({**info, "schema_version": SCHEMA_VERSION}, default=str))
        return cls.model_validate(plain)

    @classmethod
    def parse(cls, raw: bytes, where: str) -> RunSummary:
        """run.json's bytes read through the model; `RunSummaryError` in one line naming `where` (the
        file) and the field when it is not JSON, not an object, of a newer version, or a field's type is
        wrong."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise RunSummaryError(f"{where}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise RunSummaryError(f"{where}: not a JSON object")
        version = data.get("schema_version", 1)
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise RunSummaryError(
                f"{where}: schema_version {version} is newer than this imagebatch reads "
                f"({SCHEMA_VERSION}): upgrade imagebatch"
            )
        try:
            return cls.model_validate(data, strict=True)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(part) for part in error["loc"]) or "the file"
            raise RunSummaryError(
                f"{where}: field {field!r}: {str(error['msg']).removeprefix('Value error, ')} "
                f"(it is {error.get('input')!r})"[:500]
            ) from None

    def record(self) -> bytes:
        """run.json's bytes: the fields the writer gave, as indented JSON."""
        data = self.model_dump(mode="json", exclude_unset=True)
        return (json.dumps({"schema_version": self.schema_version, **data}, indent=2) + "\n").encode()

    def changed(self, **fields: Any) -> RunSummary:
        """A copy with these fields changed, validated (`state="crashed"`...)."""
        return RunSummary.model_validate(self.as_dict() | fields)

    def as_previous(self) -> dict[str, Any]:
        """What the next run records of this one, found dead (its `previous`)."""
        return self.model_dump(mode="json", include={"started_at", "state", "stopped", "noticed_at"})

    def as_dict(self) -> dict[str, Any]:
        """The fields the file or the writer gave, as plain data (what a flow returns)."""
        return self.model_dump(mode="json", exclude_unset=True)


def read_summary(raw: bytes | None, where: str) -> RunSummary | None:
    """`RunSummary.parse` of run.json's bytes as a location gives them; None when there are none."""
    return RunSummary.parse(raw, where) if raw is not None else None


class RunSummaryError(RecordError):
    """A run.json imagebatch refuses to read: one line naming the file and the field."""
