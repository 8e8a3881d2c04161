"""The files an earlier export delivered that this one does not (its row changed since approval, its
image was rejected, its name changed): never left where they were, where uploading DEST would ship
them. They are moved into a dated folder under DEST (`ASIDE_FOLDER`: hidden, and a deliverable's name
can never start with a `.`, so it is never in the way of one), or removed with `--prune`.

Only files DEST's export.csv lists as delivered are touched: whatever else DEST holds is not export's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from imagebatch.storage.location import MAX_OBJECT_KEY_BYTES, LocalFolder, Location, is_object_url

ASIDE_FOLDER = ".superseded"


def stamp(now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> str:
    """The dated folder's name: the export's time in UTC, to the second."""
    return now().astimezone(UTC).strftime("%Y-%m-%dT%H-%M-%SZ")


def name_room(dest: Location, most: int) -> int:
    """The bytes a deliverable's name may take in DEST: `most` in a folder; in an object store's prefix,
    what an object key leaves (`MAX_OBJECT_KEY_BYTES`, in UTF-8) after the prefix and the folder a stale
    file is moved to (`ASIDE_FOLDER/<stamp>/`), so that no key is refused half-way through an export."""
    if not is_object_url(dest.url):
        return most
    from imagebatch.storage.objectstore import split_url  # loaded already: DEST is an object store

    prefix = split_url(dest.url)[2]
    aside = len(f"{ASIDE_FOLDER}/{stamp()}/")
    return min(most, MAX_OBJECT_KEY_BYTES - len(prefix.encode()) - (1 if prefix else 0) - aside)


def stale(previous: dict[str, dict[str, str]], existing: set[str], delivered: set[str]) -> list[str]:
    """The files an earlier export listed as delivered, still in DEST, that this export does not deliver."""
    return sorted(name for name in previous if name in existing and name not in delivered)


def _remove_empty_folders(root: Path, folder: Path) -> None:
    """Remove `folder` and its parents up to `root` while they are empty (a product's folder whose
    every file went aside)."""
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def set_aside(dest: Location, names: list[str], *, prune: bool, when: str) -> str | None:
    """Move each of `names` into `ASIDE_FOLDER/<when>/` under DEST (its path kept below it), or remove
    it (`prune`); the folder they went to, as messages name it (None when removed)."""
    folder = None if prune else f"{ASIDE_FOLDER}/{when}"
    for name in names:
        if isinstance(dest, LocalFolder):
            path = dest.root / name
            if folder is None:
                path.unlink(missing_ok=True)
            else:
                target = dest.root / folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileNotFoundError):  # gone meanwhile: nothing to set aside
                    os.replace(path, target)
            _remove_empty_folders(dest.root, path.parent)
            continue
        if folder is not None and (data := dest.get(name)) is not None:
            dest.put(f"{folder}/{name}", data)
        dest.delete(name)
    return None if folder is None else f"{dest.url.rstrip('/')}/{folder}/"
