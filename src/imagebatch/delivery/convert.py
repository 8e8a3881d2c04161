"""One deliverable made from one output image, with Pillow: `imagebatch export`'s per-image work.

The choices (the README's "Export" section says them too):
- **Orientation is applied**: an EXIF Orientation other than 1 rotates/flips the pixels and the tag is
  removed (set nowhere), so every viewer, browser and CDN shows the image the same way and the width
  and height in export.csv are the ones people see. The rest of the EXIF block is kept.
- **The colour profile is kept**: the pixels are not converted; the ICC profile travels with them, in
  every format. It is dropped only where the pixels change colour model (a CMYK source written as PNG
  or WebP, a grey one flattened to colour), where it would describe the wrong thing.
- **Alpha**: JPEG has none, so a transparent image is composited onto `background` (white unless
  `--background` says otherwise); PNG and WebP keep it.
- **Size**: `max_side` shrinks an image whose longer side is over it (Lanczos, aspect kept, whole
  pixels), never enlarges one.
- **Canvas**: `canvas` (W x H) delivers every image at exactly that size: shrunk to fit inside it if it
  is larger, never enlarged (an upscale invents detail a shop did not pay for), and centred on
  `background`; at most `CANVAS_MAX` a side and `CANVAS_MAX_PIXELS` in all, refused with the options
  before any image is read. An image smaller than the delivery size (the canvas, or `max_side`) is
  marked (`small`), and export warns with its name.
- **Nothing to change, nothing re-encoded**: an image that stays in its format, is not resized, has no
  rotation to apply and (JPEG, WebP) no `quality` asked for is copied byte for byte: no second JPEG
  generation, and the fastest path.

The functions are module-level and take and return plain data, so a process pool can run them
(`stage` is what a worker runs); this module imports nothing of ours.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import PIL
from PIL import Image, ImageColor, ImageOps, features

Format = Literal["png", "jpeg", "webp"]
"""The formats a deliverable can be made in: the one list (`--format`'s choices, the flow's schema)."""
FORMATS = {name: name.upper() for name in get_args(Format)}
"""`--format` values and Pillow's names for them."""
DEFAULT_BACKGROUND = "white"
"""What transparency is flattened onto for JPEG, and the canvas's colour, unless `--background` says."""
EXTENSIONS = {"png": "png", "jpeg": "jpg", "webp": "webp"}
"""The `{ext}` of each format."""
SOURCE_SUFFIXES = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".webp": "webp"}
"""The output images export reads, by their file's suffix (a run writes .png and .jpg)."""
DEFAULT_QUALITY = 90
"""JPEG and WebP quality when an image is re-encoded and `--quality` is not given."""
ORIENTATION = 0x0112
_ICC_SPACES = {"RGB": b"RGB ", "RGBA": b"RGB ", "P": b"RGB ", "L": b"GRAY", "LA": b"GRAY", "CMYK": b"CMYK"}


@dataclass(frozen=True, slots=True)
class Conversion:
    """What every deliverable of one export is made into."""

    format: str | None = None
    """png | jpeg | webp; None: each image keeps its own format."""
    max_side: int | None = None
    quality: int | None = None
    """JPEG/WebP quality (1-100); None: `DEFAULT_QUALITY` when re-encoding, and no re-encoding for it."""
    background: tuple[int, int, int] = ImageColor.getrgb(DEFAULT_BACKGROUND)[:3]
    canvas: tuple[int, int] | None = None
    """Every deliverable exactly this size (width, height), the image centred on `background`."""

    @classmethod
    def from_options(
        cls,
        format: str | None,
        max_side: int | None,
        quality: int | None,
        background: str | None,
        canvas: str | None = None,
    ) -> Conversion:
        """The conversion `--format`, `--max-side`, `--quality`, `--background`, `--canvas` ask for;
        ValueError naming the option for a value out of range."""
        if format is not None and format not in FORMATS:
            raise ValueError(f"--format {format!r}: one of {', '.join(FORMATS)}")
        if max_side is not None and max_side < 1:
            raise ValueError(f"--max-side {max_side}: a number of pixels, 1 or more")
        if quality is not None and not 1 <= quality <= 100:
            raise ValueError(f"--quality {quality}: from 1 to 100")
        if quality is not None and format == "png":
            raise ValueError("--quality applies to jpeg and webp, not png (lossless)")
        try:
            rgb = ImageColor.getrgb(background or DEFAULT_BACKGROUND)
        except ValueError:
            raise ValueError(
                f"--background {background!r}: a colour name (white), #rrggbb or rgb(r, g, b)"
            ) from None
        return cls(format, max_side, quality, (rgb[0], rgb[1], rgb[2]), _canvas(canvas))

    def describe(self) -> str:
        """What a deliverable's bytes depend on besides its source's: these options, Pillow's version and
        its codecs' (export.csv keeps it, so that the next export knows when a file is already right)."""
        quality = self.quality if self.quality is not None else "-"
        background = "#{:02x}{:02x}{:02x}".format(*self.background)
        return (
            f"{self.format or '-'} quality={quality} max-side={self.max_side or '-'} "
            f"background={background} {_codecs()}"
        ) + (f" canvas={self.canvas[0]}x{self.canvas[1]}" if self.canvas else "")

    def delivery_size(self) -> str | None:
        """The size a deliverable should reach, as the warning about smaller ones says it."""
        if self.canvas:
            return f"--canvas {self.canvas[0]}x{self.canvas[1]}"
        return f"--max-side {self.max_side}" if self.max_side else None

    def below(self, size: tuple[int, int]) -> bool:
        """Whether an image of `size` (as shown) is smaller than the delivery size: it would need
        enlarging to fill the canvas, or to reach `max_side`."""
        width, height = size
        if self.canvas:
            return width < self.canvas[0] and height < self.canvas[1]
        return bool(self.max_side) and max(width, height) < (self.max_side or 0)

    def target(self, source_format: str) -> str:
        """The format an image in `source_format` (png, jpeg, webp) is delivered in."""
        return self.format or source_format


CANVAS_MAX = 20_000
"""The largest side `--canvas` takes."""
CANVAS_MAX_PIXELS = 100_000_000
"""The most pixels `--canvas` takes (100 megapixels, 300 MB of RGB per image being made): a larger
canvas is no product image, and each worker holds one while it encodes."""


def _canvas(text: str | None) -> tuple[int, int] | None:
    """`--canvas WxH` as (width, height); ValueError naming the option."""
    if text is None:
        return None
    width, sep, height = text.lower().partition("x")
    if not (sep and width.isdigit() and height.isdigit()) or not (
        1 <= int(width) <= CANVAS_MAX and 1 <= int(height) <= CANVAS_MAX
    ):
        raise ValueError(
            f"--canvas {text!r}: WIDTHxHEIGHT in pixels, as 2000x2000 (1 to {CANVAS_MAX:,} each)"
        )
    if (pixels := int(width) * int(height)) > CANVAS_MAX_PIXELS:
        raise ValueError(
            f"--canvas {text!r} is {pixels / 1e6:,.0f} megapixels; at most "
            f"{CANVAS_MAX_PIXELS // 1_000_000} (as 10000x10000)"
        )
    return int(width), int(height)


@dataclass(frozen=True, slots=True)
class StageJob:
    """One image for a worker: its source (a local path, or its bytes fetched from a bucket) and the
    local file the deliverable is staged in."""

    index: int
    source: str | bytes | None
    """None: a bucket's object that has gone since it was listed."""
    target: str
    conversion: Conversion


@dataclass(frozen=True, slots=True)
class Staged:
    """What a worker made of a `StageJob`: the staged file's facts, or why it could not be made."""

    index: int
    sha256: str = ""
    size: int = 0
    width: int = 0
    height: int = 0
    source_sha256: str = ""
    small: bool = False
    """The image is below the delivery size (`Conversion.below`)."""
    error: str | None = None


@functools.cache
def _codecs() -> str:
    """Pillow's version and its encoders' (a build against other libraries may write other bytes)."""
    versions = {name: features.version(name) for name in ("jpg", "webp", "zlib")}
    return f"pillow={PIL.__version__} " + " ".join(f"{name}={v}" for name, v in versions.items() if v)


def _has_alpha(im: Image.Image) -> bool:
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info


def _flatten(im: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    """`im` composited onto `background` (no alpha left); grey stays grey."""
    rgba = im.convert("RGBA")
    flat = Image.new("RGB", im.size, background)
    flat.paste(rgba, mask=rgba.getchannel("A"))
    return flat.convert("L") if im.mode in ("L", "LA", "La") else flat


def _for_format(im: Image.Image, fmt: str, background: tuple[int, int, int]) -> Image.Image:
    """`im` in a mode `fmt` can hold: alpha flattened for JPEG, others converted to RGB(A)."""
    if fmt == "jpeg":
        if _has_alpha(im):
            return _flatten(im, background)
        return im if im.mode in ("L", "RGB", "CMYK") else im.convert("RGB")
    if fmt == "webp":
        return im if im.mode in ("RGB", "RGBA") else im.convert("RGBA" if _has_alpha(im) else "RGB")
    if im.mode in ("1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16"):
        return im
    return im.convert("RGBA" if _has_alpha(im) else "RGB")


def _on_canvas(im: Image.Image, canvas: tuple[int, int], background: tuple[int, int, int]) -> Image.Image:
    """`im` shrunk to fit inside `canvas` if it is larger (never enlarged), centred on `background`
    (opaque: a shop's canvas is a colour, its transparency flattened onto it)."""
    scale = min(canvas[0] / im.width, canvas[1] / im.height, 1.0)
    if scale < 1.0:
        size = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
        im = im.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    mode = "L" if im.mode in ("L", "LA", "La") else "RGB"  # a grey image stays grey
    out = Image.new("RGB", canvas, background).convert(mode)
    at = ((canvas[0] - im.width) // 2, (canvas[1] - im.height) // 2)
    if _has_alpha(im):
        rgba = im.convert("RGBA")
        out.paste(rgba.convert(mode), at, mask=rgba.getchannel("A"))
    else:
        out.paste(im.convert(mode), at)
    return out


def _fitted(size: tuple[int, int], max_side: int | None) -> tuple[int, int] | None:
    """The size `size` is shrunk to so that neither side exceeds `max_side`, or None if it fits."""
    width, height = size
    if not max_side or max(width, height) <= max_side:
        return None
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def convert(data: bytes, conversion: Conversion) -> tuple[bytes, int, int, bool]:
    """The deliverable made of the image `data`: its bytes, width and height (as people see it), and
    whether the image is below the delivery size (`Conversion.below`).

    Raises OSError (or ValueError) for bytes Pillow cannot read, and for an image over Pillow's
    decompression-bomb bound (89 M pixels)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            im = Image.open(io.BytesIO(data))
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
            raise ValueError(f"too large to convert ({exc})") from None
    with im:
        source = {pillow: ours for ours, pillow in FORMATS.items()}.get(im.format or "")  # None: GIF, TIFF...
        fmt = conversion.target(source or "png")
        orientation = im.getexif().get(ORIENTATION, 1)
        size = _fitted(im.size, conversion.max_side)
        reencode_for_quality = conversion.quality is not None and fmt != "png"
        shown = (im.height, im.width) if orientation in (5, 6, 7, 8) else im.size  # turned a quarter
        small = conversion.below(shown)
        unchanged = size is None and orientation in (1, None) and not reencode_for_quality
        if fmt == source and unchanged and conversion.canvas in (None, im.size):
            return data, im.width, im.height, small
        if size is not None:
            im.draft(im.mode, size)  # JPEG: decode at a reduced scale still >= the target (else a no-op)
        icc = im.info.get("icc_profile")
        out = ImageOps.exif_transpose(im)
        exif = out.getexif()
        if (size := _fitted(out.size, conversion.max_side)) is not None:
            out = out.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
        if conversion.canvas is not None:
            out = _on_canvas(out, conversion.canvas, conversion.background)
        out = _for_format(out, fmt, conversion.background)
        options: dict[str, object] = {}
        if icc and icc[16:20] == _ICC_SPACES.get(out.mode):  # the profile's colour space, ICC header
            options["icc_profile"] = icc
        if len(exif):
            options["exif"] = exif.tobytes()
        if fmt != "png":
            options["quality"] = conversion.quality or DEFAULT_QUALITY
        buf = io.BytesIO()
        out.save(buf, FORMATS[fmt], **options)
        return buf.getvalue(), out.width, out.height, small


def stage(job: StageJob) -> Staged:
    """A worker's unit: read the source, convert it, write the result to `job.target` (synced, so that
    renaming it into the destination later gives a complete file), and hash it. Never raises for a bad
    image: the error is returned, naming the cause, and the export refuses before writing anything."""
    if job.source is None:
        return Staged(job.index, error="the image is missing")
    try:
        data = job.source if isinstance(job.source, bytes) else Path(job.source).read_bytes()
        out, width, height, small = convert(data, job.conversion)
        fd = os.open(job.target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(out)
            fh.flush()
            os.fsync(fh.fileno())
    except (OSError, ValueError, SyntaxError) as exc:  # Pillow raises SyntaxError for some broken files
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        return Staged(job.index, error=why)
    digest, source_digest = hashlib.sha256(out).hexdigest(), hashlib.sha256(data).hexdigest()
    return Staged(job.index, digest, len(out), width, height, source_digest, small)
