"""Tiny images for tests, made in memory with Pillow: one set for every test package."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from pathlib import Path

from PIL import Image


def encode(
    fmt: str, width: int = 64, height: int = 64, colour: tuple[int, ...] = (200, 30, 30), mode: str = "RGB"
) -> bytes:
    """An image of one colour, encoded as `fmt` (PNG, JPEG, WEBP, ...)."""
    out = io.BytesIO()
    Image.new(mode, (width, height), colour).save(out, fmt)
    return out.getvalue()


def png(
    width: int = 64, height: int = 64, colour: tuple[int, ...] = (200, 30, 30), mode: str = "RGB"
) -> bytes:
    return encode("PNG", width, height, colour, mode)


def jpeg(width: int = 64, height: int = 64, colour: tuple[int, int, int] = (30, 30, 200)) -> bytes:
    return encode("JPEG", width, height, colour)


def mask(width: int = 64, height: int = 64, alpha: int = 0) -> bytes:
    """A PNG edit mask: RGBA, transparent (alpha 0) where the service may paint."""
    return encode("PNG", width, height, (0, 0, 0, alpha), "RGBA")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def open_image(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


def save(path: Path, data: bytes) -> Path:
    """Write `data` to `path` (parents created) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def blank_png(width: int, height: int) -> bytes:
    """A transparent black RGBA PNG of any size, made without holding its pixels: every `ROWS` rows of
    zeros deflate to the same bytes after a full flush, so the stream is one block repeated. 13000 x 13000
    (676 MB of pixels) is a 660 KB file, made in 0.1 s: the decompression bomb of issue 21."""
    rows = 100
    row = b"\0" + bytes(width * 4)  # filter byte 0, then RGBA zeros
    deflate = zlib.compressobj(9)
    first = deflate.compress(row * min(rows, height)) + deflate.flush(zlib.Z_FULL_FLUSH)
    blocks, rest = divmod(height - min(rows, height), rows)
    block = deflate.compress(row * rows) + deflate.flush(zlib.Z_FULL_FLUSH) if blocks else b""
    tail = deflate.compress(row * rest) + deflate.flush(zlib.Z_FULL_FLUSH) if rest else b""
    adler = (len(row) * height % 65521) << 16 | 1  # Adler-32 of all-zero data: a stays 1, b counts bytes
    idat = first + block * blocks + tail + b"\x03\x00" + struct.pack(">I", adler)  # empty final block

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)  # 8-bit RGBA, not interlaced
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
