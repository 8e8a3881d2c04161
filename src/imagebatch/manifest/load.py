"""Loading a manifest: read it, check every row, and return the Manifest or every problem at once."""

from __future__ import annotations

import gc
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import sources
from .check import JobChecker
from .formats import FORMATS, detect_format
from .models import FileRef, Job, Manifest, ManifestError, ManifestFormat, Problem
from .plan import JobTally, PlanSummary
from .read import RawManifest, split_sheet
from .shapes import ShapeChecker
from .spool import JobSpool


def read_raw(path: Path | str, format: str | None = None, sheet: str | None = None) -> RawManifest:
    """Read `path` into raw rows by its format's reader (`formats.FORMATS`): text, or a workbook's sheet
    (default: its first visible one) or a Parquet file, read from a local file only; raise ManifestError
    when it cannot be read as a manifest."""
    fmt = FORMATS[detect_format(path, format)]
    if isinstance(path, str) and fmt.local:
        why = f"an .{fmt.name} manifest is read from a file, not a bucket: copy {path} here, or use CSV"
        raise ManifestError([Problem(None, None, None, why)], path)
    return fmt.read(path, fmt.name, sheet)


def absolute(text: str | Path) -> str:
    """A manifest or files root as a deployment's parameter names it (its runs start in another working
    folder): an object's URL as it is, a path made absolute (`~`, `..` and symlinks resolved)."""
    return str(text) if sources.is_url(text) else str(Path(text).expanduser().resolve())


def files_roots(folders: Sequence[str | Path] | None, path: FileRef | None = None) -> tuple[FileRef, ...]:
    """The operator's extra files roots (--files-root, a deployment's `files_root`), resolved (`~`, `..`,
    symlinks; relative to the working folder), or URL prefixes (`s3://bucket/refs`: objects under it;
    not looked up here, each object is when a reference names it); ManifestError for one that is not a
    folder."""
    roots: list[FileRef] = []
    problems: list[Problem] = []
    for folder in folders or ():
        text = str(folder)
        if "\x00" in text or not text.strip():
            problems.append(Problem(None, None, None, f"files root {text!r} is not a folder name"))
            continue
        if sources.is_url(text):
            try:
                roots.append(sources.normalise(text))
            except ValueError as exc:
                problems.append(Problem(None, None, None, f"files root {text}: {exc}"))
            continue
        root = Path(text).expanduser().resolve()
        if not root.is_dir():
            problems.append(Problem(None, None, None, f"files root {text} ({root}) is not a folder"))
        else:
            roots.append(root)
    if problems:
        raise ManifestError(problems, path)
    return tuple(roots)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector paused while a manifest is read and checked: the rows, cells and jobs it
    makes (millions of small objects for 100,000 rows, held to the end, none in a cycle) would otherwise
    set it off again and again to walk them all, a third of a CSV's load time. Restored on the way out."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load_manifest(
    path: FileRef,
    *,
    format: ManifestFormat | None = None,
    files_root: Sequence[str | Path] | None = None,
    sheet: str | None = None,
    keep: Callable[[Job], bool] | None = None,
) -> Manifest:
    """Read and check a manifest; raise ManifestError with every problem found, or return it.

    `format` overrides the format the extension implies. Relative file paths in the manifest resolve
    against the manifest's folder. Each referenced file is read once, whatever the number of rows.
    Every reference image and mask must resolve inside the manifest's folder or one of `files_root`
    (the operator's choice), or inside the narrower folders of the manifest's own `defaults.files_root`.
    `path` may be an object's URL (`s3://bucket/m.csv`): its references then resolve under its prefix, in
    its store (`sources`), and must stay inside that prefix or a `files_root` URL prefix.

    A workbook's sheet is `sheet`, or named after `#` in `path` (`catalog.xlsx#Products`), else its first
    visible sheet (`manifest.tables`).

    `keep` (a shard's share: `run.shards.shard_keeps`) chooses the jobs the manifest holds: every row is
    still checked, and the manifest refused for any row's problem, but a job not kept is dropped as soon
    as it is made, so a shard never holds the others' jobs.

    What is held stays small whatever the manifest's size: a CSV or JSON Lines file is read as its rows
    are checked (`textfile`), each job kept is written to a temporary file as it is made (`spool`), and
    each id is remembered by its hash (`ids`; a manifest where two rows' ids share one is read twice).
    """
    reading = _checked(path, format, files_root, sheet, keep, counted=False)
    raw, checker = reading.raw, reading.checker
    assert reading.spool is not None
    return Manifest.model_construct(
        path=reading.where,
        sha256=raw.sha256,
        format=raw.format,
        jobs=reading.spool.jobs(),
        metadata_columns=checker.metadata_columns,
        sheet=raw.sheet,
    )


@dataclass(frozen=True)
class ManifestSummary:
    """A manifest checked in full and its plan counted (`summarise_manifest`): what a plain `imagebatch
    validate` prints, with no job kept."""

    path: FileRef
    """The manifest file, absolute, or the object's URL."""
    sha256: str
    """sha256 (hex) of the manifest file's bytes."""
    format: ManifestFormat
    sheet: str | None
    """XLSX: the sheet read."""
    plan: PlanSummary
    """What its plan would send: `summarise_jobs` of the jobs `load_manifest` would return."""


def summarise_manifest(
    path: FileRef,
    *,
    format: ManifestFormat | None = None,
    files_root: Sequence[str | Path] | None = None,
    sheet: str | None = None,
) -> ManifestSummary:
    """Read and check a manifest exactly as `load_manifest` does (every row, every problem raised in one
    ManifestError), but count its plan as the rows are checked rather than keep its jobs: a row whose
    shape was already checked is counted by its shape's job (`ShapeChecker`, `counted`), no job is made
    only to be counted, written to disk and read back."""
    reading = _checked(path, format, files_root, sheet, None, counted=True)
    raw = reading.raw
    assert reading.tally is not None
    return ManifestSummary(reading.where, raw.sha256, raw.format, raw.sheet, reading.tally.summary())


def _checked(
    path: FileRef,
    format: ManifestFormat | None,
    files_root: Sequence[str | Path] | None,
    sheet: str | None,
    keep: Callable[[Job], bool] | None,
    *,
    counted: bool,
) -> _Reading:
    """The reading of a manifest with no problem (read twice when two rows' ids share a hash: `ids`);
    ManifestError with every problem otherwise."""
    where, named, base = _located(path, format)
    roots = files_roots(files_root, where)
    with _no_cycle_collection():
        reading = _Reading(where, format, sheet if sheet is not None else named, base, roots, keep, counted)
        if reading.checker.repeated:  # an id taken twice (or two ids of one hash): named on a second look
            reading.drop()
            repeated = reading.checker.repeated
            again = _Reading(where, format, reading.sheet, base, roots, keep, counted, repeated)
            if again.raw.sha256 != reading.raw.sha256:
                why = "the manifest changed while it was read; check it again"
                raise ManifestError([Problem(None, None, None, why)], where)
            reading = again
    problems = reading.raw.problems + reading.checker.problems
    if not reading.shapes.rows and not problems:
        problems.append(Problem(None, None, None, "the manifest has no jobs"))
    if problems:
        raise ManifestError(problems, where)
    return reading


def _located(path: FileRef, format: ManifestFormat | None) -> tuple[FileRef, str | None, FileRef]:
    """The manifest's file (absolute) or object's URL (normalised), the sheet its name gives after `#`,
    and the folder or prefix its references resolve against."""
    where: FileRef
    named: str | None = None
    if sources.is_url(path):
        text = str(path)
        if ".xlsx#" in text.lower():  # a workbook's sheet: a workbook is refused from a bucket (read_raw)
            text = text[: text.lower().index(".xlsx#") + 5]
        try:
            where = sources.normalise(text)
        except ValueError as exc:
            raise ManifestError([Problem(None, None, None, str(exc))], text) from None
        base: FileRef = sources.parent(where)
    else:
        where, named = split_sheet(Path(path).absolute(), format)
        base = where.parent
    return where, named, base


class _Reading:
    """One reading of a manifest: every row checked, the clean rows' jobs kept (`keep`) in a `JobSpool`,
    or counted in a `JobTally` (`counted`), until a row has a problem (the manifest is refused then: the
    spool is dropped, `spool` and `tally` None). `repeated`: see `JobChecker`."""

    def __init__(
        self,
        where: FileRef,
        format: ManifestFormat | None,
        sheet: str | None,
        base: FileRef,
        roots: tuple[FileRef, ...],
        keep: Callable[[Job], bool] | None,
        counted: bool,
        repeated: Collection[int] = frozenset(),
    ) -> None:
        self.where = where
        self.raw = raw = read_raw(where, format, sheet)
        self.sheet = sheet
        self.checker = checker = JobChecker(raw, base, roots, repeated)
        self.shapes = shapes = ShapeChecker(checker, raw, counted=counted)
        self.spool: JobSpool | None = None
        self.tally: JobTally | None = None
        add: Callable[[Job], None] | None
        if checker.problems:
            add = None
        elif counted:
            self.tally = JobTally()
            add = self.tally.add
        else:
            self.spool = JobSpool()
            add = self.spool.add
        for row in raw.rows:
            job = shapes.check(row)
            if add is None:
                continue
            if checker.problems or raw.problems:
                self.drop()
                add = None
            elif job is not None and (keep is None or keep(job)):
                add(job)

    def drop(self) -> None:
        """Forget the jobs kept or counted: the manifest is refused, or read again."""
        if self.spool is not None:
            self.spool.discard()
        self.spool = self.tally = None
