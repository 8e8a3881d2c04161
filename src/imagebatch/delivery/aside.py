"""The files an earlier export delivered that this one does not (its row changed since approval, its
image was rejected, its name changed): never left where they were, where uploading DEST would ship
them. They are moved into a dated folder under DEST (`ASIDE_FOLDER`: hidden, and a deliverable's name
can never start with a `.`, so it is never in the way of one), or removed with `--prune`.

Export destroys nothing it did not write. export.csv records each delivered file's sha256, and a file
is export's own only while DEST's file still has those bytes:
- a file of an earlier export's that has changed since (retouched by hand, even read-only) is moved
  aside, never removed, even with `--prune`, and the summary names it;
- a path export.csv lists that export cannot have written is left alone, whatever the list says: one
  no deliverable's name could be (`naming.unsafe`, or not a .png/.jpg/.webp: `budget.xlsx`), a row
  without a sha256, or (a local DEST) a path that leads out of DEST through a symbolic link or is one;
- a file `--overwrite` replaces (someone else's) is kept in the same dated folder first (`Backend.keep_copy`).
Every write under `ASIDE_FOLDER` is confined: DEST's `.superseded`, or a folder under it, that is a
symbolic link refuses the export (`aside_links`) rather than moving files wherever it leads.
Whatever else DEST holds is not export's and is not touched.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from imagebatch.delivery.convert import EXTENSIONS
from imagebatch.delivery.exportplan import ExportRefused
from imagebatch.delivery.iomap import io_map
from imagebatch.delivery.naming import unsafe
from imagebatch.storage.backend import Backend

ASIDE_FOLDER = ".superseded"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def stamp(now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> str:
    """The dated folder's name: the export's time in UTC, to the second."""
    return now().astimezone(UTC).strftime("%Y-%m-%dT%H-%M-%SZ")


MAX_SAME_SECOND = 99
"""Exports into one DEST within one second that each get a dated folder of their own (`fresh`)."""


def fresh(when: str, existing: set[str]) -> str:
    """`when`, else `when-2`, `when-3`...: a dated folder no file of DEST's (`existing`) is in yet, so
    that an export never moves a file onto one an earlier export of the same second set aside."""
    prefix = f"{ASIDE_FOLDER}/"
    taken = {n[len(prefix) :].split("/", 1)[0] for n in existing if n.startswith(prefix)}
    for k in range(1, MAX_SAME_SECOND + 1):
        if (folder := when if k == 1 else f"{when}-{k}") not in taken:
            return folder
    raise ExportRefused([f"DEST's {prefix}{when}-{MAX_SAME_SECOND} is taken: try again in a second"])


def name_room(dest: Backend, most: int) -> int:
    """The bytes a deliverable's name may take in DEST: `most` in a folder; in an object store's prefix,
    what an object key leaves (`MAX_OBJECT_KEY_BYTES`, in UTF-8) after the prefix and the folder a stale
    file is moved to (`ASIDE_FOLDER/<stamp>/`), so that no key is refused half-way through an export."""
    return dest.name_room(most, len(f"{ASIDE_FOLDER}/{stamp()}-{MAX_SAME_SECOND}/"))


def aside_links(dest: Backend, when: str) -> list[str]:
    """DEST's `ASIDE_FOLDER`, or its dated folder `when`, that is a symbolic link: refused before
    anything is written (a link to elsewhere would receive DEST's files). A link deeper in it is
    refused when a file would be moved through it (`Backend.move`)."""
    found = dest.links([ASIDE_FOLDER, f"{ASIDE_FOLDER}/{when}"])[:1]
    return [
        f"DEST's {name} is a symbolic link: export moves no file through it (remove the link)"
        for name in found
    ]


def _could_be_ours(dest: Backend, name: str, row: dict[str, str]) -> bool:
    """Whether export can have written `name` as export.csv's `row` says: a name a deliverable could
    have, a sha256 recorded, and (a local DEST) a regular file inside DEST."""
    if unsafe(name) or name.rsplit(".", 1)[-1].lower() not in EXTENSIONS.values():
        return False
    if not _SHA256.fullmatch(row.get("sha256", "")):
        return False
    return dest.plain_file(name)


@dataclass
class Stale:
    """The files an earlier export delivered that this one does not, by what may be done with them."""

    own: list[str] = field(default_factory=list)
    """Still the bytes export wrote: moved aside, or removed with `--prune`."""
    changed: list[str] = field(default_factory=list)
    """Changed since export wrote them: moved aside, never removed."""

    def __bool__(self) -> bool:
        return bool(self.own or self.changed)


def stale(
    dest: Backend, previous: dict[str, dict[str, str]], existing: set[str], delivered: set[str]
) -> Stale:
    """The files an earlier export listed as delivered, still in DEST, that this export does not
    deliver, each hashed against its record; paths export cannot have written are left out."""
    found = Stale()
    names = [n for n in sorted(previous) if n not in delivered and n in existing]
    names = [n for n in names if _could_be_ours(dest, n, previous[n])]
    for name, data in zip(names, io_map(dest.get, names), strict=True):
        if data is None:
            continue  # gone meanwhile
        own = hashlib.sha256(data).hexdigest() == previous[name]["sha256"]
        (found.own if own else found.changed).append(name)
    return found


def aside_url(dest: Backend, when: str) -> str:
    """The dated folder under DEST, as messages name it."""
    return f"{dest.url.rstrip('/')}/{ASIDE_FOLDER}/{when}/"


def set_aside(dest: Backend, files: Stale, *, prune: bool, when: str) -> str | None:
    """Move each of `files` into `ASIDE_FOLDER/<when>/` under DEST, or remove export's own ones
    (`prune`); the folder they went to, as messages name it (None when nothing was moved)."""
    folder = f"{ASIDE_FOLDER}/{when}"
    for name in files.own:
        dest.move(name, None if prune else f"{folder}/{name}")
    for name in files.changed:
        dest.move(name, f"{folder}/{name}")
    return aside_url(dest, when) if files.changed or not prune else None
