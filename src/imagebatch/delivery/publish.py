"""Export's files into DEST (steps 3 to 5 of `delivery.export`): the staging folder the deliverables
are made in, the comparison with what DEST holds, each file moved into place whole, and the
confinement checks made before anything is written: no deliverable written, and no image of OUT read,
through a symbolic link that leaves its folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from imagebatch.delivery.aside import ASIDE_FOLDER, keep_path
from imagebatch.delivery.exportplan import Deliverable
from imagebatch.delivery.iomap import IO_THREADS, io_map
from imagebatch.delivery.listing import EXPORT_CSV
from imagebatch.storage.location import LocalFolder, Location, OutsideRootError, confined

STAGING_PREFIX = ".imagebatch-export-"


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def staging(dest: Location) -> Iterator[Path]:
    """A fresh folder the deliverables are made in (step 3), removed at the end however the export
    ends: inside a local DEST (which the lock made: `delivery.destlock`), hidden, so that the final
    move is a rename on one file system; a local temporary folder for a bucket."""
    if isinstance(dest, LocalFolder):
        path = dest.root / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
        path.mkdir()
    else:
        path = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def compare(dest: Location, todo: list[tuple[int, Deliverable]], existing: set[str]) -> dict[str, str | None]:
    """For each deliverable whose name DEST holds: the sha256 of DEST's file (None if it went meanwhile)."""
    there = [d for _, d in todo if d.name in existing]
    return dict(zip((d.name for d in there), io_map(lambda d: sha256(dest.get(d.name)), there), strict=True))


def _keep_local(target: Path, kept: Path) -> None:
    """A copy of DEST's `target` at `kept` (a hard link: the same file, which the replacement's rename
    then leaves there alone)."""
    try:
        os.link(target, kept)
    except FileNotFoundError:
        return
    except OSError:  # a file system without hard links
        shutil.copy2(target, kept)


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
    dest: Location,
    todo: list[tuple[int, Deliverable]],
    staging: Path,
    same: dict[str, bool],
    keep: set[str],
    when: str,
) -> list[str]:
    """Write every deliverable of `todo` DEST does not already hold as it is, first keeping the file
    each of `keep` replaces in `ASIDE_FOLDER/<when>/`; the names taken meanwhile."""
    changed = [(i, d) for i, d in todo if not same.get(d.name, False)]

    def place(item: tuple[int, Deliverable]) -> str | None:
        i, d = item
        replace = d.name in same  # present with other bytes: export's own, or --overwrite
        if isinstance(dest, LocalFolder):
            target = confined(dest.root, d.name)
            if d.name in keep:
                _keep_local(target, keep_path(dest, d.name, when))
            placed = _place_local(staging / str(i), target, replace)
        else:
            data = (staging / str(i)).read_bytes()
            placed = True
            if d.name in keep and (old := dest.get(d.name)) is not None:
                dest.put(f"{ASIDE_FOLDER}/{when}/{d.name}", old)
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


def read_outside(source: Location, deliverables: list[Deliverable]) -> list[str]:
    """The deliverables whose image in a local OUT is, or is reached through, a symbolic link that
    leads out of OUT: refused, never read (OUT's images are the run's, not whatever a link names)."""
    if not isinstance(source, LocalFolder):
        return []
    problems = []
    for d in deliverables:
        try:
            confined(source.root, d.source)
        except OutsideRootError:
            problems.append(
                f"{d.label}: its image {d.source} leads out of OUT through a symbolic link: not read"
            )
    return problems
