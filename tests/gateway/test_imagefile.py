"""Image facts read from bytes: what the client checks an answer's image against, and the checker a file."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from imagebatch.gateway.imagefile import NotAnImageError, inspect_image


def encoded(fmt: str, mode: str = "RGB", size: tuple[int, int] = (12, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize(("fmt", "mode", "mime", "alpha"), [
    ("PNG", "RGBA", "image/png", True),
    ("PNG", "RGB", "image/png", False),
    ("JPEG", "RGB", "image/jpeg", False),
])  # fmt: skip
def test_a_png_or_jpeg_is_read_by_its_bytes(fmt: str, mode: str, mime: str, alpha: bool) -> None:
    info = inspect_image(encoded(fmt, mode))
    assert (info.mime_type, info.width, info.height, info.has_alpha) == (mime, 12, 8, alpha)


@pytest.mark.parametrize(("data", "message"), [
    (b"", "empty file (0 bytes)"),
    (b"GIF89a....", "not a PNG or JPEG file (by its bytes)"),
])  # fmt: skip
def test_what_is_not_an_image_says_why(data: bytes, message: str) -> None:
    with pytest.raises(NotAnImageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        inspect_image(data)
