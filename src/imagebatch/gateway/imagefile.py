"""What an image file really is, read from its bytes: type, pixel size, alpha. Shared by every checker."""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"
JPEG_END = b"\xff\xd9"
EXTENSIONS = {"image/png": ".png", "image/jpeg": ".jpg"}


def sniff_mime(data: bytes) -> str | None:
    """Return `image/png` or `image/jpeg` from the leading bytes, or None for anything else."""
    if data.startswith(PNG_MAGIC):
        return "image/png"
    if data.startswith(JPEG_MAGIC):
        return "image/jpeg"
    return None


@dataclass(frozen=True)
class ImageInfo:
    """The facts about one image file that the spec's rules need."""

    mime_type: str
    width: int
    height: int
    has_alpha: bool


class NotAnImageError(ValueError):
    """The bytes are not a PNG or JPEG image that can be decoded."""


def inspect_image(data: bytes) -> ImageInfo:
    """Read the facts of a PNG or JPEG from its bytes; raise NotAnImageError for anything else, or one
    damaged or cut short.

    A PNG's every chunk is read and its checksum checked, up to its end chunk (`verify`, no decompression:
    ~3 ms for 3 MB). A JPEG's header is parsed and its end-of-image marker must close the file (a
    download cut short has none): decoding it whole would cost ~90 ms for a 4K JPEG and find no more
    (a JPEG damaged in the middle decodes anyway). Every image of a run passes here once."""
    if not data:
        raise NotAnImageError("empty file (0 bytes)")
    mime = sniff_mime(data)
    if mime is None:
        raise NotAnImageError("not a PNG or JPEG file (by its bytes)")
    try:
        with Image.open(io.BytesIO(data)) as img:
            has_alpha = img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info)
            info = ImageInfo(mime, img.width, img.height, has_alpha)
            if mime == "image/png":
                img.verify()
            elif not data.rstrip(b"\0").endswith(JPEG_END):
                raise NotAnImageError(f"damaged {mime} file: no end-of-image marker (cut short?)")
        return info
    except NotAnImageError:
        raise
    except Exception as exc:  # Pillow raises a variety of errors for damaged files
        raise NotAnImageError(f"damaged {mime} file: {exc}") from None


def mask_problems(mask: ImageInfo, first: ImageInfo | None) -> list[tuple[str, str | None]]:
    """The spec's mask rules, as (message, hint) pairs; empty when the mask is valid.

    A mask must carry an alpha channel and match the first reference image in format and pixel size.
    The manifest checker reports them before anything is sent (the emulator has its own reading,
    `emulator.spec.mask_refusal`, compared with this one by tests/emulator/test_spec_agreement.py).
    """
    problems: list[tuple[str, str | None]] = []
    if not mask.has_alpha:
        problems.append(
            (
                "the mask has no alpha channel; transparent pixels mark the area to redraw",
                "save it as a PNG with transparency; a black-and-white RGB image is not a mask",
            )
        )
    if first is None:
        return problems
    if mask.mime_type != first.mime_type:
        problems.append(
            (
                f"the mask is {mask.mime_type} but the first reference image is {first.mime_type}; "
                "they must be the same format",
                "save both as PNG",
            )
        )
    if (mask.width, mask.height) != (first.width, first.height):
        problems.append(
            (
                f"the mask is {mask.width}x{mask.height} but the first reference image is "
                f"{first.width}x{first.height}; they must be the same size",
                None,
            )
        )
    return problems
