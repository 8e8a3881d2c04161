"""The report's thumbnails: made as each image arrives (from its bytes still in memory), on two threads of
their own, bounded in the pixels they decode; kept where the run's record is."""

from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image, ImageFile, JpegImagePlugin, PngImagePlugin

from imagebatch.storage import layout
from imagebatch.storage.location import OutsideRootError, confined, write_atomic

if TYPE_CHECKING:
    from imagebatch.storage.backend import Backend

THUMB_SIDE = 256
"""The longest side of a thumbnail, in pixels."""


def thumb_name(rel: str) -> str:
    """The thumbnail's name of an output image (`images/<job>/<file>` -> `<job>__<file>`)."""
    return rel.removeprefix(f"{layout.IMAGES_DIR}/").replace("/", "__")


THUMBNAIL_THREADS = 2
_thumbnailer: ThreadPoolExecutor | None = None
_thumbnailer_made = threading.Lock()


def thumbnailer() -> ThreadPoolExecutor:
    """Where a run's thumbnails are decoded: two threads of their own, not the request threads, made at
    the first thumbnail (importing the report makes none). A 4096 x 4096 image decodes to 48 MiB; freed
    in a request thread, that memory stays in the thread's malloc arena, so 16 request threads held about
    1 GB after a 4K run (bench/README.md "Memory", measured: 1,118 MiB peak decoding in 16 threads,
    271 MiB in these 2). Two decodes at once also keep two cores busy."""
    global _thumbnailer
    with _thumbnailer_made:
        if _thumbnailer is None:
            _thumbnailer = ThreadPoolExecutor(THUMBNAIL_THREADS, thread_name_prefix="imagebatch-thumbnail")
        return _thumbnailer


THUMB_MAX_PIXELS = 24_000_000
"""The largest image a thumbnail decodes (a JPEG counted at its draft scale): about 4,900 x 4,900, at most
4 bytes a pixel, so 96 MB. A PNG has no reduced decode in Pillow: a 13000 x 13000 RGBA reference (a
660 KB file) took 1.3 GB of RSS and 9 s. A larger image gets a placeholder in the report saying so."""

_HEADER_READERS: dict[bytes, type[ImageFile.ImageFile]] = {
    b"\x89PNG\r\n\x1a\n": PngImagePlugin.PngImageFile,
    b"\xff\xd8\xff": JpegImagePlugin.JpegImageFile,
}


class TooLarge(ValueError):
    """An image over `THUMB_MAX_PIXELS`: not decoded, shown as a placeholder."""

    def __init__(self, size: tuple[int, int] | None) -> None:
        self.size = size
        pixels = f"{size[0]} x {size[1]} pixels: " if size else ""
        super().__init__(f"{pixels}too large to thumbnail (over {THUMB_MAX_PIXELS:,} pixels)")


def _open_bounded(source: Path | io.BytesIO) -> Image.Image:
    """Open `source` reading only its header; a JPEG is set to decode at the smallest scale (1/2 to 1/8)
    that still covers the thumbnail. Raise `TooLarge` if decoding it would exceed `THUMB_MAX_PIXELS`.

    PNG and JPEG are opened by their plugins directly: `Image.open` would first warn of a decompression
    bomb (from 89 M pixels) for an image refused here anyway."""
    if isinstance(source, io.BytesIO):
        magic = source.read(8)
        source.seek(0)
    else:
        with source.open("rb") as fh:
            magic = fh.read(8)
    reader = next((r for m, r in _HEADER_READERS.items() if magic.startswith(m)), None)
    try:
        im = reader(source) if reader else Image.open(source)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise TooLarge(None) from exc
    size = im.size
    im.draft("RGB", (THUMB_SIDE, THUMB_SIDE))  # a no-op but for JPEG
    if im.width * im.height > THUMB_MAX_PIXELS:
        im.close()
        raise TooLarge(size)
    return im


def _reduced(im: Image.Image) -> Image.Image:
    """`im` shrunk by a whole factor to about twice the thumbnail's side (as `thumbnail`'s reducing_gap
    does), a band of rows at a time: `reduce` of a whole RGBA image first makes a premultiplied copy of
    it, which doubled the cost of a large reference (4096 x 4096: 131 MiB, now 70)."""
    factor = max(im.size) // (2 * THUMB_SIDE)
    if factor < 2 or im.mode in ("1", "P", "I;16", "I;16B", "I;16L"):  # modes reduce() refuses
        return im
    width, height = im.size
    rows = factor * max(1, (1 << 20) // (width * factor))  # bands of about a million pixels
    small = Image.new(im.mode, (-(-width // factor), -(-height // factor)))
    for top in range(0, height, rows):
        band = im.crop((0, top, width, min(height, top + rows)))
        small.paste(band.reduce(factor), (0, top // factor))
    return small


def save_thumbnail(source: Path | io.BytesIO, target: Path | io.BytesIO) -> None:
    """Write the JPEG thumbnail of `source` to the file `target` (its folder made) or into a buffer."""
    with _open_bounded(source) as im:
        small = _reduced(im)
        small.thumbnail((THUMB_SIDE, THUMB_SIDE), reducing_gap=2.0)
        buf = io.BytesIO()
        small.convert("RGB").save(buf, "JPEG", quality=80)
    if isinstance(target, io.BytesIO):
        target.write(buf.getvalue())
        return
    write_atomic(target, buf.getvalue(), sync=False)  # a lost thumbnail is remade; a torn one is not


def ensure_thumbnail(out: Path, source: Path, name: str) -> str | None:
    """A JPEG thumbnail of `source` under out/thumbs/ (made once, remade if the source is newer);
    its path relative to `out`, or None if `source` is not a readable image. `TooLarge` if it is
    over `THUMB_MAX_PIXELS`."""
    target = confined(out, f"{layout.THUMBS_DIR}/{name}.jpg")  # thumbs/ linked out of OUT: refused
    try:
        if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
            save_thumbnail(source, target)
    except (TooLarge, OutsideRootError):
        raise
    except (OSError, ValueError):
        return None
    return target.relative_to(out).as_posix()


def keep_thumbnail(place: Backend, rel: str, data: bytes) -> None:
    """Make the thumbnail of the image `rel` from its bytes, still in memory, and keep it in `place`: a
    run makes each one as its image arrives (while the service works on the next), so the report at the
    end reads no image again. Best effort: the report makes any that is missing."""
    buf = io.BytesIO()
    try:
        thumbnailer().submit(save_thumbnail, io.BytesIO(data), buf).result()
    except (OSError, ValueError, Image.DecompressionBombError):
        return
    place.put_derived(f"{layout.THUMBS_DIR}/{thumb_name(rel)}.jpg", buf.getvalue())
