"""Reference images and masks named by a manifest: confined to the files root, read once (regular files
only, a bounded read), inspected by their bytes, size-checked per route against the spec's limits
(`gateway.constants`). A reference may be an object in a store (`s3://bucket/key`): the same rules, its
URL resolved and confined by `sources`, its bytes read through the store."""

from __future__ import annotations

import difflib
import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebatch.gateway.constants import (
    MAX_UPLOAD_BYTES,
)
from imagebatch.gateway.imagefile import ImageInfo, NotAnImageError, inspect_image

from . import sources
from .models import (
    MAX_NATIVE_IMAGE_BYTES,
    FileRef,
)

# --- files -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileFacts:
    """What one referenced file is; read once per manifest however many rows name it."""

    path: FileRef
    """Resolved absolute path, or the object's normalised URL."""
    size: int | None = None
    """Bytes, when the file could be looked at. Limits depend on the route: see `size_fault`."""
    sha256: str | None = None
    info: ImageInfo | None = None
    error: str | None = None
    """Why the file cannot be used, or None."""
    hint: str | None = None


def _looks_like(data: bytes) -> str | None:
    kinds = {b"GIF8": "GIF", b"BM": "BMP", b"II*\x00": "TIFF", b"MM\x00*": "TIFF", b"%PDF": "PDF"}
    for magic, kind in kinds.items():
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    if data[4:12] in (b"ftypheic", b"ftypheix", b"ftypmif1", b"ftypavif"):
        return "HEIC/AVIF"
    return None


READ_LIMIT = max(MAX_UPLOAD_BYTES, MAX_NATIVE_IMAGE_BYTES)
"""The most bytes any route takes in one file (exclusive): the bound of every read of a reference image
or mask, at check time and again at send time. The route's own limit is applied by `size_fault`."""
SIZE_HINT = "downscale or recompress it"


def size_fault(size: int | None, route: str | None) -> str | None:
    """Why a file of `size` bytes cannot be sent on `route` (a manifest route, None when unknown), or None.

    On the images route the limit is the service's ("each under 50 MB", the edits route). The spec shows
    no limit for inline images on the native route: there the limit is imagebatch's own guard,
    `MAX_NATIVE_IMAGE_BYTES`, and the message says so.
    """
    if size is None:
        return None
    if route == "images":
        if size < MAX_UPLOAD_BYTES:
            return None
        return (
            f"the file is {size:,} bytes; files must be under {MAX_UPLOAD_BYTES:,} bytes on the images "
            "route (the service's limit)"
        )
    if route == "native":
        if size < MAX_NATIVE_IMAGE_BYTES:
            return None
        return (
            f"the file is {size:,} bytes; reference images must be under {MAX_NATIVE_IMAGE_BYTES:,} bytes "
            "on the native route (imagebatch's own guard: the spec gives no limit for inline images there)"
        )
    limit = min(MAX_UPLOAD_BYTES, MAX_NATIVE_IMAGE_BYTES)
    if size < limit:
        return None
    return (
        f"the file is {size:,} bytes; files must be under {limit:,} bytes (the service's limit on the "
        "images route, imagebatch's own guard on the native route)"
    )


class InputFileError(Exception):
    """A reference image or mask that cannot be read as one: not a regular file, too big, or unreadable."""

    def __init__(self, message: str, size: int | None = None) -> None:
        super().__init__(message)
        self.size = size
        """The file's size (or the bytes read before the limit) when it is too big, else None."""


_OPEN_FLAGS = os.O_RDONLY
for _flag in ("O_NONBLOCK", "O_NOCTTY", "O_NOFOLLOW", "O_CLOEXEC", "O_BINARY"):
    _OPEN_FLAGS |= getattr(os, _flag, 0)
_CHUNK = 1 << 20


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "is a FIFO (named pipe), not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a regular file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file"
    return "is not a regular file"


def _too_big(size: int, limit: int, *, at_least: bool = False) -> InputFileError:
    more = " or more" if at_least else ""
    return InputFileError(f"the file is {size:,} bytes{more}; each file must be under {limit:,} bytes", size)


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at `path`, which must be under `limit` bytes; else `InputFileError`
    (`FileNotFoundError` when there is no such file).

    Only a regular file is read: the file is opened without blocking (a FIFO would otherwise wait for a
    writer for ever) and looked at through its open descriptor (`fstat`), so a device, a FIFO, a socket or
    a folder is refused without a byte read. The size is checked twice: by `fstat` (a 4 GB file named by
    mistake is not read to be refused) and by the bytes actually read, at most `limit` of them, so a file
    that grows while it is read (or that reports a size of 0) costs at most `limit` bytes of memory.
    `path` is a resolved path: a symlink in its last component (one swapped in since) is not followed.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise InputFileError("is a folder, not a file") from None
    except OSError as exc:
        raise InputFileError(f"cannot read the file: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError(_kind(st.st_mode))
        if st.st_size >= limit:
            raise _too_big(st.st_size, limit)
        chunks: list[bytes] = []
        total = 0
        while total < limit and (chunk := os.read(fd, min(_CHUNK, limit - total))):
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise InputFileError(f"cannot read the file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if total >= limit:
        raise _too_big(total, limit, at_least=True)
    return b"".join(chunks)


def read_reference(ref: FileRef, limit: int) -> bytes:
    """The bytes of a reference image or mask: `read_regular` for a path; for an object, its bytes
    when its size is under `limit` (`InputFileError` otherwise, with nothing read), `FileNotFoundError`
    when there is no such object, and `InputFileError` naming the cause when the store cannot be read."""
    if isinstance(ref, Path):
        return read_regular(ref, limit)
    try:
        got = sources.read_object(ref, limit)
    except OSError as exc:  # a missing bucket, refused credentials, an unreachable store
        raise InputFileError(exc.strerror or str(exc)) from None
    if got is None:
        raise FileNotFoundError(ref)
    data, size = got
    if size >= limit:
        raise _too_big(size, limit)
    return data


def resolve(text: str, base: FileRef) -> FileRef:
    """What a manifest's reference `text` names, from the manifest's folder (or prefix) `base`: a URL
    (an object URL in `text`, or any reference of a manifest in a store: `sources.join`), else a path
    (`resolve_reference`). ValueError for a URL that climbs above its bucket."""
    if isinstance(base, str) or sources.is_url(text):
        return sources.join(base, text) if isinstance(base, str) else sources.normalise(text)
    return resolve_reference(text, base)


def resolve_reference(text: str, base_dir: Path) -> Path:
    """The absolute path a manifest's file reference (no NUL character in it) names: relative to
    `base_dir`, `~` expanded, backslashes read as separators (a manifest written on Windows resolves the
    same everywhere), `..` and symlinks resolved."""
    path = Path(os.path.normpath(base_dir / Path(text.replace("\\", "/")).expanduser()))
    return path.resolve()


def outside(path: FileRef, roots: Sequence[FileRef]) -> bool:
    """Whether the resolved `path` lies outside every one of the resolved folders `roots` (an object's
    URL: outside every URL prefix of them)."""
    if isinstance(path, str):
        return not any(isinstance(root, str) and sources.inside(path, root) for root in roots)
    return not any(isinstance(root, Path) and path.is_relative_to(root) for root in roots)


def declared_roots(
    declared: Any, base_dir: FileRef, allowed: tuple[FileRef, ...]
) -> tuple[tuple[FileRef, ...], list[tuple[str, str | None]]]:
    """The folders every reference image and mask of a manifest must resolve inside, and the faults
    (message, hint) of its `defaults.files_root` (`declared`; None when it has none).

    `allowed` (the manifest's folder and the operator's --files-root folders, resolved), unless the manifest
    names folders of its own: then those, each of which must itself lie inside `allowed`. A manifest may so
    narrow its files root, never widen it: one written by someone else cannot pull in files from elsewhere
    on the machine, however it spells their paths.
    """
    if declared is None:
        return allowed, []
    texts = [declared] if isinstance(declared, str) else declared
    if not (isinstance(texts, list) and texts and all(isinstance(t, str) and t.strip() for t in texts)):
        return allowed, [
            ("files_root must be a folder or a list of folders, relative to the manifest's folder", None)
        ]
    roots: list[FileRef] = []
    faults: list[tuple[str, str | None]] = []
    for text in texts:
        if "\x00" in text:
            faults.append(("a folder's name holds a NUL character", "remove it"))
            continue
        try:
            root = resolve(text.strip(), base_dir)
        except ValueError as exc:
            faults.append((f"{text}: {exc}", None))
            continue
        if outside(root, allowed):
            faults.append(
                (
                    f"{text}: resolves to {root}, outside the manifest's folder and every --files-root; "
                    "a manifest can narrow its files root, never widen it",
                    f"whoever runs it can allow that folder: --files-root {root}",
                )
            )
        elif isinstance(root, Path) and not root.is_dir():  # a store has no folders: a prefix is one
            faults.append((f"{text}: {root} is not a folder", None))
        else:
            roots.append(root)
    return (tuple(roots) if not faults else allowed), faults


OUTSIDE_HINT = "move it into the manifest's folder, or allow its folder with --files-root DIR"


class FileChecker:
    """Inspects referenced files, each distinct file once (cached by the text and by resolved path).

    A reference must resolve (after `~`, `..` and symlinks) inside one of `roots` (default: `base_dir`);
    one outside is refused without being opened, so a manifest cannot even probe for files elsewhere.
    """

    def __init__(self, base_dir: FileRef, roots: Sequence[FileRef] | None = None) -> None:
        self.base_dir = base_dir
        self.roots: tuple[FileRef, ...] = tuple(roots) if roots is not None else (base_root(base_dir),)
        self._by_text: dict[str, FileFacts] = {}
        self._by_path: dict[FileRef, FileFacts] = {}
        self._stores: dict[str, str] = {}  # bucket -> why it cannot be read (once per bucket, not per file)
        self._listings: dict[Path, list[str]] = {}
        self.outside_hint = OUTSIDE_HINT
        """The hint given with a file outside the roots."""
        self.reads = 0
        """How many files were read (for tests of the cache)."""

    def check(self, text: str) -> FileFacts:
        facts = self._by_text.get(text)
        if facts is None:
            if "\x00" in text:
                facts = FileFacts(self.base_dir, error="the path holds a NUL character", hint="remove it")
                self._by_text[text] = facts
                return facts
            try:
                path = resolve(text, self.base_dir)
            except ValueError as exc:
                facts = self._by_text[text] = FileFacts(self.base_dir, error=str(exc))
                return facts
            facts = self._by_path.get(path)
            if facts is None:
                facts = self._by_path[path] = self._inspect(path)
            self._by_text[text] = facts
        return facts

    def _outside_message(self, path: FileRef) -> FileFacts:
        roots = ", ".join(str(r) for r in self.roots)
        hint = self.outside_hint
        if isinstance(path, str) and hint == OUTSIDE_HINT:
            allow = f"--files-root {sources.parent(path)}"
            hint = f"move it under the manifest's folder or prefix, or allow its own: {allow}"
        return FileFacts(path, error=f"resolves to {path}, outside the files root ({roots})", hint=hint)

    def _inspect(self, path: FileRef) -> FileFacts:
        if outside(path, self.roots):
            return self._outside_message(path)
        if isinstance(path, str) and (why := self._stores.get(sources.split(path)[0])) is not None:
            return FileFacts(path, error=f"not read, as another object of its bucket failed: {why}")
        try:
            data = read_reference(path, READ_LIMIT)
        except FileNotFoundError:
            if isinstance(path, str):
                return FileFacts(path, error=f"object not found (looked for {path})")
            return FileFacts(path, error=f"file not found (looked for {path})", hint=self._nearby(path))
        except InputFileError as exc:
            if isinstance(path, str) and exc.size is None:  # the store failed: the same for its other files
                self._stores[sources.split(path)[0]] = str(exc)
            hint = SIZE_HINT if exc.size is not None else None
            return FileFacts(path, size=exc.size, error=str(exc), hint=hint)
        self.reads += 1
        try:
            info = inspect_image(data)
        except NotAnImageError as exc:
            kind = _looks_like(data)
            hint = f"it looks like a {kind} file; convert it to PNG or JPEG" if kind else None
            return FileFacts(path, error=str(exc), hint=hint)
        return FileFacts(path, size=len(data), sha256=hashlib.sha256(data).hexdigest(), info=info)

    def _nearby(self, path: Path) -> str | None:
        parent = path.parent
        if parent not in self._listings:
            try:
                self._listings[parent] = sorted(os.listdir(parent))
            except OSError:
                self._listings[parent] = []
        close = difflib.get_close_matches(path.name, self._listings[parent], n=1, cutoff=0.6)
        return f"did you mean {close[0]!r}?" if close else None


def base_root(base_dir: FileRef) -> FileRef:
    """The files root a manifest's own folder gives: the folder resolved, or the prefix as it is."""
    return base_dir if isinstance(base_dir, str) else base_dir.resolve()
