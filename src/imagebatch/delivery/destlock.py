"""One export into a DEST at a time: two at once would each set aside, replace and list files from what
it read of DEST before the other wrote, leaving files export.csv does not list (and so that no later
export sets aside) and summaries naming moves the other one made.

A local DEST is locked with `flock` on the folder itself (no file is left in it; the lock goes with the
process, however it ends). A bucket has no such lock: the export creates the object `LOCK_OBJECT` under
DEST's prefix (create-only, so one of two exports wins) and deletes it when it ends; an export killed
outright (SIGKILL, a lost machine) leaves it, and the next export is refused naming it: delete it once
no export is running. The second export is refused (`ExportRefused`, exit 2) before it reads DEST.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from imagebatch.delivery.exportplan import ExportRefused
from imagebatch.storage.location import LocalFolder, Location

LOCK_OBJECT = ".imagebatch-export.lock"


def _missing_folders(root: Path) -> list[Path]:
    """The folders `root.mkdir(parents=True)` would create, deepest first."""
    missing = []
    for folder in (root, *root.parents):
        if folder.exists():
            break
        missing.append(folder)
    return missing


@contextlib.contextmanager
def _folder_lock(dest: LocalFolder) -> Iterator[None]:
    """DEST's folder locked (made if missing); the folders made for it removed at the end if still
    empty, so that a refused export leaves no DEST behind."""
    created = _missing_folders(dest.root)
    dest.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExportRefused(
                [f"--to {dest.url}: another export into it is running; wait for it to finish"]
            ) from None
        yield
    finally:
        os.close(fd)
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty


@contextlib.contextmanager
def _object_lock(dest: Location) -> Iterator[None]:
    """`LOCK_OBJECT` created under DEST's prefix for the export's time, deleted at its end."""
    who = {"host": socket.gethostname(), "pid": os.getpid(), "since": datetime.now(UTC).isoformat()}
    body = json.dumps(who).encode()
    if not dest.put_new(LOCK_OBJECT, body):
        held = ""
        with contextlib.suppress(ValueError, TypeError, KeyError):
            other = json.loads(dest.get(LOCK_OBJECT) or b"")
            held = f" (since {other['since']}, host {other['host']}, pid {other['pid']})"
        lock = f"{dest.url.rstrip('/')}/{LOCK_OBJECT}"
        raise ExportRefused(
            [f"--to {dest.url}: another export into it is running{held}; if none is, delete {lock}"]
        )
    try:
        yield
    finally:
        if dest.get(LOCK_OBJECT) == body:  # ours still: never another's
            dest.delete(LOCK_OBJECT)


@contextlib.contextmanager
def exclusive(dest: Location) -> Iterator[None]:
    """DEST held by this export alone for the block; `ExportRefused` if another holds it."""
    lock = _folder_lock(dest) if isinstance(dest, LocalFolder) else _object_lock(dest)
    with lock:
        yield
