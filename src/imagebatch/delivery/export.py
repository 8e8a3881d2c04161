"""`imagebatch export OUT --to DEST`: a run's images as deliverables, named by a template over the
manifest's columns (`delivery.exportplan`, `delivery.naming`), converted and sized with Pillow
(`delivery.convert`), listed in `DEST/export.csv`.

The steps, each finished before the next, so that a refusal leaves DEST as it was:
1. plan (`delivery.exportplan`): which images, every name rendered and checked: an unknown column, an
   unsafe name, a `/` inside a value (`--slug` makes clean names instead), two images with one name, a
   name where DEST has a file or folder in the way, a source missing from OUT; refused with every row
   named, nothing written (DEST not even created); and which deliverables are missing, and why;
2. reuse: a deliverable an earlier export made exactly as this one would (DEST's file, its source and
   the options all as export.csv lists them: conversion is deterministic) is not converted again, so a
   second export reads and hashes files but decodes none;
3. stage: every other deliverable converted into a staging folder (inside a local DEST, hidden, so that
   the final move is a rename on one file system; a local temporary folder for a bucket), on every core
   (`workers`); an image that cannot be converted is refused with its row, the staging folder removed;
4. compare: a deliverable whose name DEST holds with the same bytes (sha256 of what would be written)
   is left alone; with other bytes it replaces the file if an earlier export wrote it (DEST's
   export.csv lists that file with that sha256: a newly approved image replaces its stale one), and is
   otherwise refused (every such row named, nothing written) unless `overwrite`;
5. publish: each file moved into place whole (a hard link, or a rename for a replacement, of a synced
   file; a whole-object PUT, create-only for a new name, in a bucket); then the files an earlier export
   delivered that this one does not are set aside (`delivery.aside`: moved to a dated folder under
   DEST, or removed with `prune`), so that DEST holds no file export.csv does not list; then
   `export.csv` (one row per deliverable of the manifest, delivered or missing: `delivery.listing`), if
   it changed.
A second export with the same options therefore writes nothing.

OUT and DEST are local folders or object-store URLs (`storage.location.open_location`). DEST may not be
OUT, nor inside OUT's images/, thumbs/ or chains/. Two exports into one DEST at once are not guarded
against (each file is still whole; the last export.csv wins).

Processes or threads: Pillow releases the GIL while it decodes, resizes and encodes, so threads convert
in parallel too; bench/README.md measures both, and `DEFAULT_POOL` is the faster.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal, TypeVar

from imagebatch.delivery.aside import name_room, set_aside, stale, stamp
from imagebatch.delivery.convert import Conversion, Staged, StageJob, stage
from imagebatch.delivery.exportplan import (
    Deliverable,
    ExportRefused,
    Naming,
    changed_since_approval,
    in_the_way,
    plan,
    read_results,
)
from imagebatch.delivery.listing import EXPORT_CSV, export_csv, listed, manifest_columns
from imagebatch.delivery.naming import DEFAULT_TEMPLATE, MAX_NAME_BYTES, NameTemplate
from imagebatch.delivery.summary import ExportSummary
from imagebatch.storage import layout
from imagebatch.storage.kinds import open_location
from imagebatch.storage.location import (
    LocalFolder,
    Location,
    OutsideRootError,
    confined,
    is_object_url,
    local_path,
    shown_url,
)
from imagebatch.work.decisions import decided

STAGING_PREFIX = ".imagebatch-export-"
IO_THREADS = 16
"""Reads and writes at once: fetching a bucket's sources, hashing DEST's files, uploading."""
Pool = Literal["process", "thread"]
DEFAULT_POOL: Pool = "thread"

T = TypeVar("T")
R = TypeVar("R")


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


def io_map(fn: Callable[[T], R], items: list[T], threads: int = IO_THREADS) -> Iterator[R]:
    """`fn` over `items` on `threads` I/O threads, in order (file and object-store reads, hashing)."""
    with ThreadPoolExecutor(
        max(1, min(threads, len(items))), thread_name_prefix="imagebatch-export-io"
    ) as ex:
        yield from windowed(ex, fn, items, 2 * threads)


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


# -- 2. reuse --


def reuse(
    source: Location,
    dest: Location,
    deliverables: list[Deliverable],
    existing: set[str],
    previous: dict[str, dict[str, str]],
) -> set[int]:
    """The deliverables (by index) an earlier export made as this one would make them, their facts
    filled in from DEST's export.csv (`previous`): its row for the name names the same source and
    conversion, and both the source and DEST's file still hash to what it lists."""
    candidates = []
    for i, d in enumerate(deliverables):
        row = previous.get(d.name)
        if (
            d.name in existing
            and row is not None
            and row.get("source") == d.source
            and row.get("conversion") == d.conversion.describe()
        ):
            candidates.append((i, d, row))

    def still(item: tuple[int, Deliverable, dict[str, str]]) -> Staged | None:
        i, d, row = item
        if _sha256(source.get(d.source)) != row.get("source_sha256"):
            return None
        if _sha256(dest.get(d.name)) != row.get("sha256"):
            return None
        try:
            size, width, height = int(row["bytes"]), int(row["width"]), int(row["height"])
        except (KeyError, ValueError):
            return None
        small = row.get("below_size") == "yes"
        return Staged(i, row["sha256"], size, width, height, row["source_sha256"], small)

    reused = set()
    for (i, d, _), staged in zip(candidates, io_map(still, candidates), strict=True):
        if staged is not None:
            d.staged = staged
            reused.add(i)
    return reused


# -- 3. stage --


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
    """A fresh folder the deliverables are made in (step 3). Removed at the end; if the export fails,
    so is any folder made for DEST that is still empty."""
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


def _jobs(source: Location, todo: list[tuple[int, Deliverable]], staging: Path) -> Iterator[StageJob]:
    """One job per deliverable: a local source by its path (the worker reads it), a bucket's by its
    bytes, fetched `IO_THREADS` at a time just ahead of the converters."""
    if isinstance(source, LocalFolder):
        for i, d in todo:
            yield StageJob(i, str(source.root / d.source), str(staging / str(i)), d.conversion)
        return
    blobs = io_map(source.get, [d.source for _, d in todo])
    for (i, d), data in zip(todo, blobs, strict=True):
        yield StageJob(i, data, str(staging / str(i)), d.conversion)


Progress = Callable[[int, int], None]
"""Told (converted so far, to convert) after each image."""


def stage_all(
    source: Location,
    todo: list[tuple[int, Deliverable]],
    staging: Path,
    workers: int,
    pool: Pool,
    progress: Progress | None = None,
) -> list[str]:
    """Convert each deliverable of `todo` into `staging` (the file `<index>`); the problems, by row."""
    problems = []
    by_index = dict(todo)
    with _executor(pool, min(workers, len(todo))) as executor:
        jobs = _jobs(source, todo, staging)
        made = map(stage, jobs) if executor is None else windowed(executor, stage, jobs, 4 * workers)
        for done, staged in enumerate(made, 1):
            d = by_index[staged.index]
            d.staged = staged
            if staged.error:
                problems.append(f"{d.label}: {d.source} cannot be converted: {staged.error}")
            if progress is not None:
                progress(done, len(todo))
    return problems


# -- 4. compare, 5. publish --


def compare(dest: Location, todo: list[tuple[int, Deliverable]], existing: set[str]) -> dict[str, str | None]:
    """For each deliverable whose name DEST holds: the sha256 of DEST's file (None if it went meanwhile)."""
    there = [d for _, d in todo if d.name in existing]
    return dict(zip((d.name for d in there), io_map(lambda d: _sha256(dest.get(d.name)), there), strict=True))


def _place_local(staged: Path, target: Path, replace: bool) -> bool:
    """Move a staged file to `target` whole; a new name only while it is still free (a hard link fails
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
    dest: Location, todo: list[tuple[int, Deliverable]], staging: Path, same: dict[str, bool]
) -> list[str]:
    """Write every deliverable of `todo` DEST does not already hold as it is; the names taken meanwhile."""
    changed = [(i, d) for i, d in todo if not same.get(d.name, False)]

    def place(item: tuple[int, Deliverable]) -> str | None:
        i, d = item
        replace = d.name in same  # present with other bytes, and --overwrite (else refused before)
        if isinstance(dest, LocalFolder):
            placed = _place_local(staging / str(i), confined(dest.root, d.name), replace)
        else:
            data = (staging / str(i)).read_bytes()
            placed = True
            if replace:
                dest.put(d.name, data)
            elif not dest.put_new(d.name, data):
                placed = dest.get(d.name) == data
        return None if placed else f"{d.label}: {d.name!r} appeared in DEST while exporting; not replaced"

    threads = 1 if isinstance(dest, LocalFolder) else IO_THREADS
    return [p for p in io_map(place, changed, threads) if p]


def leaving(dest: Location, deliverables: list[Deliverable]) -> list[str]:
    """The deliverables whose path in a local DEST leads out of it through a symbolic link (a folder of
    DEST linked elsewhere), and export.csv if it does: refused before anything is written."""
    if not isinstance(dest, LocalFolder):
        return []
    problems = []
    for label, name in [(d.label, d.name) for d in deliverables] + [("DEST's listing", EXPORT_CSV)]:
        try:
            confined(dest.root, name)
        except OutsideRootError:
            problems.append(f"{label}: its name {name!r} leads out of DEST through a symbolic link")
    return problems


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
            raise ExportRefused([f"{option} {shown_url(where)}: {exc}"]) from None
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
            problems.append(
                f"--to {shown_url(dest)} is OUT or one of its run's folders: choose a folder of its own"
            )
    if problems:
        raise ExportRefused(problems)
    return source, target


def _make(
    source: Location,
    target: Location,
    deliverables: list[Deliverable],
    previous: dict[str, dict[str, str]],
    existing: set[str],
    *,
    overwrite: bool,
    workers: int,
    pool: Pool,
    progress: Progress | None,
) -> dict[str, int]:
    """Steps 2 to 5's files (the module's docstring): each deliverable reused, written or replaced; the
    counts `unchanged`, `replaced` (files an earlier export wrote) and `overwritten` (`overwrite`)."""
    reused = reuse(source, target, deliverables, existing, previous)
    todo = [(i, d) for i, d in enumerate(deliverables) if i not in reused]
    same: dict[str, bool] = {}
    own: set[str] = set()
    if todo:
        with _staging(target) as staging:
            if problems := stage_all(source, todo, staging, workers, pool, progress):
                raise ExportRefused(problems)
            digests = compare(target, todo, existing)
            made = {d.name: d.staged.sha256 if d.staged else "" for _, d in todo}
            same = {name: digest == made[name] for name, digest in digests.items()}
            own = {n for n, d in digests.items() if not same[n] and d == previous.get(n, {}).get("sha256")}
            if not overwrite and (
                differ := [d for _, d in todo if same.get(d.name) is False and d.name not in own]
            ):
                why = "already has {!r} with other bytes, not an earlier export's (--overwrite replaces it)"
                raise ExportRefused([f"{d.label}: DEST {why.format(d.name)}" for d in differ])
            if problems := publish(target, todo, staging, same):
                raise ExportRefused(problems, written=True)
    unchanged = len(reused) + sum(same.values())
    return {
        "unchanged": unchanged,
        "replaced": len(own),
        "overwritten": len(same) - sum(same.values()) - len(own),
    }


def export(
    out: str,
    dest: str,
    *,
    template: str | None = None,
    conversion: Conversion | None = None,
    approved_only: bool = False,
    overwrite: bool = False,
    slug: bool = False,
    prune: bool = False,
    workers: int | None = None,
    pool: Pool = DEFAULT_POOL,
    progress: Progress | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> ExportSummary:
    """Export OUT's images to DEST (the module's docstring); raises ExportRefused (nothing written) or
    TemplateError (a `--name` that cannot be parsed). `now` dates the folder stale files go to."""
    parsed = NameTemplate.parse(template or DEFAULT_TEMPLATE)
    source, target = _places(out, dest)
    naming = Naming(parsed, conversion or Conversion(), slug, name_room(target, MAX_NAME_BYTES))
    columns, rows = read_results(source)
    decisions = decided(source)
    changed = changed_since_approval(out, rows, decisions) if approved_only else set()
    sources = set(source.list(f"{layout.IMAGES_DIR}/"))
    made = plan(
        columns, rows, naming, sources, decisions=decisions, approved_only=approved_only, changed=changed
    )
    deliverables = made.deliverables
    summary = ExportSummary(
        target.url,
        len(deliverables),
        deliverables=deliverables,
        missing=made.missing,
        delivery_size=naming.conversion.delivery_size(),
        approved_only=approved_only,
    )
    existing = set(target.list(""))
    previous = listed(target)
    if not deliverables and not made.missing and not previous:
        return summary
    if problems := in_the_way(deliverables, existing) + leaving(target, deliverables):
        raise ExportRefused(problems)
    if deliverables:
        counts = _make(source, target, deliverables, previous, existing, overwrite=overwrite,
                       workers=workers or default_workers(), pool=pool, progress=progress)  # fmt: skip
        summary.unchanged, summary.replaced = counts["unchanged"], counts["replaced"]
        summary.overwritten = counts["overwritten"]
        summary.written = summary.delivered - summary.unchanged - summary.replaced - summary.overwritten
    summary.set_aside = stale(previous, existing, {d.name for d in deliverables})
    if summary.set_aside:
        summary.aside_to = set_aside(target, summary.set_aside, prune=prune, when=stamp(now))
    listing = export_csv(manifest_columns(columns), made.rows())
    if target.get(EXPORT_CSV) != listing:
        target.put(EXPORT_CSV, listing)
        summary.export_csv_written = True
    return summary
