"""A local folder as a `storage.backend.Backend`: held by `flock` (a run alone, the shards of a sharded run
shared, each shard its own lock alone), its records appended to JSON Lines files (`storage.appendlog`:
group commit), a shard's into files of its own that the next run holding the folder alone merges.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from imagebatch.storage import layout
from imagebatch.storage.appendlog import AppendLog, WriteWatch, append_synced, read_jsonl
from imagebatch.storage.bounded import (
    BadLine,
    check_records,
    check_size,
    open_record,
    record_lines,
    split_lines,
)
from imagebatch.storage.folderfiles import FolderFiles
from imagebatch.storage.location import RUN, OutputLockedError, atomic_file, confined, write_atomic

MERGE_BATCH_BYTES = 4 << 20
"""A shard's lines appended to the folder's file this many bytes at a time: a shard's file is never read
whole."""
_KEY_PREFIX = b'{"key":"'
LOOKED_AT = 0.02
"""Seconds between two tries of a lock another process may be looking at (`Folder._flock`)."""
SHARD_LOCK_PATIENCE = 0.5
"""Seconds a shard tries its own lock for before it is refused: its parent looks at the lock now and then
(`shard_held`: taken and let go at once) while the shard starts."""


class FolderBackend(FolderFiles):
    """One local folder's record; `shard` is `I-of-N` for a shard of a sharded run, else None."""

    release_wait = 0.0

    def __init__(self, root: Path, shard: str | None = None) -> None:
        super().__init__(root)
        self.shard = shard
        self.watch = WriteWatch()
        self.log = AppendLog(self.watch)
        self.spool_folder = self.root
        self.title = self.root.name
        self._conversations = _ConversationIndex(self.root)

    def path(self, kind: str) -> Path:
        """This store's own file of `kind` (`layout.JOURNAL`, `USAGE_LEDGER`, `CONVERSATIONS`)."""
        return self.root / layout.jsonl(kind, self.shard)

    # -- the hold --

    @contextlib.contextmanager
    def _flock(self, name: str, mode: int, what: str, patience: float = 0.0) -> Iterator[None]:
        """The lock `name`, taken at once or refused (`OutputLockedError`), but tried again for `patience`
        seconds: a look at whether it is held (`shard_held`) takes it for a moment."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / name).open("a") as fh:
            deadline = time.monotonic() + patience
            while True:
                try:
                    fcntl.flock(fh.fileno(), mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise OutputLockedError(f"{what} is using {self.root}") from None
                    time.sleep(LOOKED_AT)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the folder alone (a second run into it at the same time would send twice). The journals
        and usage files shards left (a sharded run killed before it merged them) are merged first: every
        later line goes after theirs."""
        with self._flock(layout.LOCK, fcntl.LOCK_EX, RUN):
            self.merge_shards()
            yield

    @contextlib.contextmanager
    def hold_sharded(self, shards: int) -> Iterator[None]:
        """Nothing: a sharded run's parent holds the folder alone (`hold`) at its start and its end, and
        its shards hold it shared meanwhile."""
        yield

    @contextlib.contextmanager
    def shard_hold(self) -> Iterator[None]:
        shard = str(self.shard)
        with (
            self._flock(layout.LOCK, fcntl.LOCK_SH, "a run that is not sharded"),
            self._flock(layout.shard_lock(shard), fcntl.LOCK_EX, f"shard {shard}", SHARD_LOCK_PATIENCE),
        ):
            yield

    def shut_out_shards(self) -> None:
        """Nothing: the folder is held alone meanwhile, and a shard takes it shared (refused)."""

    def in_use(self) -> str | None:
        """Each lock tried shared and non-blocking, and let go at once (a run holds its lock alone, a shard
        its own); a lock file never made means no run ever held it, and none is made."""
        names = [layout.LOCK, *(p.name for p in self.root.glob(layout.shard_lock("*")))]
        for name in names:
            try:
                fd = os.open(self.root / name, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return "a shard of a sharded run" if name != layout.LOCK else RUN
            finally:
                os.close(fd)  # lets go of the shared lock, if it was taken
        return None

    def shard_held(self, shard: str) -> bool:
        try:
            with self._flock(layout.shard_lock(shard), fcntl.LOCK_EX, f"shard {shard}"):
                return False
        except OutputLockedError:
            return True

    def merge_shards(self) -> int:
        """Append the shards' journal and usage lines to the folder's own files, synced, then remove the
        shards' files (only while the folder is held alone: no shard is writing). Returns the lines
        merged. A crash between the append and the removal merges them twice next time: a key's events
        repeat, which only counts its attempts twice."""
        merged = 0
        for kind in (layout.JOURNAL, layout.USAGE_LEDGER):
            for part in sorted(self.root.glob(layout.shard_jsonl(kind))):
                merged += _append_part(self.root / layout.jsonl(kind), part)
                part.unlink()
        return merged

    # -- records --

    def append(self, kind: str, record: dict[str, Any], *, sync: bool) -> None:
        self.log.append(self.path(kind), record, sync=sync)

    def sync(self) -> None:
        for kind in (layout.JOURNAL, layout.USAGE_LEDGER):
            self.log.sync(self.path(kind))

    def records(self, kind: str, bad: BadLine | None = None) -> Iterator[dict[str, Any]]:
        """The folder's usage ledger; or its journal, then the shards' journals not yet merged."""
        if kind == layout.USAGE_LEDGER:
            yield from read_jsonl(self.path(kind), bad)
            return
        for path in [self.root / layout.jsonl(kind), *sorted(self.root.glob(layout.shard_jsonl(kind)))]:
            yield from read_jsonl(path)

    def has_records(self) -> bool:
        return self.path(layout.JOURNAL).is_file()

    def keep_conversation(self, stem: str, key: str, record: dict[str, Any]) -> None:
        """A line of `conversations.jsonl`, appended and not synced: a file each would cost a request
        thread about 0.4 ms of CPU (a temporary file and a rename; bench/README.md), an append
        microseconds."""
        self.log.append(self.path(layout.CONVERSATIONS), {"key": key, **record}, sync=False)

    def kept_conversation(self, stem: str, key: str) -> bytes | None:
        return self._conversations.find(key)

    # -- whole objects --

    def make_ready(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.root):
            pass
        check_records(self.root)

    def prepare(self) -> None:
        for name in (layout.IMAGES_DIR, layout.CHAINS_DIR):
            (self.root / name).mkdir(parents=True, exist_ok=True)

    def files_exist(self, names: list[str], settled: bool) -> bool:
        """A stat each (by `os.path`: a `Path` made per name costs more than the stat)."""
        root = os.fspath(self.root)
        return all(os.path.isfile(os.path.join(root, p)) for p in names)

    def stamp(self, name: str) -> object:
        try:
            stat = (self.root / name).stat()
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size, stat.st_ino)

    def records_stamp(self) -> list[Any]:
        """Each record file's (name, size, modification time in ns, inode), the shards' not yet merged
        among them, or (name, None) for one that is not there: an append, an edit or a replacement
        changes it."""
        names = [layout.jsonl(layout.JOURNAL), layout.jsonl(layout.USAGE_LEDGER), *layout.STAMPED]
        names += sorted(p.name for kind in (layout.JOURNAL, layout.USAGE_LEDGER)
                        for p in self.root.glob(layout.shard_jsonl(kind)))  # fmt: skip
        stamps: list[Any] = []
        for name in names:
            try:
                st = (self.root / name).stat()
            except OSError:
                stamps.append([name, None])
                continue
            stamps.append([name, st.st_size, st.st_mtime_ns, st.st_ino])
        return stamps

    def replacing(self, name: str) -> contextlib.AbstractContextManager[BinaryIO]:
        return atomic_file(confined(self.root, name))

    def read_lines(self, name: str) -> Generator[bytes, None, None]:
        for _, raw in record_lines(self.root / name):
            yield raw.rstrip(b"\n")

    def put_derived(self, name: str, data: bytes) -> None:
        with contextlib.suppress(OSError):
            write_atomic(confined(self.root, name), data, sync=False)  # a lost one is remade, never torn

    # -- review decisions --

    def add_decision(self, line: bytes, stamp: str) -> str:
        """A line of review.jsonl, appended under the file's own lock and synced. review.jsonl linked out
        of OUT must not receive the decisions: refused, and a link made in its place after the check
        fails the open (`O_NOFOLLOW`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = confined(self.root, layout.REVIEW_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # A line a crash cut short must not glue onto this one: start on a fresh line if needed.
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)  # releases the lock
        return ""

    def decision_lines(self, bad: BadLine | None = None) -> Iterator[tuple[int, str, bytes]]:
        path = self.root / layout.REVIEW_FILE
        for number, raw in split_lines(self.get(layout.REVIEW_FILE) or b"", path, bad):
            yield number, f"{path} line {number}", raw

    def decision_tail(self) -> _ReviewFileTail:
        return _ReviewFileTail(self.root / layout.REVIEW_FILE)

    @contextlib.contextmanager
    def local_copy(self, folder: Path | None = None) -> Iterator[FolderCopy]:
        """The folder itself (`folder` is for a place that is not local: a folder has its files)."""
        yield FolderCopy(self.root)


class FolderCopy:
    """A local folder as its own copy: every file is there already, and what is written stays."""

    def __init__(self, root: Path) -> None:
        self.folder = root

    def fetch(self, names: Iterable[str], placeholders: Iterable[str] = ()) -> None:
        """Nothing: the files are there."""

    def publish(self, names: Iterable[str]) -> None:
        """Nothing: the files written are there."""

    def remove(self, names: Iterable[str]) -> None:
        for name in names:
            (self.folder / name).unlink(missing_ok=True)

    def top_names(self) -> list[str]:
        return sorted(p.name for p in self.folder.iterdir() if p.is_file()) if self.folder.is_dir() else []


class _ReviewFileTail:
    """A reader's place in review.jsonl: the bytes and lines read so far (a line refused is named by
    its number); a file that shrank was replaced, and is read whole again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._lines = 0

    def read(self) -> tuple[list[tuple[str, bytes]], bool]:
        if (fh := open_record(self.path)) is None:  # never blocked by a FIFO, nor a device read
            return [], False
        with fh:
            size = os.fstat(fh.fileno()).st_size
            start = self._offset if size >= self._offset else 0
            check_size(self.path, size - start)
            fh.seek(start)
            chunk = fh.read(size - start)
        complete = chunk.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset = start + complete
        first = 1 if start == 0 else self._lines + 1
        lines = chunk[:complete].splitlines()
        self._lines = first - 1 + len(lines)
        return [(f"{self.path} line {n}", raw) for n, raw in enumerate(lines, first)], start == 0

    def wrote(self, name: str, line: bytes) -> bool:
        """False: the line is read back with any another reviewer appended before it."""
        return False


class _ConversationIndex:
    """Where each key's conversation line is in a folder's conversation files (its offset: the lines stay
    on disk), read once, and past their last indexed line only for a key not found."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._where: dict[str, tuple[Path, int, int]] = {}
        self._read: dict[Path, int] = {}
        self._lock = threading.Lock()

    def find(self, key: str) -> bytes | None:
        with self._lock:
            where = self._where.get(key)
            if where is None:  # not read yet: read what was appended since
                self._index()
                where = self._where.get(key)
        return _read_at(*where) if where is not None else None

    def _index(self) -> None:
        """Add the (file, offset, length) of each key's last line (the folder's file, then the shards'),
        each file read from where the last call stopped; a line not yet ended (being written, or cut
        short by a crash) is left for later."""
        kind = layout.CONVERSATIONS
        for path in [self.root / layout.jsonl(kind), *sorted(self.root.glob(layout.shard_jsonl(kind)))]:
            if not path.is_file():
                continue
            with path.open("rb") as fh:
                offset = self._read.get(path, 0)
                fh.seek(offset)
                for line in fh:
                    if not line.endswith(b"\n"):
                        break
                    end = line.find(b'"', len(_KEY_PREFIX))
                    if line.startswith(_KEY_PREFIX) and end > 0:
                        key = line[len(_KEY_PREFIX) : end].decode("ascii", "replace")
                        self._where[key] = (path, offset, len(line))
                    offset += len(line)
                self._read[path] = offset


def _read_at(path: Path, offset: int, length: int) -> bytes | None:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read(length)
    except OSError:
        return None


def _append_part(target: Path, part: Path) -> int:
    """Append the complete lines of `part` (each within the bound) to `target`, a batch at a time, each
    batch synced; the lines appended. A crash between batches leaves a prefix appended, and the whole
    part merged again next time: as a crash before the removal, a key's events repeat."""
    batch: list[bytes] = []
    size = merged = 0
    for _, line in record_lines(part):
        batch.append(line)
        size += len(line)
        merged += 1
        if size >= MERGE_BATCH_BYTES:
            append_synced(target, batch)
            batch, size = [], 0
    if batch:
        append_synced(target, batch)
    return merged
