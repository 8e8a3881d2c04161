"""Tiny images for tests, made in memory with Pillow: one set for every test package."""

from __future__ import annotations

import base64
import io
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
