"""Export's files into DEST (steps 3 to 5 of `delivery.export`): the staging folder the deliverables
are made in, the comparison with what DEST holds, each file moved into place whole, and the
confinement checks made before anything is written: no deliverable written, and no image of OUT read,
through a symbolic link that leaves its folder.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

from imagebatch.delivery.aside import ASIDE_FOLDER
from imagebatch.delivery.exportplan import Deliverable
from imagebatch.delivery.iomap import io_map
from imagebatch.delivery.listing import EXPORT_CSV
from imagebatch.storage.backend import Backend

STAGING_PREFIX = ".imagebatch-export-"


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def staging(dest: Backend) -> contextlib.AbstractContextManager[Path]:
    """A fresh folder the deliverables are made in (step 3), removed at the end however the export
    ends: inside a local DEST (which the lock made: `delivery.destlock`), hidden, so that the final
    move is a rename on one file system; a local temporary folder for a bucket."""
    return dest.staging(STAGING_PREFIX)


def compare(dest: Backend, todo: list[tuple[int, Deliverable]], existing: set[str]) -> dict[str, str | None]:
    """For each deliverable whose name DEST holds: the sha256 of DEST's file (None if it went meanwhile)."""
    there = [d for _, d in todo if d.name in existing]
    return dict(zip((d.name for d in there), io_map(lambda d: sha256(dest.get(d.name)), there), strict=True))


def publish(
    dest: Backend,
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
        if d.name in keep:
            dest.keep_copy(d.name, f"{ASIDE_FOLDER}/{when}/{d.name}")
        placed = dest.place(staging / str(i), d.name, replace)
        return None if placed else f"{d.label}: {d.name!r} appeared in DEST while exporting; not replaced"

    return [p for p in io_map(place, changed, dest.write_threads) if p]


def leaving(dest: Backend, deliverables: list[Deliverable]) -> list[str]:
    """The deliverables whose path in a local DEST leads out of it through a symbolic link (a folder of
    DEST linked elsewhere), and export.csv if it does: refused before anything is written."""
    named = [(d.label, d.name) for d in deliverables] + [("DEST's listing", EXPORT_CSV)]
    return [
        f"{label}: its name {name!r} leads out of DEST through a symbolic link"
        for label, name in named
        if dest.leads_out(name)
    ]


def read_outside(source: Backend, deliverables: list[Deliverable]) -> list[str]:
    """The deliverables whose image in a local OUT is, or is reached through, a symbolic link that
    leads out of OUT: refused, never read (OUT's images are the run's, not whatever a link names)."""
    return [
        f"{d.label}: its image {d.source} leads out of OUT through a symbolic link: not read"
        for d in deliverables
        if source.leads_out(d.source)
    ]
