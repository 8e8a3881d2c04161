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


def test_an_image_cut_short_or_damaged_is_refused() -> None:
    jpeg, png = encode("JPEG", 64, 48, (10, 120, 200), "RGB"), encode("PNG", 64, 48, (10, 120, 200), "RGB")
    assert inspect_image(jpeg + b"\0\0").width == 64  # padding after the end marker is tolerated
    with pytest.raises(NotAnImageError, match="damaged image/jpeg"):
        inspect_image(jpeg[: len(jpeg) // 2])
    with pytest.raises(NotAnImageError, match="damaged image/jpeg file: no end-of-image marker"):
        inspect_image(jpeg[:-2])  # the header whole, the end cut
    with pytest.raises(NotAnImageError, match="damaged image/png"):
        inspect_image(png[: len(png) - 20])
    flipped = bytearray(png)
    flipped[40] ^= 0xFF  # inside a chunk: its checksum no longer matches
    with pytest.raises(NotAnImageError, match="damaged image/png"):
        inspect_image(bytes(flipped))
