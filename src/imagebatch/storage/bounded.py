"""The one reader of an output location's records (results.csv, run.json, the journal, the usage ledger,
review.jsonl): within a size bound, and never blocked by what is not a file.

Someone else may have put anything in OUT: results.csv as a FIFO (every reader would wait forever for a
writer), a record linked to `/dev/zero` (a read without end, until memory runs out), a line a gigabyte
long. Every read of a record opens it here, so each of these is refused the same way, by a
`RecordError` whose message names the file: the commands print that one line and exit 2.

The bounds (docs/output-folder.md "Reading the records"):
- `MAX_RECORD_LINE_BYTES`, a line of a JSON Lines record (the journal, the usage ledger, review.jsonl):
  imagebatch writes lines of a few hundred bytes to a few kilobytes;
- `MAX_RECORD_BYTES`, a record read whole (results.csv, review.jsonl, run.json; in a bucket, any object:
  a journal segment, the compacted journal): well above a million-request run's results.csv.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from imagebatch.storage import layout

MAX_RECORD_LINE_BYTES = 1 << 20
"""The longest line of a JSON Lines record read (1 MiB, its newline included)."""
MAX_RECORD_BYTES = 2 << 30
"""The largest record (or object) read whole (2 GiB)."""

BadLine = Callable[[int], None]
"""Told the number of each line a reader skipped as bad (over the bound, or not a JSON object)."""

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


class RecordError(OSError):
    """A record imagebatch refuses to read: not a regular file, or over its bound. The message is one line
    naming the file. An OSError, so that every command that reports an unreadable record reports this."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _kind(mode: int) -> str | None:
    """What a file of `mode` is when it is not a regular file, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def refused(where: object, why: str) -> RecordError:
    """The refusal of the record `where`, saying `why`."""
    return RecordError(f"{where} {why}: not read")


def open_record(path: Path) -> BinaryIO | None:
    """`path` opened for reading, or None if there is no such file; `RecordError` if it is (or a link
    leads to) anything but a regular file.

    The type is checked before opening (opening a device may do something), and the open itself does not
    block (`O_NONBLOCK`: a FIFO without a writer would wait forever); the open file is checked again
    (`fstat`), so a FIFO put in its place between the check and the open is caught."""
    try:
        before = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if (kind := _kind(before.st_mode)) is not None:
        raise refused(path, f"is {kind}, not a file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        now = os.fstat(fd)
        if (kind := _kind(now.st_mode)) is not None:
            raise refused(path, f"is {kind}, not a file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def is_record(path: Path) -> bool:
    """Whether there is a file at `path`: False if nothing is there; `RecordError` if something other
    than a regular file is (a FIFO is refused, not taken for a missing record)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    if (kind := _kind(mode)) is not None:
        raise refused(path, f"is {kind}, not a file")
    return True


def check_records(folder: Path) -> None:
    """`RecordError` for the first record of a local output folder that is there but is not a file (the
    journal, usage ledger and conversations, a shard's too, results.csv, run.json, review.jsonl): for a
    run to refuse before it starts, rather than when its replay reaches it."""
    kinds = (layout.JOURNAL, layout.USAGE_LEDGER, layout.CONVERSATIONS)
    names = [layout.RUN_JSON, layout.RESULTS_CSV, layout.REVIEW_FILE, *map(layout.jsonl, kinds)]
    shards = [path for kind in kinds for path in folder.glob(layout.shard_jsonl(kind))]
    for path in [*(folder / name for name in names), *shards]:
        is_record(path)


def check_size(where: object, size: int, limit: int = MAX_RECORD_BYTES) -> None:
    """`RecordError` if a record of `size` bytes is over `limit` (for a bucket's object, whose size is
    known before a byte of it is read)."""
    if size > limit:
        raise refused(where, f"is {size:,} bytes, over the {limit:,} a record is read up to")


def read_record(path: Path, limit: int = MAX_RECORD_BYTES) -> bytes | None:
    """The whole of the record at `path` (at most `limit` bytes), or None if there is none."""
    fh = open_record(path)
    if fh is None:
        return None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        check_size(path, size, limit)
        data = fh.read(size + 1)  # a buffer of the file's size: `read(limit + 1)` would ask for the bound
        while size < len(data) <= limit and (more := fh.read(min(GROWN_READ, limit + 1 - len(data)))):
            data += more  # a file that grew since: read on, still no more than the bound
    check_size(path, len(data), limit)
    return data


GROWN_READ = 1 << 20
"""What `read_record` reads at a time past the size the file had when it was opened."""


def record_lines(path: Path, bad: BadLine | None = None) -> Iterator[tuple[int, bytes]]:
    """The complete lines of the JSON Lines record at `path`, numbered from 1, each with its newline, read
    one at a time
    (none if there is no such file); a last line without its newline (a write a crash cut short, or one
    still being written) is left out.

    A line over `MAX_RECORD_LINE_BYTES` is never held whole: with `bad`, it is read past and `bad` told
    its number; without, `RecordError` names the file and the line."""
    fh = open_record(path)
    if fh is None:
        return
    with fh:
        number = 0
        while raw := fh.readline(MAX_RECORD_LINE_BYTES + 1):
            number += 1
            if len(raw) <= MAX_RECORD_LINE_BYTES and raw.endswith(b"\n"):
                yield number, raw
            elif len(raw) <= MAX_RECORD_LINE_BYTES:
                return  # torn last line
            elif bad is None:
                raise _long_line(path, number)
            else:
                _skip_line(fh)
                bad(number)


def split_lines(data: bytes, where: object, bad: BadLine | None = None) -> Iterator[tuple[int, bytes]]:
    """The lines of a record read whole (a bucket's object, review.jsonl), with `record_lines`'s bound
    and its `bad`; a last line without its newline is kept (an object is never half-written)."""
    for number, raw in enumerate(data.splitlines(), 1):
        if len(raw) < MAX_RECORD_LINE_BYTES:
            yield number, raw
        elif bad is None:
            raise _long_line(where, number)
        else:
            bad(number)


def _long_line(where: object, number: int) -> RecordError:
    return refused(where, f"has a line over {MAX_RECORD_LINE_BYTES:,} bytes (line {number:,})")


def _skip_line(fh: BinaryIO) -> None:
    """Read past the rest of the current line, a bounded chunk at a time."""
    while chunk := fh.readline(MAX_RECORD_LINE_BYTES):
        if chunk.endswith(b"\n"):
            return
