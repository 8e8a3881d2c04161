"""Loading a manifest: read it, check every row, and return the Manifest or every problem at once."""

from __future__ import annotations

import gc
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from . import sources
from .check import JobChecker
from .formats import FORMATS, detect_format
from .models import FileRef, Job, Manifest, ManifestError, ManifestFormat, Problem
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
    where, named, base = _located(path, format)
    roots = files_roots(files_root, where)
    with _no_cycle_collection():
        reading = _Reading(where, format, sheet if sheet is not None else named, base, roots, keep)
        if reading.checker.repeated:  # an id taken twice (or two ids of one hash): named on a second look
            if reading.spool is not None:
                reading.spool.discard()
            again = _Reading(where, format, reading.sheet, base, roots, keep, reading.checker.repeated)
            if again.raw.sha256 != reading.raw.sha256:
                why = "the manifest changed while it was read; check it again"
                raise ManifestError([Problem(None, None, None, why)], where)
            reading = again
    raw, checker = reading.raw, reading.checker
    problems = raw.problems + checker.problems
    if not reading.shapes.rows and not problems:
        problems.append(Problem(None, None, None, "the manifest has no jobs"))
    if problems:
        raise ManifestError(problems, where)
    assert reading.spool is not None
    return Manifest.model_construct(
        path=where,
        sha256=raw.sha256,
        format=raw.format,
        jobs=reading.spool.jobs(),
        metadata_columns=checker.metadata_columns,
        sheet=raw.sheet,
    )


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
    """One reading of a manifest: every row checked, the clean rows' jobs kept (`keep`) in a `JobSpool`
    until a row has a problem (the manifest is refused then: the spool is dropped, `spool` None).
    `repeated`: see `JobChecker`."""

    def __init__(
        self,
        where: FileRef,
        format: ManifestFormat | None,
        sheet: str | None,
        base: FileRef,
        roots: tuple[FileRef, ...],
        keep: Callable[[Job], bool] | None,
        repeated: Collection[int] = frozenset(),
    ) -> None:
        self.raw = raw = read_raw(where, format, sheet)
        self.sheet = sheet
        self.checker = checker = JobChecker(raw, base, roots, repeated)
        self.shapes = shapes = ShapeChecker(checker, raw)
        self.spool: JobSpool | None = None if checker.problems else JobSpool()
        for row in raw.rows:
            job = shapes.check(row)
            if self.spool is None:
                continue
            if checker.problems or raw.problems:
                self.spool.discard()
                self.spool = None
            elif job is not None and (keep is None or keep(job)):
                self.spool.add(job)
