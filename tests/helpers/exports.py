"""For tests/export: output folders as a run leaves them, made without a run: source images made with
Pillow (EXIF orientation, an ICC profile, alpha) under images/<job>/, and results.csv written by the
run's own writer (`OutputStore.write_results`, the manifest's metadata columns after the result
columns)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

from PIL import Image, ImageCms

from imagebatch.work.store import OutputStore

ORIENTATION = 0x0112
SRGB = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


def halves(
    size: tuple[int, int], left: tuple[int, ...], right: tuple[int, ...], mode: str = "RGB"
) -> Image.Image:
    """An image whose left half is `left` and right half `right`: where they end up shows a rotation."""
    im = Image.new(mode, size, left)
    im.paste(right, (size[0] // 2, 0, size[0], size[1]))
    return im


def encoded(im: Image.Image, fmt: str, **options: Any) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **options)
    return buf.getvalue()


def rotated_jpeg() -> bytes:
    """400 x 200, red left half, blue right half, stored sideways: EXIF Orientation 6 (shown rotated 90
    degrees clockwise: 200 x 400, red on top), with an sRGB profile."""
    exif = Image.Exif()
    exif[ORIENTATION] = 6
    return encoded(
        halves((400, 200), (255, 0, 0), (0, 0, 255)), "JPEG", exif=exif, icc_profile=SRGB, quality=95
    )


def transparent_png() -> bytes:
    """300 x 300 RGBA: opaque red left half, fully transparent right half; with an sRGB profile."""
    return encoded(halves((300, 300), (255, 0, 0, 255), (0, 0, 0, 0), "RGBA"), "PNG", icc_profile=SRGB)


def wide_png(colour: tuple[int, int, int] = (20, 120, 40)) -> bytes:
    """1200 x 600 RGB."""
    return encoded(Image.new("RGB", (1200, 600), colour), "PNG")


def key_of(job: str, request: int, variant: int = 1) -> str:
    return "ib1-" + hashlib.sha256(f"{job}/{request}/{variant}".encode()).hexdigest()[:32]


class OutMaker:
    """Build an output folder row by row, then `write()` its results.csv."""

    def __init__(self, root: Path, metadata: list[str]) -> None:
        self.root = root
        self.metadata = metadata
        self.rows: list[dict[str, Any]] = []

    def add(
        self,
        job: str,
        images: list[bytes],
        *,
        request: int = 0,
        turn: int = 0,
        variant: int | None = None,
        status: str = "succeeded",
        **metadata: str,
    ) -> dict[str, Any]:
        key = key_of(job, request, variant or 1)
        paths = []
        for k, data in enumerate(images):
            ext = ".jpg" if data.startswith(b"\xff\xd8") else ".png"
            rel = f"images/{job}/{request}-{key[4:16]}{f'-{k}' if k else ''}{ext}"
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.root / rel).write_bytes(data)
            paths.append(rel)
        row: dict[str, Any] = {
            "job_id": job,
            "request_index": request,
            "turn_index": turn,
            "status": status,
            "paths": ";".join(paths),
            "images": len(images),
            "mime_type": "image/png",
            "model": "native-image-2.1",
            "route": "native",
            "idempotency_key": key,
            **metadata,
        }
        if variant is not None:
            row["variant"] = variant
        self.rows.append(row)
        return row

    def write(self) -> Path:
        columns = ["variant", *self.metadata] if any("variant" in r for r in self.rows) else self.metadata
        OutputStore(self.root).write_results(self.rows, columns)
        return self.root


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root`, by its relative path (an absent folder: empty)."""
    if not root.exists():
        return {}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
