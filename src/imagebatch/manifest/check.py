"""The checker: a raw manifest's rows to Jobs, in small steps (header, id, route and model, fields,
templates, files), every problem collected with its line or item, field and hint.

One class, because its steps share the manifest's state (its defaults, the ids seen, the look-alike names
reported, the file cache); the route and model rules (`routing`), templates, input model and file checks
it uses are in their own modules."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from pydantic_core import PydanticCustomError

from imagebatch.gateway.imagefile import mask_problems
from imagebatch.gateway.models import check_aspect_ratio

from .fields import (
    KNOWN_FIELDS,
    METADATA_PREFIX,
    MISPLACED_HINTS,
    NUL_HINT,
    NUL_MESSAGE,
    ROUTE_FIELDS,
    ROUTE_SPECIFIC_FIELDS,
    SETTINGS,
    has_nul,
    looks_like_field,
    name_fault,
    route_parameters,
    routes_for,
    shown,
)
from .files import SIZE_HINT, FileChecker, FileFacts, base_root, declared_roots, size_fault
from .ids import IdHashes
from .inputs import JobInput, clean_text, validate_input
from .models import (
    FileRef,
    Job,
    Location,
    Problem,
    Turn,
    checked_job,
    location_text,
)
from .read import RawManifest, RawRow
from .routing import ratio_hint, resolve, route_serves
from .template import TemplateError, render_prompt, template_value

# --- the checker -------------------------------------------------------------------------------------


def _shared(value: Any) -> Any:
    """One string object for a value that repeats across rows (a model, a size): each CSV cell is a new
    string, and a 100,000-row plan is kept for the whole run."""
    return sys.intern(value) if isinstance(value, str) else value


class JobChecker:
    """Checks rows one at a time, remembering what spans rows (ids, files, reported columns).

    Every problem of every row is collected in `problems`; `check` returns a Job only for a clean row.
    """

    def __init__(
        self,
        raw: RawManifest,
        base_dir: FileRef,
        roots: Sequence[FileRef] = (),
        repeated: Collection[int] = frozenset(),
    ) -> None:
        """`roots`: the resolved folders (or URL prefixes) the operator allows files in besides `base_dir`
        (--files-root); `base_dir` is the manifest's folder, or its prefix in a store. `repeated`: the id
        hashes an earlier reading of the manifest found taken twice (`ids`), whose ids are compared
        exactly."""
        self.format = raw.format
        self.tabular = raw.columns is not None
        """A table (CSV, XLSX, Parquet): a header of columns, every value text."""
        self.sheet = raw.sheet
        self.problems: list[Problem] = []
        self._raw = raw
        allowed = (base_root(base_dir), *roots)
        declared = raw.defaults.get("files_root")
        roots, faults = declared_roots(declared, base_dir, allowed)
        self.problems += [Problem(None, None, "defaults.files_root", *fault) for fault in faults]
        self.files = FileChecker(base_dir, roots)
        if declared is not None:
            self.files.outside_hint = "the manifest's defaults.files_root allows only these folders"
        self._seen = IdHashes()
        """The hash of each casefolded id: 8 to 16 bytes a row of the manifest (a shard's too)."""
        self._exact = frozenset(repeated)
        self._ids: dict[str, int | tuple[str, int]] = {}
        """Casefolded id -> the line of its first row, with the id as written when that differs: only the
        ids whose hash is in `repeated`."""
        self._metadata_columns: dict[str, None] = {}  # an ordered set
        self._reported_keys: set[str] = set()
        self._absent_columns: set[str] = set()
        self._defaults_raw: dict[str, Any] = {}
        self._defaults = JobInput()
        self._defaults_set: frozenset[str] = frozenset()
        if self.tabular:
            self._check_header(raw)
        else:
            self._check_defaults(raw.defaults)

    @property
    def repeated(self) -> set[int]:
        """The id hashes taken twice in this reading (outside `repeated`): its duplicates are named by
        reading the manifest again with them."""
        return self._seen.repeated

    @property
    def metadata_columns(self) -> list[str]:
        return list(self._metadata_columns)

    # -- whole-file checks --------------------------------------------------------------------------

    def _check_header(self, raw: RawManifest) -> None:
        columns = raw.columns or []
        line = raw.header_line

        def add(field: str, message: str, hint: str | None = None) -> None:
            self.problems.append(Problem(line, None, field, message, hint, raw.unit, self.sheet))

        for required in ("id", "prompt"):
            if required not in columns:
                self._absent_columns.add(required)
                add(required, f"the manifest has no {required!r} column; every job needs one")
        for name in columns:
            self._reported_keys.add(name)
            if (fault := name_fault(name)) is not None:
                add(shown(name), *fault)
            elif name == "turns":
                add("turns", "edit chains (turns) can only be written in JSON or JSON Lines")
            elif (meant := looks_like_field(name)) is not None:
                self.problems.append(self._lookalike(line, raw.unit, None, name, meant))
            elif name not in KNOWN_FIELDS:
                self._metadata_columns[name] = None

    def _check_defaults(self, defaults: dict[str, Any]) -> None:
        if not defaults:
            return

        def add(field: str, message: str, hint: str | None = None) -> None:
            self.problems.append(Problem(None, None, f"defaults.{shown(field)}", message, hint))

        faulty: set[str] = set()
        for key, value in defaults.items():
            if key in SETTINGS:
                faulty.add(key)  # a setting of the manifest (`files.declared_roots`), not a field
            elif self._raw.may_hold_nul and (has_nul(key) or has_nul(value)):
                add(key, "the name " + NUL_MESSAGE if has_nul(key) else NUL_MESSAGE, NUL_HINT)
                faulty.add(key)
        defaults = {k: v for k, v in defaults.items() if k not in faulty}
        self._defaults_raw = defaults

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
            elif (fault := name_fault(key)) is not None:
                add(key, *fault)
            elif template_value(value) is None:
                add(key, "metadata values must be text, numbers or true/false, not a list or object")
            else:
                self._metadata_columns[key] = None

    def _lookalike_text(self, name: str, meant: str) -> tuple[str, str]:
        kind = "column" if self.tabular else "key"
        return (
            f"{kind} {name!r} is not a field; did you mean {meant!r}?",
            f"if it is metadata, declare it so: name it '{METADATA_PREFIX}{name}'",
        )

    def _lookalike(
        self, line: int | None, unit: Location, job_id: str | None, name: str, meant: str
    ) -> Problem:
        return Problem(line, job_id, name, *self._lookalike_text(name, meant), unit=unit, sheet=self.sheet)

    @staticmethod
    def _given(inp: JobInput, field: str) -> bool:
        value = getattr(inp, field)
        return value is not None and value != []

    # -- one row ------------------------------------------------------------------------------------

    def check(self, row: RawRow) -> Job | None:
        """Check one row; append its problems to `problems`; return its Job when it has none.

        The steps, each small: split known fields from metadata, type-check the fields, then the id, the
        route and model, the route-specific fields, the prompt and turns, and the files."""
        r = self._start(row)
        r.inp, issues = validate_input(r.known)
        for issue in issues:
            r.add(issue.field, issue.message, issue.hint)
        r.bad |= {issue.top for issue in issues}
        job_id = self._check_id(r)
        route, model = self._route_and_model(r)
        given = self._route_fields(r, route, model)
        prompt, turns = self._prompt_and_turns(r, given, route)
        refs, ref_hashes = self._files(given.get("reference_images", []), "reference_images", r.add, route)
        mask_path, mask_hash = self._row_mask(r, given, route)
        metadata = self._metadata(r.extra, r.add)

        if r.problems:
            self.problems.extend(r.problems)
            return None
        if job_id is None or route is None or model is None or prompt is None:
            return None  # an absent id or prompt column, reported once at the header
        parameters = route_parameters(route, given)
        return checked_job(
            {  # in the order Job declares its fields (a model's dump and repr follow this order)
                "id": job_id,
                "line": row.line,
                "location": r.location,
                "prompt": prompt,
                "model": _shared(model),
                "route": _shared(route),
                "aspect_ratio": _shared(parameters["aspect_ratio"]),
                "image_size": _shared(parameters["image_size"]),
                "size": _shared(parameters["size"]),
                "reference_images": refs,
                "reference_sha256": ref_hashes,
                "mask": mask_path,
                "mask_sha256": mask_hash,
                "count": r.value("count") or 1,
                "max_images": parameters["max_images"],
                "max_tokens": parameters["max_tokens"],
                "turns": turns,
                "metadata": metadata,
            }
        )

    def _start(self, row: RawRow) -> _Row:
        """The row's state, its known fields split from its metadata (look-alike names reported once)."""
        r = _Row(self, row)
        for key, value in row.values.items():
            if self._raw.may_hold_nul and has_nul(value) and not has_nul(key):
                r.add(key, NUL_MESSAGE, NUL_HINT)
                r.bad.add(key)  # not checked further, nor kept as metadata
                continue
            if key in KNOWN_FIELDS:
                r.known[key] = value
                continue
            r.extra[key] = value
            if key not in self._reported_keys:
                # JSON keys vary by job: report a look-alike once, at the first job that has it.
                self._reported_keys.add(key)
                if (meant := looks_like_field(key)) is not None:
                    r.problems.append(self._lookalike(row.line, row.unit, r.shown_id, key, meant))
                    continue
                if (fault := name_fault(key)) is not None:
                    r.add(shown(key), *fault)
                    continue
                self._metadata_columns[key] = None
        if self.tabular:
            r.known.pop("turns", None)  # reported once, at the header
        return r

    def _check_id(self, r: _Row) -> str | None:
        job_id = r.inp.id
        if job_id is None and "id" not in r.bad and "id" not in self._absent_columns:
            r.add("id", "id is required: every job needs a unique id")
        elif job_id is not None:
            self._check_unique(job_id, r.row, r.add)
        return job_id

    def _route_and_model(self, r: _Row) -> tuple[str | None, str | None]:
        if {"route", "model"} & r.bad:
            return None, None
        route_given = r.value("route")
        if (
            r.inp.model is None
            and r.inp.route is not None
            and not route_serves(r.inp.route, self._defaults.model)
        ):
            # Like any route-specific default, a default model reaches only the jobs whose route serves
            # it: one defaults object can then serve a manifest mixing routes.
            model_given = None
        else:
            model_given = r.value("model")
        return resolve(route_given, model_given, r.add)

    def _route_fields(self, r: _Row, route: str | None, model: str | None) -> dict[str, Any]:
        """The route-specific fields: defaults apply only where they belong, a job's own must belong."""
        given: dict[str, Any] = {}
        for field in ROUTE_SPECIFIC_FIELDS:
            if field in r.bad:
                continue
            if self._given(r.inp, field):
                if route is not None and field not in ROUTE_FIELDS[route]:
                    routes = " and ".join(routes_for(field))
                    message = f"{field} does not apply to the {route} route, only to {routes}"
                    r.add(field, message, MISPLACED_HINTS[field])
                    continue
                given[field] = getattr(r.inp, field)
            elif field in self._defaults_set and route is not None and field in ROUTE_FIELDS[route]:
                r.from_defaults.add(field)
                given[field] = getattr(self._defaults, field)
        if route in ("native", "chat") and model is not None and "aspect_ratio" in given:
            try:
                check_aspect_ratio(model, given["aspect_ratio"])
            except PydanticCustomError as exc:
                r.add("aspect_ratio", exc.message(), ratio_hint(model, given["aspect_ratio"]))
        return given

    def _prompt_and_turns(
        self, r: _Row, given: dict[str, Any], route: str | None
    ) -> tuple[str | None, list[Turn]]:
        """The prompt and each turn's, rendered against the whole row (defaults included)."""
        values = r.row.values
        namespace = {**self._defaults_raw, **values} if self._defaults_raw else values
        prompt = self._render(r.value("prompt"), "prompt", namespace, r.add)
        if prompt is None and r.value("prompt") is None and "prompt" not in r.bad | self._absent_columns:
            r.add("prompt", "prompt is required")
        turns: list[Turn] = []
        for i, turn in enumerate(given.get("turns", [])):
            field = f"turns[{i}]"
            if turn is None:
                continue  # not a turn at all: reported by validate_input
            turn_prompt = self._render(turn.prompt, f"{field}.prompt", namespace, r.add)
            if turn.prompt is None and f"{field}.prompt" not in r.bad:
                r.add(f"{field}.prompt", "each turn needs a prompt")
            paths, hashes = self._files(turn.reference_images, f"{field}.reference_images", r.add, route)
            if turn_prompt is not None:
                turns.append(Turn(prompt=turn_prompt, reference_images=paths, reference_sha256=hashes))
        return prompt, turns

    def _row_mask(
        self, r: _Row, given: dict[str, Any], route: str | None
    ) -> tuple[FileRef | None, str | None]:
        if "mask" not in given:
            return None, None
        refs = given.get("reference_images")
        if not refs:
            r.add("mask", "a mask needs a reference image to apply to (it applies to the first)")
        mask_facts = self._file(given["mask"], "mask", r.add, route)
        if mask_facts is None:
            return None, None
        self._check_mask(mask_facts, self.files.check(refs[0]) if refs else None, r.add)
        return mask_facts.path, mask_facts.sha256

    def claim_id(self, job_id: str, line: int) -> bool:
        """Take `job_id` for the row on `line` when no earlier row has it in any case; False (and nothing
        taken) when one has: `check` then says which. Known only for an id whose hash is `repeated`; any
        other is taken, its hash noted (`IdHashes`)."""
        key = job_id.casefold()
        value = hash(key) or 1
        if value not in self._exact:
            self._seen.add(value)  # a repeat is only noted: the manifest is read again, knowing it
            return True
        if key in self._ids:
            return False
        self._ids[key] = line if key == job_id else (job_id, line)
        return True

    def _check_unique(self, job_id: str, row: RawRow, add: Callable[..., None]) -> None:
        if self.claim_id(job_id, row.line):
            return
        first = self._ids[job_id.casefold()]
        first_id, line = (job_id.casefold(), first) if isinstance(first, int) else first
        where = location_text(row.unit, line)
        if first_id == job_id:
            add("id", f"duplicate id {job_id!r}: also used on {where}")
        else:
            add(
                "id",
                f"id {job_id!r} differs from {first_id!r} ({where}) only by case",
                "their file names would collide on case-insensitive file systems",
            )

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
        rendered = clean_text(rendered)
        if rendered is None:
            add(field, "the prompt is empty once its placeholders are filled in")
        return rendered

    def _file(self, text: str, field: str, add: Callable[..., None], route: str | None) -> FileFacts | None:
        facts = self.files.check(text)
        if (too_big := size_fault(facts.size, route)) is not None:
            add(field, f"{text}: {too_big}", SIZE_HINT)
            return None
        if facts.error is not None:
            add(field, f"{text}: {facts.error}", facts.hint)
            return None
        return facts

    def _files(
        self, texts: list[str], field: str, add: Callable[..., None], route: str | None
    ) -> tuple[list[FileRef], list[str]]:
        paths: list[FileRef] = []
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


class _Row:
    """One row being checked: its problems, and its values with the manifest's defaults behind them."""

    def __init__(self, checker: JobChecker, row: RawRow) -> None:
        self.checker = checker
        self.row = row
        raw_id = row.values.get("id")
        shown_id = raw_id.strip() or None if isinstance(raw_id, str) else template_value(raw_id) or None
        self.shown_id = shown(shown_id) if shown_id else None
        self.location = location_text(row.unit, row.line)
        self.problems: list[Problem] = []
        self.from_defaults: set[str] = set()
        self.known: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        self.inp: JobInput
        self.bad: set[str] = set()

    def add(self, field: str | None, message: str, hint: str | None = None) -> None:
        if field in self.from_defaults:
            message += " (value from defaults)"
        self.problems.append(
            Problem(self.row.line, self.shown_id, field, message, hint, self.row.unit, self.checker.sheet)
        )

    def value(self, field: str) -> Any:
        """The row's own value of `field`, else the manifest's default (noted, for the message)."""
        own = getattr(self.inp, field)
        if own is not None and own != []:
            return own
        checker = self.checker
        if field in checker._defaults_set and field not in self.bad:
            self.from_defaults.add(field)
            return getattr(checker._defaults, field)
        return own
