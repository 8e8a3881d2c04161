"""Reference images and masks named by a manifest: read once, inspected by their bytes, size-checked per
route against the spec's limits (`gateway.constants`)."""

from __future__ import annotations

import difflib
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from imagebatch.gateway.constants import (
    MAX_UPLOAD_BYTES,
)
from imagebatch.gateway.imagefile import ImageInfo, NotAnImageError, inspect_image

from .models import (
    MAX_NATIVE_IMAGE_BYTES,
)

# --- files -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileFacts:
    """What one referenced file is; read once per manifest however many rows name it."""

    path: Path
    """Resolved absolute path."""
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


_READ_LIMIT = max(MAX_UPLOAD_BYTES, MAX_NATIVE_IMAGE_BYTES)
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


class FileChecker:
    """Inspects referenced files, each distinct file once (cached by the text and by resolved path)."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self._by_text: dict[str, FileFacts] = {}
        self._by_path: dict[Path, FileFacts] = {}
        self._listings: dict[Path, list[str]] = {}
        self.reads = 0
        """How many files were read (for tests of the cache)."""

    def check(self, text: str) -> FileFacts:
        facts = self._by_text.get(text)
        if facts is None:
            # Backslashes: a manifest written on Windows must resolve the same way everywhere.
            path = Path(os.path.normpath(self.base_dir / Path(text.replace("\\", "/")).expanduser()))
            path = path.resolve()
            facts = self._by_path.get(path)
            if facts is None:
                facts = self._by_path[path] = self._inspect(path)
            self._by_text[text] = facts
        return facts

    def _inspect(self, path: Path) -> FileFacts:
        try:
            st = path.stat()
        except FileNotFoundError:
            return FileFacts(path, error=f"file not found (looked for {path})", hint=self._nearby(path))
        except OSError as exc:
            return FileFacts(path, error=f"cannot read the file: {exc.strerror}")
        if stat.S_ISDIR(st.st_mode):
            return FileFacts(path, error="is a folder, not a file")
        # Size first, from stat: a 4 GB file named by mistake must not be read just to be refused. The
        # route's own limit is applied by `size_fault`; this is only the most any route takes.
        if st.st_size >= _READ_LIMIT:
            return FileFacts(
                path,
                size=st.st_size,
                error=f"the file is {st.st_size:,} bytes; each file must be under {_READ_LIMIT:,} bytes",
                hint=SIZE_HINT,
            )
        try:
            data = path.read_bytes()
        except OSError as exc:
            return FileFacts(path, error=f"cannot read the file: {exc.strerror}")
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
