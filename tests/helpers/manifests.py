"""Preflight's test ground: a manifest folder of good and bad reference images, and the problems a one-row
manifest gets from `load_manifest`.

    problems = csv_problems(folder, {"model": "native-image-3"})
    assert_one(problems, "model", "unknown model", hint="native-image-2")
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from PIL import Image

from imagebatch.gateway.constants import MAX_UPLOAD_BYTES
from imagebatch.manifest import ManifestError, Problem, load_manifest


def manifest_folder(tmp_path: Path) -> Path:
    """A manifest folder with good and bad files under images/."""
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(images / "ref.png")
    Image.new("RGBA", (64, 64), (30, 200, 30, 255)).save(images / "ref-rgba.png")
    mask = Image.new("RGBA", (64, 64), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (16, 16, 48, 48))
    mask.save(images / "mask.png")
    Image.new("RGB", (64, 64), (255, 255, 255)).save(images / "mask-rgb.png")
    Image.new("RGBA", (32, 32), (0, 0, 0, 0)).save(images / "mask-small.png")
    Image.new("RGB", (64, 64), (30, 30, 200)).save(images / "photo.jpg")
    (images / "photo-named.png").write_bytes((images / "photo.jpg").read_bytes())  # JPEG bytes, .png name
    (images / "fake.png").write_text("not an image")
    (images / "webp.png").write_bytes(b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 16)
    (images / "damaged.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    with open(images / "big.png", "wb") as fh:  # sparse: takes no disk space
        fh.truncate(MAX_UPLOAD_BYTES)
    (images / "dir.png").mkdir()
    return tmp_path


def csv_problems(folder: Path, row: dict[str, str]) -> list[Problem]:
    """Problems of a one-row CSV manifest (row on line 2); [] when it loads."""
    row = {"id": "job-1", "prompt": "a photo", **row}
    path = folder / "m.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    try:
        load_manifest(path)
    except ManifestError as exc:
        return exc.problems
    return []


def json_problems(folder: Path, job: dict[str, Any]) -> list[Problem]:
    path = folder / "m.json"
    path.write_text(json.dumps([{"id": "job-1", "prompt": "a photo", **job}]))
    try:
        load_manifest(path)
    except ManifestError as exc:
        return exc.problems
    return []


def assert_one(problems: list[Problem], field: str, text: str, hint: str | None = None) -> Problem:
    assert len(problems) == 1, [str(p) for p in problems]
    problem = problems[0]
    assert problem.field == field, str(problem)
    assert text in problem.message, str(problem)
    if hint is not None:
        assert hint in (problem.hint or ""), str(problem)
    return problem


def assert_fields(problems: list[Problem], expected: dict[str, str]) -> None:
    """Exactly one problem per field in `expected`, each message containing the text given."""
    found = {p.field: p for p in problems}
    assert len(found) == len(problems), [str(p) for p in problems]
    assert set(found) == set(expected), [str(p) for p in problems]
    for field, text in expected.items():
        assert text in found[field].message, str(found[field])


def collide_and_count_readings(monkeypatch: Any, colliding_id: str) -> list[int]:
    """Make `colliding_id`'s hash look already taken (a collision of two ids' hashes, too rare to meet by
    chance) and count the manifest's readings: the returned list gets one item per reading."""
    from imagebatch.manifest import textfile
    from imagebatch.manifest.ids import IdHashes

    add, real = IdHashes.add, textfile.TextBlocks.__iter__
    reads: list[int] = []

    def colliding(self: IdHashes, value: int) -> bool:
        if value == (hash(colliding_id) or 1):
            self.repeated.add(value)  # as if an earlier id had had this hash
            return False
        return add(self, value)

    def counted(self: textfile.TextBlocks) -> Any:
        reads.append(1)
        return real(self)

    monkeypatch.setattr(IdHashes, "add", colliding)
    monkeypatch.setattr(textfile.TextBlocks, "__iter__", counted)
    return reads
