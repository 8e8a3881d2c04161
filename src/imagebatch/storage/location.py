"""The storage seam: where a run's record (journal, files, results, lease) lives, behind one small
interface, `Location`, with two kinds: a local folder (`LocalFolder`: rename, fsync) and an object store
(`storage.objectstore.ObjectLocation`: whole-object PUTs, create-only and compare-and-swap writes, listing
for order). `open_location` picks the kind from `--out`.

`OutputStore` (work/store.py) speaks of records and asks a `Location` for bytes by name; names are
relative, `/`-separated (`images/job/0-abc.png`, `run.json`). A new backend is one more class with these
methods (and a scheme in `open_location`); the journal's segments and the lease are built from them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

OBJECT_SCHEMES = ("s3", "gs", "az")
"""The URL schemes `--out` takes for an object store (anything else is a local folder)."""


class OutputLockedError(RuntimeError):
    """The output location is held by another run."""


def is_object_url(out: str | os.PathLike[str]) -> bool:
    """Whether `--out` names an object store (`s3://bucket/prefix`, `gs://...`, `az://...`)."""
    text = str(out) if isinstance(out, str) else ""
    return text.split("://", 1)[0].lower() in OBJECT_SCHEMES and "://" in text


def shown_url(url: str) -> str:
    """`url` as a message may show it: without a user name, password, query or fragment (where a
    credential would hide), which `--out` refuses anyway."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    authority = authority.rpartition("@")[2]
    shown = f"{scheme}://{authority}{slash}{path}"
    return re.split(r"[?#]", shown, maxsplit=1)[0]


def local_path(out: str | os.PathLike[str]) -> Path:
    """A local `--out` as a path (`file://` accepted, as a plain path)."""
    return Path(os.fspath(out).removeprefix("file://"))


class Location(Protocol):
    """Named bytes in one place: the whole-object operations the output store is built on."""

    url: str
    """How messages name the place (a folder's path, or `s3://bucket/prefix`): never a credential."""

    def put_new(self, name: str, data: bytes) -> bool:
        """Write `name` only if it does not exist yet (create-only); False if it did."""

    def put(self, name: str, data: bytes) -> None:
        """Write `name` whole: a reader sees the old object or the new one, never a part."""

    def get(self, name: str) -> bytes | None:
        """The bytes of `name`, or None if there is no such object."""

    def exists(self, name: str) -> bool: ...

    def list(self, prefix: str) -> list[str]:
        """The names under `prefix` (a folder-like prefix ending in `/`), sorted."""

    def delete(self, name: str) -> None:
        """Remove `name` (no error if it is already gone)."""


@contextlib.contextmanager
def atomic_file(path: Path, *, sync: bool = True) -> Iterator[BinaryIO]:
    """A file to write that replaces `path` whole when the block ends (synced, unless `sync` is False: a
    file a crash may lose), or never if it raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; outputs are ordinary files others may read
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Write `data` to `path` so that a reader sees either the old file or the whole new one."""
    with atomic_file(path, sync=sync) as fh:
        fh.write(data)


class LocalFolder:
    """A local folder as a `Location`: a whole write is a synced temporary file renamed into place."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def put_new(self, name: str, data: bytes) -> bool:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return True

    def put(self, name: str, data: bytes) -> None:
        write_atomic(self.root / name, data)

    def get(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return (self.root / name).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)


def open_location(out: str | os.PathLike[str]) -> Location:
    """The `Location` `--out` names: an object store for `s3://`, `gs://`, `az://`, else a local folder."""
    if is_object_url(out):
        from imagebatch.storage.objectstore import ObjectLocation

        return ObjectLocation(str(out))
    return LocalFolder(local_path(out))


def json_object(raw: bytes) -> dict[str, Any] | None:
    """One line of a journal (a file's or a segment's): its JSON object, or None for a line that does not
    parse (torn by a crash) or is not an object; readers skip those."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
