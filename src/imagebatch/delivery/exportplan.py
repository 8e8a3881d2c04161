"""What `imagebatch export` delivers and under which names: results.csv's rows chosen, each image named
by the template (`delivery.naming`) and checked, before anything is converted or written; and export.csv,
the list of what an export delivered, which the next export also reads.

Which images (the rule, also in the README):
- results.csv's rows whose status is `succeeded` (or `skipped`: succeeded in an earlier run), and of a
  row only its image files (a text route's .txt/.json are not deliverables);
- of a request (job, request, turn) with several variants (results.csv's `variant`, a missing column or
  cell being 1), one: the newest (highest) variant that succeeded; with `--approved-only`, the newest
  variant whose own key's last review decision is `approved` (a request none of whose variants is
  approved is left out, even if an older one was approved and then cleared). Without `--approved-only`
  decisions are not read: the newest image is delivered even if a reviewer rejected it.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebatch.delivery.convert import EXTENSIONS, SOURCE_SUFFIXES, Conversion, Staged
from imagebatch.delivery.naming import NameTemplate, TemplateError, clashes, folded, unsafe
from imagebatch.manifest.plan import key_digits
from imagebatch.storage import layout
from imagebatch.storage.csvcells import csv_value, read_csv, write_csv
from imagebatch.storage.location import Location
from imagebatch.work.decisions import read_decisions

EXPORT_CSV = "export.csv"
EXPORT_COLUMNS = (
    "idempotency_key",
    "variant",
    "path",
    "sha256",
    "bytes",
    "width",
    "height",
    "job_id",
    "request_index",
    "turn_index",
    "n",
    "source",
    "source_sha256",
    "conversion",
)
"""export.csv: the source's key and variant, the deliverable's path in DEST and its facts; then where it
came from (its row, its image number, its path in OUT and that file's sha256) and how it was made (the
options, the versions of Pillow and its codecs), which let the next export know what it would write
without converting."""
DELIVERED = ("succeeded", "skipped")


class ExportRefused(Exception):
    """The export cannot be made as asked; `problems` name the rows. Nothing was written, unless
    `written` (a name taken by someone else while the export was publishing)."""

    def __init__(self, problems: list[str], *, written: bool = False) -> None:
        self.problems = problems
        self.written = written
        super().__init__("\n".join(problems))


@dataclass(slots=True)
class Deliverable:
    """One image to deliver: where it comes from, what it becomes, and (once made) its facts."""

    label: str
    row: dict[str, str]
    variant: int
    n: int
    source: str
    name: str
    conversion: Conversion
    staged: Staged | None = None

    def export_row(self) -> dict[str, Any]:
        staged = self.staged or Staged(0)
        return {
            "idempotency_key": self.row.get("idempotency_key", ""),
            "variant": self.variant,
            "path": self.name,
            "sha256": staged.sha256,
            "bytes": staged.size,
            "width": staged.width,
            "height": staged.height,
            "job_id": self.row.get("job_id", ""),
            "request_index": self.row.get("request_index", ""),
            "turn_index": self.row.get("turn_index", ""),
            "n": self.n,
            "source": self.source,
            "source_sha256": staged.source_sha256,
            "conversion": self.conversion.describe(),
        }


@dataclass
class ExportSummary:
    dest: str
    delivered: int = 0
    written: int = 0
    unchanged: int = 0
    overwritten: int = 0
    export_csv_written: bool = False
    deliverables: list[Deliverable] = field(default_factory=list, repr=False)
    approved_only: bool = False

    def line(self) -> str:
        if not self.delivered:
            why = (
                "no image is approved (`imagebatch review OUT`)"
                if self.approved_only
                else "no image succeeded"
            )
            return f"nothing to export to {self.dest}: {why}; nothing written"
        replaced = f", {self.overwritten} replaced (--overwrite)" if self.overwritten else ""
        return (
            f"exported {self.delivered} image{'s' if self.delivered != 1 else ''} to {self.dest}: "
            f"{self.written} written, {self.unchanged} unchanged{replaced}; listed in {EXPORT_CSV}"
        )


def export_csv(deliverables: list[Deliverable]) -> bytes:
    buf = io.StringIO()
    write_csv(buf, EXPORT_COLUMNS, (d.export_row() for d in deliverables))
    return buf.getvalue().encode()


def _table(data: bytes) -> tuple[list[str], list[dict[str, str]]]:
    text = data.decode("utf-8")
    header = next(csv.reader(io.StringIO(text)), [])
    return [csv_value(c) for c in header], list(read_csv(io.StringIO(text, newline="")))


def listed(dest: Location) -> dict[str, dict[str, str]]:
    """DEST's export.csv from an earlier export, by path (empty if there is none, or it is unreadable)."""
    data = dest.get(EXPORT_CSV)
    if data is None:
        return {}
    try:
        return {row["path"]: row for row in _table(data)[1] if row.get("path")}
    except (UnicodeDecodeError, csv.Error):
        return {}


def read_results(out: Location) -> tuple[list[str], list[dict[str, str]]]:
    """results.csv's columns and rows (cells as the run wrote them, before formula-proofing)."""
    data = out.get(layout.RESULTS_CSV)
    if data is None:
        why = "has no results.csv (not an output folder of a finished run)"
        raise ExportRefused([f"{out.url} {why}"])
    return _table(data)


def approved_keys(out: Location) -> set[str]:
    """The keys whose decision in force is `approved` (`work.decisions`: the last one for a key wins, so
    an approval later cleared or turned into a rejection does not count)."""
    return {key for key, d in read_decisions(out).items() if d.decision == "approved"}


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


def choose(rows: list[dict[str, str]], approved: set[str] | None) -> tuple[list[tuple[int, int]], list[str]]:
    """The rows to deliver, as (row number from `FIRST_ROW`, variant), in results.csv's order; and the
    problems (a `variant` cell that is not a whole number). The rule is the module's docstring."""
    best: dict[tuple[str, str, str], tuple[int, int]] = {}
    problems = []
    for number, row in enumerate(rows, FIRST_ROW):
        if row.get("status") not in DELIVERED:
            continue
        try:
            variant = _variant(row)
        except ValueError:
            problems.append(f"{_label(number, row, 1)}: variant {row.get('variant')!r} is not a whole number")
            continue
        if approved is not None and row.get("idempotency_key") not in approved:
            continue
        request = (row.get("job_id", ""), row.get("request_index", ""), row.get("turn_index", ""))
        if request not in best or variant > best[request][1]:
            best[request] = (number, variant)
    return sorted(best.values()), problems


def _images(row: dict[str, str]) -> list[str]:
    paths = [p for p in (row.get("paths") or "").split(";") if p]
    return [p for p in paths if Path(p).suffix.lower() in SOURCE_SUFFIXES]


def plan(
    columns: list[str],
    rows: list[dict[str, str]],
    template: NameTemplate,
    conversion: Conversion,
    approved: set[str] | None,
    sources: set[str],
) -> list[Deliverable]:
    """Every deliverable, named and checked; raises ExportRefused with every problem found."""
    if unknown := template.unknown(columns):
        shown = ", ".join(f"{{{f}}}" for f in unknown)
        known = ", ".join(c for c in columns if c != "paths")
        raise ExportRefused(
            [
                f"--name {template.text!r} names {shown}: not a column of results.csv ({known}) nor a "
                "built-in ({variant}, {n}, {ext}, {key12})"
            ]
        )
    chosen, problems = choose(rows, approved)
    out: list[Deliverable] = []
    for number, variant in chosen:
        row = rows[number - FIRST_ROW]
        images = _images(row)
        for n, source in enumerate(images, 1):
            label = _label(number, row, variant, n if len(images) > 1 else None)
            fmt = conversion.target(SOURCE_SUFFIXES[Path(source).suffix.lower()])
            if not source.startswith(f"{layout.IMAGES_DIR}/") or unsafe(source):
                problems.append(f"{label}: its path {source!r} is not under {layout.IMAGES_DIR}/ of OUT")
                continue
            if source not in sources:
                problems.append(f"{label}: its image {source} is missing from OUT")
                continue
            values = {**row, "variant": variant, "n": n, "ext": EXTENSIONS[fmt]}
            values["key12"] = key_digits(row.get("idempotency_key", ""))[:12]
            for number_column in ("request_index", "turn_index"):
                with contextlib.suppress(ValueError):
                    values[number_column] = int(row.get(number_column) or 0)
            try:
                name = template.render(values)
            except TemplateError as exc:
                problems.append(f"{label}: --name {template.text!r} does not fit its values: {exc}")
                continue
            if why := unsafe(name):
                problems.append(f"{label}: its name {name!r} is refused: {why}")
                continue
            if folded(name) == folded(EXPORT_CSV):
                problems.append(f"{label}: its name {name!r} is the list export writes")
                continue
            conv = dataclasses.replace(conversion, format=fmt)
            out.append(Deliverable(label, row, variant, n, source, name, conv))
    for first, second, name in clashes({d.label: d.name for d in out}):
        problems.append(f"{first} and {second}: both are named {name!r} (or one is a folder of the other)")
    if problems:
        raise ExportRefused(problems)
    return out


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
