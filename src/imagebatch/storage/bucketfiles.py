"""An object store prefix's whole-file operations for a writer that delivers into it (an export's DEST) or
reads it (its OUT): held alone by a lock object created only if absent, files made in a local temporary
folder and PUT (create-only for a new name), kept and moved aside by copy and delete. An object has no
link to follow out. `storage.bucket.BucketBackend` is one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from imagebatch.storage.location import OutputLockedError
from imagebatch.storage.objectstore import READ_THREADS, ObjectLocation

if TYPE_CHECKING:
    from imagebatch.storage.backend import MakeThumbnail, Served


class BucketFiles(ObjectLocation):
    """The delivery side of an object store's prefix (`storage.backend.Backend`'s "files delivered"
    methods)."""

    write_threads = READ_THREADS
    """Objects PUT this many at a time: each is a request's round trip."""

    @property
    def identity(self) -> str:
        return self.url

    def name_room(self, most: int, reserved: int) -> int:
        """What an object key leaves (`MAX_OBJECT_KEY_BYTES`, in UTF-8) after the prefix and `reserved`."""
        from imagebatch.storage.location import MAX_OBJECT_KEY_BYTES

        taken = len(self.prefix.encode()) + (1 if self.prefix else 0) + reserved
        return min(most, MAX_OBJECT_KEY_BYTES - taken)

    @contextlib.contextmanager
    def exclusive(self, name: str, what: str) -> Iterator[None]:
        """The object `name` created for the block's time (create-only, so one of two writers wins), and
        deleted at its end if it is still ours; a writer killed outright leaves it, and the next one is
        refused naming it: delete it once no such writer runs."""
        who = {"host": socket.gethostname(), "pid": os.getpid(), "since": datetime.now(UTC).isoformat()}
        body = json.dumps(who).encode()
        if not self.put_new(name, body):
            held = ""
            with contextlib.suppress(ValueError, TypeError, KeyError):
                other = json.loads(self.get(name) or b"")
                held = f" (since {other['since']}, host {other['host']}, pid {other['pid']})"
            lock = f"{self.url.rstrip('/')}/{name}"
            raise OutputLockedError(f"{what} is running{held}; if none is, delete {lock}")
        try:
            yield
        finally:
            if self.get(name) == body:  # ours still: never another's
                self.delete(name)

    @contextlib.contextmanager
    def staging(self, prefix: str) -> Iterator[Path]:
        """A local temporary folder."""
        path = Path(tempfile.mkdtemp(prefix=prefix))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def sources(self, names: list[str]) -> Iterator[str | bytes | None]:
        """Each object's bytes (None: not there), fetched a window at a time just ahead of the reader."""
        return self.iter_many(names)

    def leads_out(self, name: str) -> bool:
        return False

    def plain_file(self, name: str) -> bool:
        return True

    def link(self, name: str) -> str | None:
        return f"{self.url}/{name}"

    def image(self, name: str) -> bytes | None:
        return self.get(name)

    def thumbnail(self, name: str, source: str | Path | None, make: MakeThumbnail) -> Served | None:
        """The one a run made as each image arrived; else the image itself, never fetched to be made here."""
        for served in (name, source if isinstance(source, str) else None):
            if served is not None and (data := self.get(served)) is not None:
                return data, served
        return None

    def links(self, names: Iterable[str]) -> list[str]:
        return []

    def place(self, staged: Path, name: str, replace: bool) -> bool:
        """A PUT; create-only for a new name: False if another object took it meanwhile."""
        data = staged.read_bytes()
        if replace:
            self.put(name, data)
            return True
        return self.put_new(name, data) or self.get(name) == data

    def keep_copy(self, name: str, kept: str) -> None:
        if (old := self.get(name)) is not None:
            self.put(kept, old)

    def move(self, name: str, to: str | None) -> None:
        if to is not None and (data := self.get(name)) is not None:
            self.put(to, data)
        self.delete(name)
