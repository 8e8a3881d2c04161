"""A manifest file's bytes, read in blocks and never whole: a text manifest (CSV, JSON Lines) is decoded
and checked block by block as its rows are, its sha256 computed on the same pass; an object's bytes
(`s3://...`) are first spooled to a nameless temporary file, their sha256 computed as they arrive.

Every way a file cannot be read becomes one problem naming it and the cause (`ManifestError`), never a
traceback: a missing file, a folder, a file that is not UTF-8 (with the line of its first bad byte).
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from .models import ManifestError, Problem

BLOCK = 1 << 20
"""Bytes read at a time; a block is decoded up to its last line end (a longer line is read whole)."""


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """ManifestError naming the cause for what keeps `path` from being read."""
    try:
        yield
    except FileNotFoundError:
        raise ManifestError([Problem(None, None, None, f"manifest not found: {path}")], path) from None
    except IsADirectoryError:
        raise ManifestError(
            [Problem(None, None, None, f"{path} is a folder, not a manifest")], path
        ) from None
    except OSError as exc:
        raise ManifestError(
            [Problem(None, None, None, f"cannot read {path}: {exc.strerror}")], path
        ) from None
    except ValueError:  # a path holding a NUL character (a deployment's parameter, say)
        nul = Problem(None, None, None, "the manifest's path holds a NUL character")
        raise ManifestError([nul]) from None


def read_file(path: Path, limit: int | None = None) -> bytes:
    """The manifest file's bytes, whole (a workbook's or Parquet file's reader needs them so); ManifestError
    naming the cause when it cannot be read, or (`limit`) when it is `limit` bytes or more (checked before
    it is read)."""
    with _reading(path):
        if limit is not None and (size := path.stat().st_size) >= limit:
            too_big = f"the file is {size:,} bytes; a manifest must be under {limit:,}"
            raise ManifestError([Problem(None, None, None, too_big)], path)
        return path.read_bytes()


def open_bytes(path: Path | str) -> tuple[IO[bytes], str | None]:
    """The manifest's bytes open for reading from their start, and their sha256 when it is already known
    (an object's, computed as it was spooled); ManifestError when they cannot be read."""
    if isinstance(path, str):
        return _spool_object(path)
    with _reading(path):
        file = open(path, "rb")  # closed by `TextBlocks`, at its end or when dropped
        if path.is_dir():  # some systems open a folder for reading
            file.close()
            raise IsADirectoryError(path)
        return file, None


def _spool_object(url: str) -> tuple[IO[bytes], str]:
    """The manifest object's bytes in a nameless temporary file, and their sha256; one problem naming it
    and the cause when it cannot be read, or when it is `sources.MANIFEST_LIMIT` bytes or more."""
    from . import sources

    def problem(why: str) -> ManifestError:
        return ManifestError([Problem(None, None, None, why)], url)

    digest = hashlib.sha256()
    size = 0
    spool = tempfile.TemporaryFile(prefix="imagebatch-manifest-")  # returned open
    try:
        chunks = sources.read_stream(url)
        if chunks is None:
            raise problem(f"manifest not found: {url}")
        for chunk in chunks:
            size += len(chunk)
            if size >= sources.MANIFEST_LIMIT:
                limit = sources.MANIFEST_LIMIT
                raise problem(f"{url} is {limit:,} bytes or more; a manifest must be under {limit:,} bytes")
            digest.update(chunk)
            spool.write(chunk)
        spool.seek(0)
    except OSError as exc:  # a missing bucket, refused credentials, an unreachable store, a full disk
        spool.close()
        raise problem(exc.strerror or str(exc)) from None
    except BaseException:
        spool.close()
        raise
    return spool, digest.hexdigest()


class TextBlocks:
    """A text manifest's decoded text, block by block (each ends at a line end `\\n`, or at the file's
    end), read as it is iterated, once. What the reading learns is kept here: whether the text holds a NUL
    character (`nul`: set before the block holding it is given out), and, once the last block is given
    out, the bytes' sha256 (`sha256`)."""

    def __init__(self, path: Path | str, *, escapes: bool) -> None:
        """`escapes`: a JSON escape of NUL (`\\u0000`) counts as one."""
        self.path = path
        self._file, self.sha256 = open_bytes(path)
        self._escapes = escapes
        self.nul = False
        self.lines = 0
        """Line ends (`\\n`) in the blocks given out so far."""

    def __iter__(self) -> Iterator[str]:
        with self._file as file, _reading(Path(str(self.path))):
            digest = hashlib.sha256() if self.sha256 is None else None
            rest = b""
            first = True
            while data := file.read(BLOCK):
                if digest is not None:
                    digest.update(data)
                data = rest + data if rest else data
                cut = data.rfind(b"\n") + 1
                if not cut:
                    rest = data
                    continue
                rest = data[cut:]
                yield self._decoded(data[:cut], first)
                first = False
            if digest is not None:
                self.sha256 = digest.hexdigest()
        if rest:
            yield self._decoded(rest, first)

    def _decoded(self, data: bytes, first: bool) -> str:
        try:
            text = data.decode("utf-8-sig" if first else "utf-8")
        except UnicodeDecodeError as exc:
            line = self.lines + data[: exc.start].count(b"\n") + 1
            raise ManifestError(
                [
                    Problem(
                        line,
                        None,
                        None,
                        f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x} cannot be decoded)",
                        "save it as UTF-8 (in a spreadsheet program: 'CSV UTF-8')",
                    )
                ],
                self.path,
            ) from None
        self.lines += text.count("\n")
        if "\x00" in text or (self._escapes and "\\u0000" in text):
            self.nul = True
        return text
