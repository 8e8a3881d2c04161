"""What `imagebatch export` delivers and under which names: results.csv's requests, each either chosen
(its image named by the template, `delivery.naming`, and checked, before anything is converted or
written) or missing with the reason (`delivery.listing.REASONS`), which export.csv lists too.

Which images (the rule, also in the README):
- results.csv's rows whose status is `succeeded` (or `skipped`: succeeded in an earlier run), and of a
  row only its image files (a text route's .txt/.json are not deliverables);
- of a request (job, request, turn) with several variants (results.csv's `variant`, a missing column or
  cell being 1), one: the newest (highest) variant that succeeded; with `--approved-only`, the newest
  variant whose own key's last review decision is `approved` (a request none of whose variants is
  approved is left out, even if an older one was approved and then cleared). Without `--approved-only`
  decisions do not choose: the newest image is delivered even if a reviewer rejected it (export.csv
  shows the decision).
- a request with no image to deliver is missing: `changed since approval` (approved-only: a key the
  journal holds for the request, no longer in results.csv, was approved), else its newest variant's
  status (`no image`, `failed`, `unknown`, `not attempted`), else (approved-only) `rejected` or
  `unreviewed` by its newest variant's decision.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebatch.delivery.convert import EXTENSIONS, SOURCE_SUFFIXES, Conversion, Staged
from imagebatch.delivery.listing import (
    DELIVERED,
    EXPORT_CSV,
    MISSING,
    decision_cells,
    table,
)
from imagebatch.delivery.naming import (
    MAX_NAME_BYTES,
    NameTemplate,
    TemplateError,
    clashes,
    folded,
    name_for,
    unsafe,
)
from imagebatch.manifest.plan import key_digits
from imagebatch.storage import layout
from imagebatch.storage.location import MAX_OBJECT_KEY_BYTES, Location
from imagebatch.work.decisions import Decision
from imagebatch.work.store import OutputStore

SUCCEEDED = ("succeeded", "skipped")
STATUS_REASONS = {"no_image": "no image", "not_attempted": "not attempted"}
"""A results.csv status as a missing deliverable's reason, where the words differ."""
Request = tuple[str, str, str]
"""(job_id, request_index, turn_index), as results.csv's cells."""


class ExportRefused(Exception):
    """The export cannot be made as asked; `problems` name the rows. Nothing was written, unless
    `written` (a name taken by someone else while the export was publishing)."""

    def __init__(self, problems: list[str], *, written: bool = False) -> None:
        self.problems = problems
        self.written = written
        super().__init__("\n".join(problems))


def _common_cells(row: Mapping[str, str], variant: int, decision: Decision | None) -> dict[str, Any]:
    """A deliverable's cells from its results.csv row: the manifest's columns and its request, the
    variant and its review decision."""
    return {**row, "variant": variant, **decision_cells(decision)}


@dataclass(slots=True)
class Deliverable:
    """One image to deliver: where it comes from, what it becomes, and (once made) its facts."""

    number: int
    """Its results.csv row number (the order of export.csv)."""
    label: str
    row: dict[str, str]
    variant: int
    n: int
    source: str
    name: str
    conversion: Conversion
    decision: Decision | None = None
    staged: Staged | None = None

    def export_row(self) -> dict[str, Any]:
        staged = self.staged or Staged(0)
        return {
            **_common_cells(self.row, self.variant, self.decision),
            "path": self.name,
            "status": DELIVERED,
            "reason": "",
            "n": self.n,
            "sha256": staged.sha256,
            "bytes": staged.size,
            "width": staged.width,
            "height": staged.height,
            "below_size": "yes" if staged.small else "",
            "source": self.source,
            "source_sha256": staged.source_sha256,
            "conversion": self.conversion.describe(),
        }


@dataclass(slots=True)
class Missing:
    """A request of the manifest this export delivers no image of, and why (`listing.REASONS`)."""

    number: int
    label: str
    row: dict[str, str]
    variant: int
    reason: str
    decision: Decision | None = None
    name: str = ""
    """The name its image would have (for the summary: where a person looks for it), or "" if none."""

    def export_row(self) -> dict[str, Any]:
        return {
            **_common_cells(self.row, self.variant, self.decision),
            "path": "",
            "status": MISSING,
            "reason": self.reason,
            "source": "",
        }


@dataclass
class ExportPlan:
    """What an export delivers (`deliverables`) and what it cannot (`missing`), in results.csv's order."""

    deliverables: list[Deliverable] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)

    def rows(self, stars: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
        """export.csv's rows, in results.csv's order (a request's images by their number), each with its
        image's `stars` (`work.decisions.read_stars`)."""
        items: list[Deliverable | Missing] = [*self.deliverables, *self.missing]
        items.sort(key=lambda d: (d.number, d.n if isinstance(d, Deliverable) else 0))
        rows = [d.export_row() for d in items]
        for row in rows:
            row["stars"] = (stars or {}).get(row.get("idempotency_key", ""), "")
        return rows


def read_results(out: Location) -> tuple[list[str], list[dict[str, str]]]:
    """results.csv's columns and rows (cells as the run wrote them, before formula-proofing)."""
    data = out.get(layout.RESULTS_CSV)
    if data is None:
        why = "has no results.csv (not an output folder of a finished run)"
        raise ExportRefused([f"{out.url} {why}"])
    return table(data)


def changed_since_approval(
    out: str, rows: list[dict[str, str]], decisions: Mapping[str, Decision]
) -> set[Request]:
    """The requests an approved key is of that results.csv no longer holds (its row changed since): the
    journal names each key's request. Reads the journal only when there is such a key."""
    current = {row.get("idempotency_key") for row in rows}
    gone = {k for k, d in decisions.items() if d.decision == "approved" and k not in current}
    if not gone:
        return set()
    requests: set[Request] = set()
    for ev in OutputStore(out).journal_events():  # read as it goes: no key's state is needed
        if ev.get("idempotency_key") in gone:
            requests.add((str(ev.get("job_id")), str(ev.get("request_index")), str(ev.get("turn_index"))))
    return requests


def _variant(row: dict[str, str]) -> int:
    cell = (row.get("variant") or "").strip()
    return int(cell) if cell else 1


FIRST_ROW = 2
"""A results.csv row's number as a spreadsheet shows it: its header is row 1."""


def _label(number: int, row: dict[str, str], variant: int, n: int | None = None) -> str:
    where = f"job {row.get('job_id', '?')!r}, request {row.get('request_index', '?')}"
    if row.get("turn_index") not in (None, "", "0"):
        where += f", turn {row['turn_index']}"
    if variant != 1:
        where += f", variant {variant}"
    if n is not None:
        where += f", image {n}"
    return f"results.csv row {number} ({where})"


@dataclass(frozen=True, order=True, slots=True)
class Choice:
    """One request's row to deliver (`reason` None), or its newest row and why it is missing."""

    number: int
    variant: int
    reason: str | None = None


def choose(
    rows: list[dict[str, str]],
    decisions: Mapping[str, Decision],
    approved_only: bool,
    changed: set[Request] | frozenset[Request] = frozenset(),
) -> tuple[list[Choice], list[str]]:
    """One choice per request, in results.csv's order; and the problems (a `variant` cell that is not a
    whole number). The rule is the module's docstring."""
    found: dict[Request, list[tuple[int, int]]] = {}
    problems = []
    for number, row in enumerate(rows, FIRST_ROW):
        try:
            variant = _variant(row)
        except ValueError:
            problems.append(f"{_label(number, row, 1)}: variant {row.get('variant')!r} is not a whole number")
            continue
        request = (row.get("job_id", ""), row.get("request_index", ""), row.get("turn_index", ""))
        found.setdefault(request, []).append((variant, number))

    def deliverable(number: int) -> bool:
        row = rows[number - FIRST_ROW]
        decision = decisions.get(row.get("idempotency_key", ""))
        approved = decision is not None and decision.decision == "approved"
        return row.get("status") in SUCCEEDED and (approved or not approved_only)

    choices = []
    for request, variants in found.items():
        if good := [(v, n) for v, n in variants if deliverable(n)]:
            variant, number = max(good)
            choices.append(Choice(number, variant))
            continue
        variant, number = max(variants)
        row = rows[number - FIRST_ROW]
        decision = decisions.get(row.get("idempotency_key", ""))
        status = row.get("status", "")
        if approved_only and request in changed:
            reason = "changed since approval"
        elif status not in SUCCEEDED:
            reason = STATUS_REASONS.get(status, status)
        else:
            reason = "rejected" if decision is not None and decision.decision == "rejected" else "unreviewed"
        choices.append(Choice(number, variant, reason))
    return sorted(choices), problems


def _images(row: dict[str, str]) -> list[str]:
    paths = [p for p in (row.get("paths") or "").split(";") if p]
    return [p for p in paths if Path(p).suffix.lower() in SOURCE_SUFFIXES]


def name_values(row: Mapping[str, object], variant: int, n: int, ext: str) -> dict[str, object]:
    """The values a `--name` template is rendered with: the row's cells (its request's numbers as
    numbers, for `{request_index:03d}`) and the built-ins (`naming.BUILTINS`)."""
    values: dict[str, object] = {**row, "variant": variant, "n": n, "ext": ext}
    values["key12"] = key_digits(str(row.get("idempotency_key", "")))[:12]
    for number_column in ("request_index", "turn_index"):
        with contextlib.suppress(ValueError, TypeError):
            values[number_column] = int(row.get(number_column) or 0)  # type: ignore[call-overload]
    return values


@dataclass(frozen=True)
class Naming:
    """How deliverables are named and made: the template, `--slug`, the conversion."""

    template: NameTemplate
    conversion: Conversion
    slugged: bool = False
    room: int = MAX_NAME_BYTES
    """The bytes a name may take in DEST (`aside.name_room`: less under an object store's prefix)."""

    def unknown_problem(self, columns: list[str]) -> str | None:
        """A `--name` naming a field that is neither a column of results.csv nor a built-in."""
        if not (unknown := self.template.unknown(columns)):
            return None
        shown = ", ".join(f"{{{f}}}" for f in unknown)
        known = ", ".join(c for c in columns if c != "paths")
        return (
            f"--name {self.template.text!r} names {shown}: not a column of results.csv ({known}) nor a "
            "built-in ({variant}, {n}, {ext}, {key12})"
        )


def _row_deliverables(
    number: int, row: dict[str, str], choice: Choice, naming: Naming, sources: set[str]
) -> tuple[list[Deliverable], list[str]]:
    """The deliverables of one chosen row, named and checked; and its problems."""
    images = _images(row)
    out, problems = [], []
    for n, source in enumerate(images, 1):
        label = _label(number, row, choice.variant, n if len(images) > 1 else None)
        fmt = naming.conversion.target(SOURCE_SUFFIXES[Path(source).suffix.lower()])
        if not source.startswith(f"{layout.IMAGES_DIR}/") or unsafe(source):
            problems.append(f"{label}: its path {source!r} is not under {layout.IMAGES_DIR}/ of OUT")
            continue
        if source not in sources:
            problems.append(f"{label}: its image {source} is missing from OUT")
            continue
        try:
            name = name_for(
                naming.template, name_values(row, choice.variant, n, EXTENSIONS[fmt]), slugged=naming.slugged
            )
        except TemplateError as exc:
            problems.append(f"{label}: {exc}")
            continue
        if (size := len(name.encode())) > naming.room:
            problems.append(
                f"{label}: its name {name!r} is {size:,} bytes; under DEST's prefix an object's key leaves "
                f"{naming.room:,} for a name (a key is at most {MAX_OBJECT_KEY_BYTES:,} bytes): "
                "a shorter --name or prefix"
            )
            continue
        if folded(name) == folded(EXPORT_CSV):
            problems.append(f"{label}: its name {name!r} is the list export writes")
            continue
        conv = dataclasses.replace(naming.conversion, format=fmt)
        out.append(Deliverable(number, label, row, choice.variant, n, source, name, conv))
    return out, problems


def _would_be(row: dict[str, str], variant: int, naming: Naming) -> str:
    """The name a missing request's (first) image would have, its format the conversion's, else its
    newest row's image's, else png; "" where the template does not fit its values."""
    images = _images(row)
    source = SOURCE_SUFFIXES[Path(images[0]).suffix.lower()] if images else "png"
    ext = EXTENSIONS[naming.conversion.target(source)]
    try:
        return name_for(naming.template, name_values(row, variant, 1, ext), slugged=naming.slugged)
    except TemplateError:
        return ""


def plan(
    columns: list[str],
    rows: list[dict[str, str]],
    naming: Naming,
    sources: set[str],
    *,
    decisions: Mapping[str, Decision],
    approved_only: bool = False,
    changed: set[Request] | frozenset[Request] = frozenset(),
) -> ExportPlan:
    """Every deliverable, named and checked, and every missing one; raises ExportRefused with every
    problem found."""
    if problem := naming.unknown_problem(columns):
        raise ExportRefused([problem])
    choices, problems = choose(rows, decisions, approved_only, changed)
    result = ExportPlan()
    for choice in choices:
        row = rows[choice.number - FIRST_ROW]
        decision = decisions.get(row.get("idempotency_key", ""))
        if choice.reason is not None:
            label = _label(choice.number, row, choice.variant)
            name = _would_be(row, choice.variant, naming)
            result.missing.append(
                Missing(choice.number, label, row, choice.variant, choice.reason, decision, name)
            )
            continue
        made, found = _row_deliverables(choice.number, row, choice, naming, sources)
        for d in made:
            d.decision = decision
        result.deliverables += made
        problems += found
    for first, second, name in clashes({d.label: d.name for d in result.deliverables}):
        problems.append(f"{first} and {second}: both are named {name!r} (or one is a folder of the other)")
    if problems:
        raise ExportRefused(problems)
    return result


def in_the_way(deliverables: list[Deliverable], existing: set[str]) -> list[str]:
    """Deliverables DEST has no room for: a file where a folder of its name must be, or a folder where
    it must be a file."""
    folders = {
        "/".join(parts[:i]) for name in existing for parts in [name.split("/")] for i in range(1, len(parts))
    }
    problems = []
    for d in deliverables:
        parts = d.name.split("/")
        blocked = next(
            ("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in existing), None
        )
        if blocked is not None:
            problems.append(
                f"{d.label}: DEST has a file {blocked!r} where its name {d.name!r} needs a folder"
            )
        elif d.name in folders:
            problems.append(f"{d.label}: DEST has a folder where its name {d.name!r} would be a file")
    return problems
