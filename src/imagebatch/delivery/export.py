"""`imagebatch export OUT --to DEST`: a run's images as deliverables, named by a template over the
manifest's columns (`delivery.exportplan`, `delivery.naming`), converted and sized with Pillow
(`delivery.convert`), listed in `DEST/export.csv`.

The steps, each finished before the next, so that a refusal leaves DEST as it was:
1. plan (`delivery.exportplan`): which images, every name rendered and checked: an unknown column, an
   unsafe name, a `/` inside a value (`--slug` makes clean names instead), two images with one name, a
   name where DEST has a file or folder in the way, a source missing from OUT; refused with every row
   named, nothing written (DEST not even created); and which deliverables are missing, and why;
2. hold DEST (`delivery.destlock`): one export into a DEST at a time, a second refused before it
   reads DEST; a local OUT's image that is or is reached through a symbolic link out of OUT refused;
3. reuse: a deliverable an earlier export made exactly as this one would (DEST's file, its source and
   the options all as export.csv lists them: conversion is deterministic) is not converted again, so a
   second export reads and hashes files but decodes none;
4. stage (`delivery.publish`): every other deliverable converted into a staging folder (inside a local
   DEST, hidden, so that the final move is a rename on one file system; a local temporary folder for a
   bucket), on every core (`workers`); an image that cannot be converted is refused with its row; the
   staging folder is removed however the export ends (a refusal, an error, Ctrl-C, SIGTERM);
5. compare: a deliverable whose name DEST holds with the same bytes (sha256 of what would be written)
   is left alone; with other bytes it replaces the file if an earlier export wrote it (DEST's
   export.csv lists that file with that sha256: a newly approved image replaces its stale one), and is
   otherwise refused (every such row named, nothing written) unless `overwrite`, which keeps the file
   it replaces in DEST's dated `.superseded/` folder and names it;
6. publish: each file moved into place whole (a hard link, or a rename for a replacement, of a synced
   file; a whole-object PUT, create-only for a new name, in a bucket); then the files an earlier export
   delivered that this one does not are set aside (`delivery.aside`: moved to a dated folder under
   DEST, or removed with `prune` while they still hold the bytes export wrote), so that DEST holds no
   file export.csv does not list; then `export.csv` (one row per deliverable of the manifest,
   delivered or missing: `delivery.listing`), if it changed.
A second export with the same options therefore writes nothing. No write goes into DEST through a
symbolic link that leaves it, nor into `.superseded` through any link.

OUT and DEST are local folders or object-store URLs (`storage.location.open_location`). DEST may not be
OUT, nor inside OUT's images/, thumbs/ or chains/.

Processes or threads: Pillow releases the GIL while it decodes, resizes and encodes, so threads convert
in parallel too; bench/README.md measures both, and `DEFAULT_POOL` is the faster.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

from imagebatch.delivery.aside import aside_links, aside_url, fresh, name_room, set_aside, stale, stamp
from imagebatch.delivery.convert import Staged, StageJob, stage
from imagebatch.delivery.destlock import exclusive
from imagebatch.delivery.exportplan import (
    Deliverable,
    ExportPlan,
    ExportRefused,
    Naming,
    changed_since_approval,
    in_the_way,
    plan,
    read_results,
)
from imagebatch.delivery.iomap import io_map, windowed
from imagebatch.delivery.listing import EXPORT_CSV, export_csv, listed, manifest_columns
from imagebatch.delivery.naming import DEFAULT_TEMPLATE, MAX_NAME_BYTES, NameTemplate
from imagebatch.delivery.options import ExportOptions
from imagebatch.delivery.publish import compare, leaving, publish, read_outside, sha256, staging
from imagebatch.delivery.summary import ExportSummary
from imagebatch.storage import layout
from imagebatch.storage.backend import Backend
from imagebatch.storage.kinds import open_location
from imagebatch.storage.location import shown_url
from imagebatch.work.decisions import decided, read_stars

Pool = Literal["process", "thread"]
DEFAULT_POOL: Pool = "thread"


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# -- 3. reuse --


def reuse(
    source: Backend,
    dest: Backend,
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
        if sha256(source.get(d.source)) != row.get("source_sha256"):
            return None
        if sha256(dest.get(d.name)) != row.get("sha256"):
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


# -- 4. stage --


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


def _jobs(source: Backend, todo: list[tuple[int, Deliverable]], staging: Path) -> Iterator[StageJob]:
    """One job per deliverable: a local source by its path (the worker reads it), a bucket's by its
    bytes, fetched `IO_THREADS` at a time just ahead of the converters."""
    sources = source.sources([d.source for _, d in todo])
    for (i, d), data in zip(todo, sources, strict=True):
        yield StageJob(i, data, str(staging / str(i)), d.conversion)


Progress = Callable[[int, int], None]
"""Told (converted so far, to convert) after each image."""


def stage_all(
    source: Backend,
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


# -- the whole --


def _contains(outer: str, inner: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _places(out: str, dest: str) -> tuple[Backend, Backend]:
    """OUT's and DEST's locations, checked: a bucket that answers, a DEST that can hold files and is
    not OUT nor inside the folders a run writes."""
    problems = []
    locations = []
    for option, where in (("OUT", out), ("--to", dest)):
        try:
            loc = open_location(where)
        except ValueError as exc:
            raise ExportRefused([f"{option} {shown_url(where)}: {exc}"]) from None
        if why := loc.check():
            problems.append(f"{option} {loc.url}: {why}")
        locations.append(loc)
    source, target = locations
    outer, inner = source.identity, target.identity
    run_folders = (layout.IMAGES_DIR, layout.THUMBS_DIR, layout.CHAINS_DIR)
    if inner == outer or any(_contains(f"{outer}/{f}", inner) for f in run_folders):
        problems.append(
            f"--to {shown_url(dest)} is OUT or one of its run's folders: choose a folder of its own"
        )
    if problems:
        raise ExportRefused(problems)
    return source, target


@dataclass(frozen=True)
class Made:
    """What `_make` did: deliverables DEST already held as they are, files an earlier export wrote that
    were replaced, and the files of someone else's `--overwrite` replaced (each kept first)."""

    unchanged: int
    replaced: int
    kept: list[str]


def _make(
    source: Backend,
    target: Backend,
    deliverables: list[Deliverable],
    previous: dict[str, dict[str, str]],
    existing: set[str],
    *,
    overwrite: bool,
    workers: int,
    pool: Pool,
    progress: Progress | None,
    when: str,
) -> Made:
    """Steps 3 to 6's files (the module's docstring): each deliverable reused, written or replaced; the
    counts `unchanged`, `replaced` (files an earlier export wrote) and the names `kept` (files of
    someone else's `overwrite` replaced, each kept in the dated folder first)."""
    reused = reuse(source, target, deliverables, existing, previous)
    todo = [(i, d) for i, d in enumerate(deliverables) if i not in reused]
    same: dict[str, bool] = {}
    own: set[str] = set()
    kept: list[str] = []
    if todo:
        with staging(target) as folder:
            if problems := stage_all(source, todo, folder, workers, pool, progress):
                raise ExportRefused(problems)
            digests = compare(target, todo, existing)
            made = {d.name: d.staged.sha256 if d.staged else "" for _, d in todo}
            same = {name: digest == made[name] for name, digest in digests.items()}
            own = {n for n, d in digests.items() if not same[n] and d == previous.get(n, {}).get("sha256")}
            kept = [d.name for _, d in todo if same.get(d.name) is False and d.name not in own]
            if kept and not overwrite:
                why = "already has {!r} with other bytes, not an earlier export's (--overwrite replaces it)"
                raise ExportRefused(
                    [f"{d.label}: DEST {why.format(d.name)}" for _, d in todo if d.name in kept]
                )
            if problems := publish(target, todo, folder, same, set(kept), when):
                raise ExportRefused(problems, written=True)
    return Made(len(reused) + sum(same.values()), len(own), kept)


def _deliver(
    source: Backend,
    target: Backend,
    made: ExportPlan,
    columns: list[str],
    summary: ExportSummary,
    options: dict[str, Any],
) -> None:
    """Steps 3 to 6 with DEST held (`delivery.destlock`), told to `summary`; `options` are export's
    `overwrite`, `prune`, `workers`, `pool`, `progress` and `when` (the dated folder's name)."""
    deliverables = made.deliverables
    existing = set(target.list(""))
    when = fresh(options["when"], existing)
    previous = listed(target)
    if not deliverables and not made.missing and not previous:
        return
    if (
        problems := in_the_way(deliverables, existing)
        + leaving(target, deliverables)
        + aside_links(target, when)
    ):
        raise ExportRefused(problems)
    if deliverables:
        done = _make(
            source, target, deliverables, previous, existing, overwrite=options["overwrite"],
            workers=options["workers"] or default_workers(), pool=options["pool"],
            progress=options["progress"], when=when,
        )  # fmt: skip
        summary.unchanged, summary.replaced, summary.kept = done.unchanged, done.replaced, done.kept
        summary.overwritten = len(done.kept)
        summary.written = summary.delivered - summary.unchanged - summary.replaced - summary.overwritten
        summary.aside_to = aside_url(target, when) if done.kept else None
    files = stale(target, previous, existing, {d.name for d in deliverables})
    summary.set_aside, summary.changed_aside, summary.pruned = files.own, files.changed, options["prune"]
    if files:
        summary.aside_to = set_aside(target, files, prune=options["prune"], when=when) or summary.aside_to
    listing = export_csv(manifest_columns(columns), made.rows(read_stars(source)))
    if target.get(EXPORT_CSV) != listing:
        target.put(EXPORT_CSV, listing)
        summary.export_csv_written = True


def export(
    out: str,
    dest: str,
    options: ExportOptions | None = None,
    *,
    pool: Pool = DEFAULT_POOL,
    progress: Progress | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> ExportSummary:
    """Export OUT's images to DEST as `options` ask (the module's docstring); raises ExportRefused
    (nothing written) or TemplateError (a `--name` that cannot be parsed). `now` dates the folder files
    are moved to."""
    asked = options or ExportOptions()
    approved_only = asked.approved_only
    parsed = NameTemplate.parse(asked.name or DEFAULT_TEMPLATE)
    source, target = _places(out, dest)
    naming = Naming(parsed, asked.conversion(), asked.slug, name_room(target, MAX_NAME_BYTES))
    columns, rows = read_results(source)
    decisions = decided(source)
    changed = changed_since_approval(out, rows, decisions) if approved_only else set()
    sources = set(source.list(f"{layout.IMAGES_DIR}/"))
    made = plan(
        columns, rows, naming, sources, decisions=decisions, approved_only=approved_only, changed=changed
    )
    if problems := read_outside(source, made.deliverables):
        raise ExportRefused(problems)
    summary = ExportSummary(
        target.url,
        len(made.deliverables),
        deliverables=made.deliverables,
        missing=made.missing,
        delivery_size=naming.conversion.delivery_size(),
        approved_only=approved_only,
    )
    how = {"overwrite": asked.overwrite, "prune": asked.prune, "workers": asked.workers, "pool": pool,
           "progress": progress, "when": stamp(now)}  # fmt: skip
    with exclusive(target):
        _deliver(source, target, made, columns, summary, how)
    return summary
