"""Image facts read from bytes: what the client checks an answer's image against, and the checker a file."""

from __future__ import annotations

import pytest
from helpers.images import encode

from imagebatch.gateway.imagefile import NotAnImageError, inspect_image


@pytest.mark.parametrize(("fmt", "mode", "mime", "alpha"), [
    ("PNG", "RGBA", "image/png", True),
    ("PNG", "RGB", "image/png", False),
    ("JPEG", "RGB", "image/jpeg", False),
])  # fmt: skip
def test_a_png_or_jpeg_is_read_by_its_bytes(fmt: str, mode: str, mime: str, alpha: bool) -> None:
    info = inspect_image(encode(fmt, 12, 8, (0, 0, 0, 0) if mode == "RGBA" else (0, 0, 0), mode))
    assert (info.mime_type, info.width, info.height, info.has_alpha) == (mime, 12, 8, alpha)


@pytest.mark.parametrize(("data", "message"), [
    (b"", "empty file (0 bytes)"),
    (b"GIF89a....", "not a PNG or JPEG file (by its bytes)"),
])  # fmt: skip
def test_what_is_not_an_image_says_why(data: bytes, message: str) -> None:
    with pytest.raises(NotAnImageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        inspect_image(data)
