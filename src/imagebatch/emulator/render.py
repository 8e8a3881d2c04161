"""Real, checkable images drawn with Pillow: the pixel size behind every size name, and a renderer that
is deterministic for (prompt, parameters, seed), uses reference images and masks, and caches its output.
"""

from __future__ import annotations

import io
import math
import textwrap
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from PIL import Image, ImageDraw, ImageFont

from .chance import digest
from .spec import IMAGES_SIZES

# The spec does not give pixel sizes for 1K/2K/4K; we take the long side from the size name and derive
# the short side from the ratio (README table).
NATIVE_LONG_SIDE: dict[str, int] = {"1K": 1024, "2K": 2048, "4K": 4096}
AUTO_IMAGES_SIZE = (1024, 1024)
THOUGHT_LONG_SIDE = 256
REFERENCE_DETAIL = 1024  # long side, in pixels, at which a reference image is drawn before enlarging
PNG_COMPRESS_LEVEL = 1  # 4K PNGs at level 1 encode in about 0.3 s; the default level 6 takes seconds
JPEG_QUALITY = 90

ImageFormat = Literal["PNG", "JPEG"]
MIME_TYPES: dict[str, str] = {"PNG": "image/png", "JPEG": "image/jpeg"}


def _round8(x: float) -> int:
    return max(8, math.floor(x / 8 + 0.5) * 8)


def native_pixel_size(image_size: str, aspect_ratio: str, long_side: int | None = None) -> tuple[int, int]:
    """(width, height) of a native/chat image: long side 1024/2048/4096, short side the ratio of it,
    rounded to a multiple of 8. `1:1` at `1K` is 1024x1024; `16:9` at `2K` is 2048x1152."""
    a, b = (int(x) for x in aspect_ratio.split(":"))
    long = long_side or NATIVE_LONG_SIDE[image_size]
    if a >= b:
        return long, _round8(long * b / a)
    return _round8(long * a / b), long


def images_pixel_size(size: str) -> tuple[int, int]:
    """(width, height) of an images-route size: exactly `WxH`; `auto` is 1024x1024."""
    if size not in IMAGES_SIZES:
        raise ValueError(f"unknown images size {size!r}")
    if size == "auto":
        return AUTO_IMAGES_SIZE
    w, h = size.split("x")
    return int(w), int(h)


@dataclass(frozen=True)
class RenderSpec:
    """Everything an image depends on. Two equal specs give byte-identical files."""

    width: int
    height: int
    prompt: str
    seed: int
    variant: int = 0
    """Index of the image within one answer, so that several images of one answer differ."""
    label: str = ""
    """Shown in the footer (model or route)."""
    references: tuple[bytes, ...] = field(default=(), repr=False)
    """Reference images; the first becomes the background, the others thumbnails."""
    mask: bytes | None = field(default=None, repr=False)
    """With alpha: alpha 0 is redrawn, alpha 255 keeps the first reference's pixels."""
    draft: bool = False
    """An intermediate (thought) image: greyscale."""
    fmt: ImageFormat = "PNG"

    def cache_key(self) -> bytes:
        return digest(
            self.width, self.height, self.prompt, self.seed, self.variant, self.label,
            *(digest(r) for r in self.references), digest(self.mask or b""), self.draft, self.fmt,
        )  # fmt: skip


def _colour(seed_bytes: bytes, offset: int) -> tuple[int, int, int]:
    r, g, b = seed_bytes[offset : offset + 3]
    return r, g, b


def _contrast(colour: tuple[int, int, int]) -> tuple[int, int, int]:
    luminance = 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2]
    return (0, 0, 0) if luminance > 140 else (255, 255, 255)


def _open_rgb(data: bytes, size: tuple[int, int]) -> Image.Image:
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB").resize(size, Image.Resampling.BILINEAR)


def prompt_lines(prompt: str, columns: int, max_lines: int) -> list[str]:
    """The first `max_lines` lines of `prompt` wrapped at `columns`, as `textwrap.wrap` gives them.

    Only a prefix two lines longer than what they can hold is wrapped: `textwrap` breaks a long word by
    slicing the rest of it once per line, so a 10 MB prompt without spaces took minutes (quadratic)."""
    text = prompt[: (max_lines + 2) * (columns + 1)]
    return textwrap.wrap(text or "(no text)", columns)[:max_lines]


def draw(spec: RenderSpec) -> Image.Image:
    """Draw the image of `spec` (not encoded)."""
    w, h = spec.width, spec.height
    palette = digest("palette", spec.seed, spec.prompt) + digest(
        "variant", spec.seed, spec.prompt, spec.variant
    )
    background = _colour(palette, 0)
    if spec.references:
        # The first reference fills the canvas, tinted with the prompt's colour so the edit is visible.
        # It is drawn at most 1024 px wide and enlarged in blocks: a photo at full 4K resolution would
        # make the PNG several times slower to encode and ~20 MB large.
        scale = max(1, math.ceil(max(w, h) / REFERENCE_DETAIL))
        small = _open_rgb(spec.references[0], (max(1, w // scale), max(1, h // scale)))
        base = small.resize((w, h), Image.Resampling.NEAREST)
        canvas = Image.blend(base, Image.new("RGB", (w, h), background), 0.35)
    else:
        canvas = Image.new("RGB", (w, h), background)
    pen = ImageDraw.Draw(canvas)

    # A few shapes placed by the variant's hash: cheap to draw and to compress, distinct per image.
    for i in range(4):
        b = palette[32 + i * 6 : 38 + i * 6]
        x0, y0 = b[0] * w // 320, b[1] * h // 320
        box = (x0, y0, x0 + w // 5 + b[2] * w // 1280, y0 + h // 5 + b[3] * h // 1280)
        fill = _colour(palette, 3 + i * 3)
        (pen.ellipse if b[4] % 2 else pen.rectangle)(box, fill=fill)
    frame = max(2, min(w, h) // 64)
    pen.rectangle((0, 0, w - 1, h - 1), outline=_colour(palette, 20), width=frame)

    for i, ref in enumerate(spec.references[1:5]):
        # Extra references appear as thumbnails along the bottom edge.
        tw, th = max(8, w // 6), max(8, h // 6)
        canvas.paste(_open_rgb(ref, (tw, th)), (w - (i + 1) * (tw + frame), h - th - 2 * frame))

    ink = _contrast(background)
    font_size = max(8, min(w, h) // 16)
    font = ImageFont.load_default(size=font_size)
    columns = max(8, int(w / (font_size * 0.6)) - 2)
    max_lines = max(1, int(h * 0.6 / (font_size * 1.25)))
    lines = prompt_lines(spec.prompt, columns, max_lines)
    pen.multiline_text(
        (2 * frame, 2 * frame), "\n".join(lines), font=font, fill=ink,
        stroke_width=max(1, font_size // 16), stroke_fill=_contrast(ink),
    )  # fmt: skip
    footer = f"{w}x{h} seed {spec.seed} #{spec.variant} {spec.label}".strip()
    footer_font = ImageFont.load_default(size=max(8, font_size // 2))
    pen.text((2 * frame, h - 2 * frame - font_size // 2), footer, font=footer_font, fill=ink)

    if spec.mask is not None and spec.references:
        # Opaque mask pixels keep the source; transparent ones take the drawing.
        source = _open_rgb(spec.references[0], (w, h))
        with Image.open(io.BytesIO(spec.mask)) as m:
            alpha = m.convert("RGBA").getchannel("A").resize((w, h), Image.Resampling.NEAREST)
        canvas = Image.composite(source, canvas, alpha)
    if spec.draft:
        canvas = canvas.convert("L").convert("RGB")
    return canvas


def encode(image: Image.Image, fmt: ImageFormat) -> bytes:
    out = io.BytesIO()
    if fmt == "PNG":
        image.save(out, "PNG", compress_level=PNG_COMPRESS_LEVEL)
    else:
        image.save(out, "JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


class Renderer:
    """Renders `RenderSpec`s to file bytes, keeping the last few in an LRU cache. Thread-safe."""

    def __init__(self, cache_size: int = 16) -> None:
        self.cache_size = cache_size
        self._cache: OrderedDict[bytes, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.renders = 0
        """How many images were actually drawn (cache misses)."""

    def render(self, spec: RenderSpec) -> bytes:
        key = spec.cache_key()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        # Drawn outside the lock so that concurrent requests render in parallel.
        data = encode(draw(spec), spec.fmt)
        with self._lock:
            self.renders += 1
            if self.cache_size:
                self._cache[key] = data
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return data
