"""Draw the small reference images the example manifests use (run once; the outputs are committed).

    uv run python manifests/examples/make_images.py

Tiny and synthetic on purpose: they exercise the checks (PNG and JPEG, a mask with alpha of the same size
and format as its image) without bloating the repository.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent / "images"
SIZE = (256, 256)


def product() -> Image.Image:
    """A mug on a plain background: the subject of the reference-image edits."""
    img = Image.new("RGB", SIZE, (236, 236, 232))
    draw = ImageDraw.Draw(img)
    draw.rounded_rectangle((78, 70, 168, 196), radius=10, fill=(32, 96, 160))
    draw.ellipse((158, 100, 206, 160), outline=(32, 96, 160), width=10)
    draw.ellipse((78, 60, 168, 80), fill=(24, 72, 120))
    return img


def room() -> Image.Image:
    """A room with a window (PNG with alpha, fully opaque): the image of the masked edit."""
    img = Image.new("RGBA", SIZE, (214, 200, 178, 255))
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 180, 255, 255), fill=(120, 88, 60, 255))
    draw.rectangle((40, 40, 120, 130), fill=(170, 210, 240, 255), outline=(255, 255, 255, 255), width=4)
    draw.rectangle((150, 120, 230, 185), fill=(90, 110, 90, 255))
    return img


def room_mask() -> Image.Image:
    """Opaque everywhere except the sofa's area: alpha 0 marks what may be redrawn."""
    img = Image.new("RGBA", SIZE, (0, 0, 0, 255))
    ImageDraw.Draw(img).rectangle((140, 110, 240, 195), fill=(0, 0, 0, 0))
    return img


def logo() -> Image.Image:
    """A round badge with transparency, added in the second turn of the edit chain."""
    img = Image.new("RGBA", (128, 128), (0, 0, 0, 0))
    draw = ImageDraw.Draw(img)
    draw.ellipse((8, 8, 120, 120), fill=(200, 40, 60, 255))
    draw.ellipse((36, 36, 92, 92), fill=(255, 255, 255, 255))
    return img


def swatch() -> Image.Image:
    """Colour stripes saved as JPEG: a reference image that is not a PNG."""
    img = Image.new("RGB", SIZE, (255, 255, 255))
    draw = ImageDraw.Draw(img)
    colours = [(200, 60, 50), (230, 160, 40), (60, 140, 80), (40, 90, 170)]
    for i, colour in enumerate(colours):
        draw.rectangle((i * 64, 0, i * 64 + 63, 255), fill=colour)
    return img


def main() -> None:
    HERE.mkdir(exist_ok=True)
    product().save(HERE / "product.png", optimize=True)
    room().save(HERE / "room.png", optimize=True)
    room_mask().save(HERE / "room-mask.png", optimize=True)
    logo().save(HERE / "logo.png", optimize=True)
    swatch().save(HERE / "swatch.jpg", quality=85)
    for path in sorted(HERE.iterdir()):
        print(f"{path.relative_to(HERE.parent)}  {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
