"""`imagebatch export OUT --to DEST`: a run's images as deliverables, named by a template over the
manifest's columns, converted and sized with Pillow (`tasks.convert`), listed in `DEST/export.csv`.

Which images (the rule, also in the README):
- results.csv's rows whose status is `succeeded` (or `skipped`: succeeded in an earlier run), and of a
  row only its image files (a text route's .txt/.json are not deliverables);
- of a request (job, request, turn) with several variants (results.csv's `variant`, a missing column or
  cell being 1), one: the newest (highest) variant that succeeded; with `--approved-only`, the newest
  variant whose own key's last review decision is `approved` (a request none of whose variants is
  approved is left out, even if an older one was approved and then cleared). Without `--approved-only`
  decisions are not read: the newest image is delivered even if a reviewer rejected it.

The steps, each finished before the next, so that a refusal leaves DEST as it was:
1. plan: every name rendered and checked (`tasks.naming`): an unknown column, a name that is unsafe, two
   images with one name, a name where DEST has a file or folder in the way, a source file missing;
   refused with every row named, nothing written (DEST not even created);
2. stage: every deliverable converted into a staging folder (inside DEST for a local DEST, so the final
   rename is atomic; a local temporary folder for a bucket), on every core (`--workers`); an image that
   cannot be converted is refused with its row, and the staging folder removed;
3. compare: a deliverable whose name exists in DEST with the same bytes (sha256 of what would be written)
   is left alone; with other bytes it is refused (every such row named, nothing written) unless
   `--overwrite`;
4. publish: each file moved into place whole (a link or rename of a synced file; a whole-object PUT,
   create-only for a new name, in a bucket); then `export.csv`, if its bytes changed.
A second export with the same options therefore writes nothing. Files of an earlier export that this
one does not deliver are left where they are (export never deletes).

OUT and DEST are local folders or object-store URLs (`tasks.storage.open_location`). DEST may not be
OUT, nor inside OUT's images/, thumbs/ or chains/.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import hashlib
import importlib
import io
import os
import shutil
import sys
import tempfile
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal, TypeVar

from imagebatch.manifest.plan import key_digits

from . import layout
from .convert import EXTENSIONS, SOURCE_SUFFIXES, Conversion, Staged, StageJob, stage
from .csvcells import csv_rows, csv_value, write_csv
from .naming import DEFAULT_TEMPLATE, NameTemplate, TemplateError, clashes, folded, unsafe
from .storage import LocalFolder, Location, is_object_url, json_object, local_path, open_location

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
)
"""export.csv: the source's key and variant, the deliverable's path in DEST and its facts, then where
it came from (its row and image number, its path in OUT)."""
DELIVERED = ("succeeded", "skipped")
STAGING_PREFIX = ".imagebatch-export-"
IO_THREADS = 16
"""Reads and writes of an object store at once (fetching sources, hashing DEST's files, uploading)."""
SHOWN_PROBLEMS = 20
REVIEW_JSONL = "review.jsonl"
REVIEW_OBJECTS = "review/"
Pool = Literal["process", "thread"]

T = TypeVar("T")
R = TypeVar("R")


class ExportRefused(Exception):
    """The export cannot be made as asked; `problems` name the rows. Nothing was written, unless
    `written` (a name taken by someone else while the export was publishing)."""

    def __init__(self, problems: list[str], *, written: bool = False) -> None:
        self.problems = problems
        self.written = written
        super().__init__("\n".join(problems))


@dataclass(slots=True)
class Deliverable:
    """One image to deliver: where it comes from, what it becomes, and (once staged) its facts."""

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

    def line(self) -> str:
        if not self.delivered:
            return f"nothing to export to {self.dest}"
        replaced = f", {self.overwritten} replaced (--overwrite)" if self.overwritten else ""
        return (
            f"exported {self.delivered} image{'s' if self.delivered != 1 else ''} to {self.dest}: "
            f"{self.written} written, {self.unchanged} unchanged{replaced}; listed in {EXPORT_CSV}"
        )


# -- 1. plan --


def read_results(out: Location) -> tuple[list[str], list[dict[str, str]]]:
    """results.csv's columns and rows (cells as the run wrote them, before formula-proofing)."""
    data = out.get(layout.RESULTS_CSV)
    if data is None:
        raise ExportRefused(
            [f"{out.url} has no {layout.RESULTS_CSV} (not an output folder of a finished run)"]
        )
    text = data.decode("utf-8")
    header = next(csv.reader(io.StringIO(text)), [])
    return [csv_value(c) for c in header], list(csv_rows(text.splitlines(keepends=True)))


def decisions(out: Location) -> dict[str, str]:
    """Each key's last review decision ("approved", "rejected", "cleared"), from
    `imagebatch.tasks.decisions.read_decisions` when that module is installed; else read here from the
    same contract: `review.jsonl` lines (in a folder) and the objects under `review/` (in a bucket),
    each {key, variant, decision, note, reviewer, at}, in order, the last one for a key winning."""
    try:
        module = importlib.import_module("imagebatch.tasks.decisions")
    except ModuleNotFoundError as exc:
        if exc.name != "imagebatch.tasks.decisions":
            raise
    else:
        return {key: str(d.decision) for key, d in module.read_decisions(out).items()}
    blobs = [out.get(REVIEW_JSONL)] + [out.get(name) for name in out.list(REVIEW_OBJECTS)]
    last: dict[str, str] = {}
    for blob in blobs:
        for raw in (blob or b"").splitlines():
            obj = json_object(raw)
            if obj is not None and isinstance(obj.get("key"), str) and isinstance(obj.get("decision"), str):
                last[obj["key"]] = obj["decision"]
    return last


def _variant(row: dict[str, str]) -> int:
    cell = (row.get("variant") or "").strip()
    return int(cell) if cell else 1


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
    """The rows to deliver, as (row number from 1, variant), in results.csv's order; and the problems
    (a `variant` cell that is not a whole number). The rule is the module's docstring."""
    best: dict[tuple[str, str, str], tuple[int, int]] = {}
    problems = []
    for number, row in enumerate(rows, 1):
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
        row = rows[number - 1]
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


# -- 2. stage --


def windowed(executor: Executor, fn: Callable[[T], R], items: Iterable[T], window: int) -> Iterator[R]:
    """`fn` over `items` on `executor`, results in order, at most `window` submitted and not yet taken
    (`Executor.map` submits everything at once: 10,000 images' bytes in memory)."""
    pending: deque[Any] = deque()
    for item in items:
        pending.append(executor.submit(fn, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def _executor(pool: Pool, workers: int) -> Iterator[Executor | None]:
    """The converters: None (here, one at a time) for one worker; else a pool. Processes are spawned,
    never forked: the parent may be a Prefect flow with threads of its own."""
    if workers <= 1:
        yield None
        return
    executor: Executor
    if pool == "process":
        executor = ProcessPoolExecutor(workers, mp_context=get_context("spawn"))
    else:
        executor = ThreadPoolExecutor(workers, thread_name_prefix="imagebatch-export")
    try:
        yield executor
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def _missing_folders(root: Path) -> list[Path]:
    """The folders `root.mkdir(parents=True)` would create, deepest first."""
    missing = []
    for folder in (root, *root.parents):
        if folder.exists():
            break
        missing.append(folder)
    return missing


@contextlib.contextmanager
def _staging(dest: Location) -> Iterator[Path]:
    """A fresh folder the deliverables are made in: inside a local DEST (a hidden one, so moving a file
    into place is a rename on the same file system), or a local temporary folder for a bucket. Removed
    at the end; if the export fails, so is any folder made for DEST that is still empty."""
    created: list[Path] = []
    if isinstance(dest, LocalFolder):
        created = _missing_folders(dest.root)
        dest.root.mkdir(parents=True, exist_ok=True)
        path = dest.root / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
        path.mkdir()
    else:
        path = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX))
    try:
        yield path
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty
        raise
    shutil.rmtree(path, ignore_errors=True)


def _jobs(source: Location, deliverables: list[Deliverable], staging: Path) -> Iterator[StageJob]:
    """One job per deliverable: a local source by its path (the worker reads it), a bucket's by its
    bytes, fetched `IO_THREADS` at a time just ahead of the converters."""
    if isinstance(source, LocalFolder):
        for i, d in enumerate(deliverables):
            yield StageJob(i, str(source.root / d.source), str(staging / str(i)), d.conversion)
        return
    with ThreadPoolExecutor(IO_THREADS, thread_name_prefix="imagebatch-export-read") as fetch:
        blobs = windowed(fetch, source.get, (d.source for d in deliverables), 2 * IO_THREADS)
        for i, (d, data) in enumerate(zip(deliverables, blobs, strict=True)):
            yield StageJob(i, data, str(staging / str(i)), d.conversion)


def stage_all(
    source: Location, deliverables: list[Deliverable], staging: Path, workers: int, pool: Pool
) -> list[str]:
    """Convert every deliverable into `staging` (file `<index>`); the problems, by row."""
    problems = []
    with _executor(pool, min(workers, len(deliverables))) as executor:
        jobs = _jobs(source, deliverables, staging)
        made = map(stage, jobs) if executor is None else windowed(executor, stage, jobs, 4 * workers)
        for staged in made:
            d = deliverables[staged.index]
            d.staged = staged
            if staged.error:
                problems.append(f"{d.label}: {d.source} cannot be converted: {staged.error}")
    return problems


# -- 3. compare, 4. publish --


def _sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def compare(dest: Location, deliverables: list[Deliverable], existing: set[str]) -> dict[str, bool]:
    """For each deliverable whose name DEST holds: whether DEST's file has the bytes it would get."""
    there = [d for d in deliverables if d.name in existing]
    with ThreadPoolExecutor(IO_THREADS, thread_name_prefix="imagebatch-export-compare") as io_pool:
        digests = windowed(io_pool, lambda d: _sha256(dest.get(d.name)), there, 2 * IO_THREADS)
        return {
            d.name: digest == (d.staged.sha256 if d.staged else "")
            for d, digest in zip(there, digests, strict=True)
        }


def _place_local(staged: Path, target: Path, replace: bool) -> bool:
    """Move a staged file to `target` whole; a new name only if it is still free (a link, which fails
    if it exists). False if another file took the name meanwhile."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if replace:
        os.replace(staged, target)
        return True
    try:
        os.link(staged, target)
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links
        if target.exists():
            return False
        os.replace(staged, target)
    return True


def publish(
    dest: Location, deliverables: list[Deliverable], staging: Path, same: dict[str, bool]
) -> list[str]:
    """Write every deliverable DEST does not already hold as it is; the names taken meanwhile."""
    todo = [(i, d) for i, d in enumerate(deliverables) if not same.get(d.name, False)]

    def place(item: tuple[int, Deliverable]) -> str | None:
        i, d = item
        replace = d.name in same  # present with other bytes, and --overwrite (else refused before)
        if isinstance(dest, LocalFolder):
            placed = _place_local(staging / str(i), dest.root / d.name, replace)
        else:
            data = (staging / str(i)).read_bytes()
            placed = True
            if replace:
                dest.put(d.name, data)
            elif not dest.put_new(d.name, data):
                placed = dest.get(d.name) == data
        return None if placed else f"{d.label}: {d.name!r} appeared in DEST while exporting; not replaced"

    workers = 1 if isinstance(dest, LocalFolder) else IO_THREADS
    with ThreadPoolExecutor(workers, thread_name_prefix="imagebatch-export-write") as io_pool:
        return [p for p in windowed(io_pool, place, todo, 2 * workers) if p]


def export_csv(deliverables: list[Deliverable]) -> bytes:
    buf = io.StringIO()
    write_csv(buf, EXPORT_COLUMNS, (d.export_row() for d in deliverables))
    return buf.getvalue().encode()


# -- the whole --


def _contains(outer: str, inner: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _places(out: str, dest: str) -> tuple[Location, Location]:
    """OUT's and DEST's locations, checked: a bucket that answers, a DEST that can hold files and is
    not OUT nor inside the folders a run writes."""
    problems = []
    locations = []
    for option, where in (("OUT", out), ("--to", dest)):
        try:
            loc = open_location(where)
        except ValueError as exc:
            raise ExportRefused([f"{option} {where}: {exc}"]) from None
        check = getattr(loc, "check", None)
        if check is not None and (why := check()):
            problems.append(f"{option} {loc.url}: {why}")
        locations.append(loc)
    source, target = locations
    if isinstance(target, LocalFolder) and target.root.exists() and not target.root.is_dir():
        problems.append(f"--to {target.url} is a file, not a folder")
    if is_object_url(out) == is_object_url(dest):
        outer = source.url if is_object_url(out) else str(local_path(out).resolve())
        inner = target.url if is_object_url(dest) else str(local_path(dest).resolve())
        run_folders = (layout.IMAGES_DIR, layout.THUMBS_DIR, layout.CHAINS_DIR)
        if inner == outer or any(_contains(f"{outer}/{f}", inner) for f in run_folders):
            problems.append(f"--to {dest} is OUT or one of its run's folders: choose a folder of its own")
    if problems:
        raise ExportRefused(problems)
    return source, target


def export(
    out: str,
    dest: str,
    *,
    template: str | None = None,
    conversion: Conversion | None = None,
    approved_only: bool = False,
    overwrite: bool = False,
    workers: int | None = None,
    pool: Pool = "process",
) -> ExportSummary:
    """Export OUT's images to DEST (the module's docstring); raises ExportRefused (nothing written) or
    TemplateError (a `--name` that cannot be parsed)."""
    name_template = NameTemplate.parse(template or DEFAULT_TEMPLATE)
    source, target = _places(out, dest)
    columns, rows = read_results(source)
    approved = {k for k, d in decisions(source).items() if d == "approved"} if approved_only else None
    sources = set(source.list(f"{layout.IMAGES_DIR}/"))
    deliverables = plan(columns, rows, name_template, conversion or Conversion(), approved, sources)
    summary = ExportSummary(target.url, delivered=len(deliverables), deliverables=deliverables)
    if not deliverables:
        return summary
    existing = set(target.list(""))
    if problems := in_the_way(deliverables, existing):
        raise ExportRefused(problems)
    with _staging(target) as staging:
        if problems := stage_all(source, deliverables, staging, workers or default_workers(), pool):
            raise ExportRefused(problems)
        same = compare(target, deliverables, existing)
        if not overwrite and (differ := [d for d in deliverables if same.get(d.name) is False]):
            raise ExportRefused(
                [
                    f"{d.label}: DEST already has {d.name!r} with other bytes (--overwrite replaces it)"
                    for d in differ
                ]
            )
        if problems := publish(target, deliverables, staging, same):
            raise ExportRefused(problems, written=True)
    summary.unchanged = sum(same.values())
    summary.overwritten = len(same) - summary.unchanged
    summary.written = summary.delivered - summary.unchanged - summary.overwritten
    listing = export_csv(deliverables)
    if target.get(EXPORT_CSV) != listing:
        target.put(EXPORT_CSV, listing)
        summary.export_csv_written = True
    return summary


def export_main(args: argparse.Namespace) -> int:
    """`imagebatch export`: the summary on stdout; every problem on stderr (the rows named), exit 2 and
    nothing written; 1 if a read or write failed midway (what was written is whole; rerun it)."""
    try:
        conversion = Conversion.from_options(args.format, args.max_side, args.quality, args.background)
        summary = export(
            args.out,
            args.to,
            template=args.name,
            conversion=conversion,
            approved_only=args.approved_only,
            overwrite=args.overwrite,
            workers=args.workers,
        )
    except (TemplateError, ValueError) as exc:
        print(f"imagebatch export: {exc}", file=sys.stderr)
        return 2
    except ExportRefused as exc:
        for problem in exc.problems[:SHOWN_PROBLEMS]:
            print(problem, file=sys.stderr)
        if len(exc.problems) > SHOWN_PROBLEMS:
            print(f"... and {len(exc.problems) - SHOWN_PROBLEMS} more", file=sys.stderr)
        n = len(exc.problems)
        written = (
            "the files before it were written whole" if exc.written else f"nothing was written to {args.to}"
        )
        print(f"imagebatch export: {n} problem{'s' if n != 1 else ''}; {written}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"imagebatch export: stopped: {exc}; the files written are whole, rerun to finish",
            file=sys.stderr,
        )
        return 1
    print(summary.line())
    return 0
