"""Preflight checks: every rule reports its row and field (with a hint where one helps), all at once."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from imagebatch.gateway.constants import MAX_UPLOAD_BYTES
from imagebatch.manifest import (
    MAX_NATIVE_IMAGE_BYTES,
    ManifestError,
    Problem,
    id_fault,
    is_safe_id,
    load_manifest,
)
from imagebatch.manifest import files as manifest_files
from imagebatch.manifest.check import FileChecker, looks_like_field, size_fault


@pytest.fixture
def folder(tmp_path: Path) -> Path:
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


CSV_CASES: list[tuple[str, dict[str, str], str, str, str | None]] = [
    # (case, row, field, text in message, text in hint)
    # models and routes
    ("unknown image model", {"model": "native-image-3"}, "model", "unknown model", "native-image-2"),
    (
        "text model without route",
        {"model": "claude-x"},
        "route",
        "route is required",
        "messages or responses",
    ),
    ("unknown route", {"route": "video"}, "route", "unknown route 'video'", None),
    ("route case", {"route": "Native"}, "route", "unknown route", "did you mean 'native'?"),
    ("wire route name", {"route": "images_edits"}, "route", "unknown route", "use 'images'"),
    (
        "native model on images",
        {"route": "images", "model": "native-image-2"},
        "model",
        "unsupported_endpoint",
        None,
    ),
    ("compat model on native", {"route": "native", "model": "compat-image-2"}, "model", "images route", None),
    (
        "compat model on chat",
        {"route": "chat", "model": "compat-image-2"},
        "model",
        "not on the chat route",
        None,
    ),
    ("unknown model on chat", {"route": "chat", "model": "foo"}, "model", "unknown model 'foo'", None),
    ("unknown model on images", {"route": "images", "model": "dall"}, "model", "unknown model 'dall'", None),
    (
        "image model on messages",
        {"route": "messages", "model": "native-image-pro"},
        "model",
        "image model",
        None,
    ),
    (
        "image model on responses",
        {"route": "responses", "model": "compat-image-2"},
        "model",
        "image model",
        None,
    ),
    (
        "messages needs a model",
        {"route": "messages"},
        "model",
        "model is required on the messages route",
        None,
    ),
    ("responses needs a model", {"route": "responses"}, "model", "model is required", None),
    # fields on the wrong route
    ("size on native", {"size": "1024x1024"}, "size", "does not apply to the native route", "image_size"),
    (
        "size on chat",
        {"route": "chat", "size": "1024x1024"},
        "size",
        "does not apply to the chat route",
        None,
    ),
    (
        "image_size on images",
        {"model": "compat-image-2", "image_size": "1K"},
        "image_size",
        "images route",
        "size",
    ),
    (
        "aspect_ratio on images",
        {"route": "images", "aspect_ratio": "1:1"},
        "aspect_ratio",
        "images route",
        None,
    ),
    ("max_images on images", {"route": "images", "max_images": "2"}, "max_images", "images route", "count"),
    (
        "max_images on messages",
        {"route": "messages", "model": "t", "max_images": "2"},
        "max_images",
        "messages",
        None,
    ),
    (
        "references on chat",
        {"route": "chat", "reference_images": "images/ref.png"},
        "reference_images",
        "chat",
        None,
    ),
    (
        "references on messages",
        {"route": "messages", "model": "t", "reference_images": "images/ref.png"},
        "reference_images",
        "messages route",
        None,
    ),
    (
        "references on responses",
        {"route": "responses", "model": "t", "reference_images": "images/ref.png"},
        "reference_images",
        "responses route",
        None,
    ),
    (
        "mask on native",
        {"reference_images": "images/ref.png", "mask": "images/mask.png"},
        "mask",
        "does not apply to the native route",
        "images route",
    ),
    ("mask on chat", {"route": "chat", "mask": "images/mask.png"}, "mask", "chat route", None),
    (
        "mask without reference",
        {"route": "images", "mask": "images/mask.png"},
        "mask",
        "needs a reference image",
        None,
    ),
    ("max_tokens on native", {"max_tokens": "10"}, "max_tokens", "native route", None),
    (
        "max_tokens on responses",
        {"route": "responses", "model": "t", "max_tokens": "9"},
        "max_tokens",
        "responses",
        None,
    ),
    # values
    (
        "ratio not for model",
        {"model": "native-image-pro", "aspect_ratio": "1:8"},
        "aspect_ratio",
        "not supported",
        "native-image-2",
    ),
    (
        "ratio spelled with x",
        {"aspect_ratio": "16x9"},
        "aspect_ratio",
        "not supported",
        "did you mean '16:9'?",
    ),
    (
        "ratio on chat",
        {"route": "chat", "model": "native-image-pro", "aspect_ratio": "4:1"},
        "aspect_ratio",
        "4:1",
        None,
    ),
    ("ratio unknown", {"aspect_ratio": "7:3"}, "aspect_ratio", "not supported by native-image-2.1", None),
    ("image size lowercase", {"image_size": "1k"}, "image_size", "not '1k'", "did you mean '1K'?"),
    ("image size unknown", {"image_size": "3K"}, "image_size", "must be one of 1K, 2K, 4K", None),
    (
        "size upper X",
        {"model": "compat-image-2", "size": "1024X1024"},
        "size",
        "must be one of",
        "'1024x1024'",
    ),
    (
        "size as image_size",
        {"model": "compat-image-2", "size": "2K"},
        "size",
        "must be one of",
        "image_size values",
    ),
    ("size unknown", {"model": "compat-image-2", "size": "999x999"}, "size", "not '999x999'", None),
    ("max_images zero", {"max_images": "0"}, "max_images", "from 1 to 4, not 0", None),
    ("max_images five", {"max_images": "5"}, "max_images", "from 1 to 4, not 5", "use count"),
    ("max_images word", {"max_images": "two"}, "max_images", "whole number", None),
    ("max_images decimal", {"max_images": "1.5"}, "max_images", "whole number", None),
    ("count zero", {"count": "0"}, "count", "from 1 to 100, not 0", None),
    ("count too many", {"count": "101"}, "count", "from 1 to 100, not 101", "several rows"),
    ("count negative", {"count": "-1"}, "count", "not -1", None),
    ("count word", {"count": "x"}, "count", "whole number", None),
    (
        "max_tokens zero",
        {"route": "messages", "model": "t", "max_tokens": "0"},
        "max_tokens",
        "at least 1",
        None,
    ),
    (
        "max_tokens word",
        {"route": "messages", "model": "t", "max_tokens": "lots"},
        "max_tokens",
        "whole number",
        None,
    ),
    # prompt and templates
    ("prompt missing", {"prompt": ""}, "prompt", "prompt is required", None),
    ("prompt blank", {"prompt": "   "}, "prompt", "prompt is required", None),
    (
        "placeholder names no column",
        {"prompt": "A {colour} mug"},
        "prompt",
        "placeholder {colour} names no column",
        None,
    ),
    (
        "placeholder near miss",
        {"prompt": "A {colr} mug", "colour": "red"},
        "prompt",
        "{colr}",
        "did you mean {colour}?",
    ),
    ("unmatched brace", {"prompt": "A } mug"}, "prompt", "unmatched '}'", "{{ or }}"),
    ("empty placeholder", {"prompt": "A {} mug"}, "prompt", "empty placeholder", None),
    ("self placeholder", {"prompt": "A {prompt}"}, "prompt", "contain itself", None),
    ("empty after render", {"prompt": "{blank}", "blank": ""}, "prompt", "empty once its placeholders", None),
    # ids
    ("id missing", {"id": ""}, "id", "id is required", None),
    ("id with space", {"id": "sku 1"}, "id", "not safe as a file name", "e.g. 'sku-1'"),
    ("id path", {"id": "../x"}, "id", "not safe", None),
    ("id leading dot", {"id": ".hidden"}, "id", "not safe", None),
    ("id leading dash", {"id": "-x"}, "id", "not safe", None),
    ("id too long", {"id": "x" * 129}, "id", "at most 128", None),
    # files
    ("missing file", {"reference_images": "images/nope.png"}, "reference_images", "file not found", None),
    (
        "misspelt file",
        {"reference_images": "images/ref.pgn"},
        "reference_images",
        "not found",
        "did you mean 'ref.png'?",
    ),
    ("folder", {"reference_images": "images/dir.png"}, "reference_images", "is a folder", None),
    ("not an image", {"reference_images": "images/fake.png"}, "reference_images", "not a PNG or JPEG", None),
    ("webp", {"reference_images": "images/webp.png"}, "reference_images", "not a PNG or JPEG", "WebP"),
    (
        "damaged png",
        {"reference_images": "images/damaged.png"},
        "reference_images",
        "damaged image/png",
        None,
    ),
    (
        "too big",
        {"reference_images": "images/big.png"},
        "reference_images",
        "must be under 50,000,000 bytes",
        None,
    ),
    (
        "missing mask",
        {"route": "images", "reference_images": "images/ref.png", "mask": "images/none.png"},
        "mask",
        "file not found",
        None,
    ),
    (
        "mask without alpha",
        {"route": "images", "reference_images": "images/ref.png", "mask": "images/mask-rgb.png"},
        "mask",
        "no alpha channel",
        "PNG with transparency",
    ),
    (
        "mask of another size",
        {"route": "images", "reference_images": "images/ref.png", "mask": "images/mask-small.png"},
        "mask",
        "the mask is 32x32 but the first reference image is 64x64",
        None,
    ),
    (
        "mask of another format",
        {"route": "images", "reference_images": "images/photo.jpg", "mask": "images/mask.png"},
        "mask",
        "the mask is image/png but the first reference image is image/jpeg",
        None,
    ),
]


@pytest.mark.parametrize(
    ("row", "field", "text", "hint"), [c[1:] for c in CSV_CASES], ids=[c[0] for c in CSV_CASES]
)
def test_csv_check(folder: Path, row: dict[str, str], field: str, text: str, hint: str | None) -> None:
    problem = assert_one(csv_problems(folder, row), field, text, hint)
    assert problem.line == 2
    assert problem.unit == "line"


JSON_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("turns on chat", {"route": "chat", "turns": ["more"]}, "turns", "does not apply to the chat route"),
    (
        "turns on images",
        {"route": "images", "turns": ["more"]},
        "turns",
        "does not apply to the images route",
    ),
    ("turns not a list", {"turns": "more"}, "turns", "must be a list"),
    (
        "turn without prompt",
        {"turns": [{"reference_images": []}]},
        "turns[0].prompt",
        "each turn needs a prompt",
    ),
    (
        "turn with empty prompt",
        {"turns": ["ok", {"prompt": " "}]},
        "turns[1].prompt",
        "each turn needs a prompt",
    ),
    ("turn unknown key", {"turns": [{"prompt": "x", "image": "a.png"}]}, "turns[0].image", "only prompt and"),
    ("turn not an object", {"turns": [3]}, "turns[0]", "each turn must be an object"),
    (
        "turn missing file",
        {"turns": [{"prompt": "x", "reference_images": ["images/nope.png"]}]},
        "turns[0].reference_images",
        "file not found",
    ),
    ("turn placeholder", {"turns": ["in {colour}"]}, "turns[0].prompt", "{colour} names no column"),
    ("references not a list", {"reference_images": 3}, "reference_images", "must be a list"),
    ("reference not text", {"reference_images": [True]}, "reference_images[0]", "must be text"),
    ("prompt not text", {"prompt": ["a"]}, "prompt", "must be text"),
    ("count boolean", {"count": True}, "count", "whole number"),
    ("count float", {"count": 2.0}, "count", "whole number"),
    ("metadata object", {"tags": {"a": 1}}, "tags", "metadata values must be text"),
    ("lookalike key", {"imageSize": "2K"}, "imageSize", "not a field name"),
    ("placeholder names a list", {"prompt": "{tags}", "tags": ["a"]}, "prompt", "names a list or object"),
]


@pytest.mark.parametrize(
    ("job", "field", "text"), [c[1:] for c in JSON_CASES], ids=[c[0] for c in JSON_CASES]
)
def test_json_check(folder: Path, job: dict[str, Any], field: str, text: str) -> None:
    problems = [p for p in json_problems(folder, job) if p.field != "tags" or field == "tags"]
    problem = assert_one(problems, field, text)
    assert (problem.line, problem.unit, problem.job_id) == (0, "job", "job-1")


VALID_ROWS: list[tuple[str, dict[str, str]]] = [
    ("defaults", {}),
    ("jpeg named png", {"reference_images": "images/photo-named.png"}),
    ("several references", {"reference_images": "images/ref.png;images/photo.jpg"}),
    ("masked edit", {"route": "images", "reference_images": "images/ref.png", "mask": "images/mask.png"}),
    (
        "rgba source with mask",
        {"model": "compat-image-2", "reference_images": "images/ref-rgba.png", "mask": "images/mask.png"},
    ),
    ("images generation", {"model": "compat-image-2", "size": "auto"}),
    (
        "chat",
        {
            "route": "chat",
            "model": "native-image-pro",
            "aspect_ratio": "21:9",
            "max_images": "4",
            "image_size": "4K",
        },
    ),
    ("native 8:1", {"model": "native-image-2", "aspect_ratio": "8:1"}),
    ("messages", {"route": "messages", "model": "claude-compat-small", "max_tokens": "5"}),
    ("responses", {"route": "responses", "model": "gpt-compat-mini"}),
    ("count 100", {"count": "100"}),
    ("literal braces", {"prompt": "a {{literal}} brace and {{ }}"}),
    ("absolute path", {"reference_images": "ABS"}),
    ("windows separators", {"reference_images": "images\\ref.png"}),
    ("id characters", {"id": "A.b_c-9"}),
]


@pytest.mark.parametrize("row", [r for _, r in VALID_ROWS], ids=[n for n, _ in VALID_ROWS])
def test_valid_rows(folder: Path, row: dict[str, str]) -> None:
    if row.get("reference_images") == "ABS":
        row = {**row, "reference_images": str(folder / "images" / "ref.png")}
    assert csv_problems(folder, row) == []


def test_problem_text_matches_the_contract(folder: Path) -> None:
    rows = "".join(f"sku-{i},a photo,1K\n" for i in range(5)) + "sku-123,a photo,1k\n"
    (folder / "m.csv").write_text("id,prompt,image_size\n" + rows)
    with pytest.raises(ManifestError) as info:
        load_manifest(folder / "m.csv")
    assert [str(p) for p in info.value.problems] == [
        "line 7 (id=sku-123), field image_size: image size must be one of 1K, 2K, 4K (case-sensitive), "
        "not '1k' (did you mean '1K'?)"
    ]


def test_every_problem_of_every_row_is_reported(folder: Path) -> None:
    (folder / "m.csv").write_text(
        "id,prompt,image_size,count,reference_images\n"
        "a,x,1k,0,images/nope.png\n"
        "ok,x,2K,2,images/ref.png\n"
        "b,,4K,,\n"
        "a,x,,,\n"
    )
    with pytest.raises(ManifestError) as info:
        load_manifest(folder / "m.csv")
    found = [(p.line, p.field) for p in info.value.problems]
    assert sorted(found) == [
        (2, "count"),
        (2, "image_size"),
        (2, "reference_images"),
        (4, "prompt"),
        (5, "id"),
    ]


def test_duplicate_ids_name_both_lines(folder: Path) -> None:
    (folder / "m.csv").write_text("id,prompt\na,x\nb,x\na,y\nB,z\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(folder / "m.csv")
    assert [str(p) for p in info.value.problems] == [
        "line 4 (id=a), field id: duplicate id 'a': also used on line 2",
        "line 5 (id=B), field id: id 'B' differs from 'b' (line 3) only by case "
        "(their file names would collide on case-insensitive file systems)",
    ]


def test_duplicate_ids_in_json_name_both_jobs(folder: Path) -> None:
    (folder / "m.json").write_text(json.dumps([{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}]))
    with pytest.raises(ManifestError) as info:
        load_manifest(folder / "m.json")
    assert [str(p) for p in info.value.problems] == [
        "job #1 (id=a), field id: duplicate id 'a': also used on job #0"
    ]


def test_lookalike_column_reported_once_at_the_header(folder: Path) -> None:
    (folder / "m.csv").write_text("id,prompt,Image Size\na,x,1K\nb,y,2K\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(folder / "m.csv")
    [problem] = info.value.problems
    assert (problem.line, problem.field) == (1, "Image Size")
    assert problem.hint and "did you mean 'image_size'?" in problem.hint


@pytest.mark.parametrize(
    ("name", "meant"),
    [("Aspect Ratio", "aspect_ratio"), ("imageSize", "image_size"), ("ID", "id"), ("Prompts", "prompt"),
     ("reference_image", "reference_images"), ("refs", "reference_images"), ("n", "count"),
     ("max-images", "max_images"),
     ("colour", None), ("sku", None), ("product_name", None), ("model_name", None), ("sizes_note", None)],
)  # fmt: skip
def test_looks_like_field(name: str, meant: str | None) -> None:
    assert looks_like_field(name) == meant


def test_unreadable_file(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open

    def refusing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(path).name == "ref.png":
            raise PermissionError(13, "Permission denied")
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    assert_one(
        csv_problems(folder, {"reference_images": "images/ref.png"}), "reference_images", "cannot read"
    )


def test_big_file_is_refused_without_being_read(folder: Path) -> None:
    checker = FileChecker(folder)
    facts = checker.check("images/big.png")
    assert facts.error is not None and "50,000,000" in facts.error
    assert checker.reads == 0


def test_each_distinct_file_is_read_once(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = manifest_files.inspect_image

    def counting(data: bytes) -> Any:
        calls.append(len(data))
        return real(data)

    monkeypatch.setattr(manifest_files, "inspect_image", counting)
    spellings = [
        "images/ref.png",
        "./images/ref.png",
        str(folder / "images" / "ref.png"),
        "images/../images/ref.png",
    ]
    rows = [f"r{i},x,{spellings[i % 4]};images/photo.jpg\n" for i in range(400)]
    (folder / "m.csv").write_text("id,prompt,reference_images\n" + "".join(rows))
    manifest = load_manifest(folder / "m.csv")
    assert len(manifest.jobs) == 400
    assert len(calls) == 2
    assert {job.reference_images[0] for job in manifest.jobs} == {(folder / "images" / "ref.png").resolve()}


def test_symlinked_file_resolves_to_its_target(folder: Path) -> None:
    os.symlink(folder / "images" / "ref.png", folder / "link.png")
    (folder / "m.csv").write_text("id,prompt,reference_images\na,x,link.png\n")
    job = load_manifest(folder / "m.csv").jobs[0]
    assert job.reference_images == [(folder / "images" / "ref.png").resolve()]


# --- every turn checked on its own; ids Windows cannot use; whose size limit it is ----------------------


def assert_fields(problems: list[Problem], expected: dict[str, str]) -> None:
    """Exactly one problem per field in `expected`, each message containing the text given."""
    found = {p.field: p for p in problems}
    assert len(found) == len(problems), [str(p) for p in problems]
    assert set(found) == set(expected), [str(p) for p in problems]
    for field, text in expected.items():
        assert text in found[field].message, str(found[field])


# --- M3: one malformed turn does not hide the problems of the others ----------------------------------

TURN_CASES: list[tuple[str, list[Any], dict[str, str]]] = [
    (
        "issue example: WebP, no prompt, a stray number",
        [{"prompt": "warmer", "reference_images": ["images/webp.png"]}, {"reference_images": []}, 5],
        {
            "turns[0].reference_images": "not a PNG or JPEG",
            "turns[1].prompt": "each turn needs a prompt",
            "turns[2]": "each turn must be an object",
        },
    ),
    (
        "malformed turn first",
        [None, "in {colour}", {"prompt": "x", "reference_images": ["images/nope.png"]}],
        {
            "turns[0]": "each turn must be an object",
            "turns[1].prompt": "{colour} names no column",
            "turns[2].reference_images": "file not found",
        },
    ),
    (
        "a list where a turn belongs",
        [["a"], {"prompt": "x", "reference_images": ["images/fake.png"]}],
        {"turns[0]": "each turn must be an object", "turns[1].reference_images": "not a PNG or JPEG"},
    ),
    (
        "a turn's other fields are still checked",
        [{"prompt": "x", "image": "a.png", "reference_images": ["images/dir.png"]}],
        {"turns[0].image": "only prompt and reference_images", "turns[0].reference_images": "is a folder"},
    ),
    (
        "a prompt of the wrong type is not also missing",
        [{"prompt": ["a"], "reference_images": ["images/webp.png"]}, "ok", 7.5],
        {
            "turns[0].prompt": "must be text",
            "turns[0].reference_images": "not a PNG or JPEG",
            "turns[2]": "each turn must be an object",
        },
    ),
    (
        "a bad reference entry and a missing prompt elsewhere",
        [{"prompt": "x", "reference_images": [True]}, {"prompt": " "}],
        {"turns[0].reference_images[0]": "must be text", "turns[1].prompt": "each turn needs a prompt"},
    ),
]


@pytest.mark.parametrize(("turns", "expected"), [c[1:] for c in TURN_CASES], ids=[c[0] for c in TURN_CASES])
def test_every_turn_is_checked(folder: Path, turns: list[Any], expected: dict[str, str]) -> None:
    problems = json_problems(folder, {"turns": turns})
    assert_fields(problems, expected)
    assert all((p.line, p.unit, p.job_id) == (0, "job", "job-1") for p in problems)


def test_turn_problems_sit_with_the_rows_other_problems(folder: Path) -> None:
    problems = json_problems(folder, {"image_size": "1k", "turns": [5, {"reference_images": []}]})
    assert_fields(
        problems,
        {
            "image_size": "not '1k'",
            "turns[0]": "each turn must be an object",
            "turns[1].prompt": "each turn needs a prompt",
        },
    )


def test_good_turns_still_load(folder: Path) -> None:
    (folder / "m.json").write_text(
        json.dumps([{"id": "a", "prompt": "x", "turns": ["one", {"prompt": "two", "image": 1}, "three"]}])
    )
    with pytest.raises(ManifestError) as info:
        load_manifest(folder / "m.json")
    assert [p.field for p in info.value.problems] == ["turns[1].image"]


@pytest.mark.parametrize(
    ("default_turns", "expected"),
    [
        (["ok", 7], {"defaults.turns[1]": "each turn must be an object"}),
        (
            [{"prompt": "x", "image": 1}, None],
            {"defaults.turns[0].image": "only prompt", "defaults.turns[1]": "each turn must be an object"},
        ),
    ],
)
def test_faulty_default_turns_are_reported_once(
    folder: Path, default_turns: list[Any], expected: dict[str, str]
) -> None:
    doc = {
        "defaults": {"turns": default_turns},
        "jobs": [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}],
    }
    (folder / "m.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError) as info:
        load_manifest(folder / "m.json")
    assert_fields(info.value.problems, expected)


# --- M4: ids Windows cannot use as file or folder names -----------------------------------------------

UNSAFE_IDS: list[tuple[str, str, str | None]] = [
    # (id, text in message, suggestion in hint)
    ("CON", "CON is a reserved device name", "e.g. 'CON_'"),
    ("con", "CON is a reserved device name", "e.g. 'con_'"),
    ("Prn", "PRN is a reserved device name", None),
    ("aux", "AUX is a reserved device name", None),
    ("NUL", "NUL is a reserved device name", None),
    ("nul.txt", "NUL is a reserved device name", "e.g. 'nul_.txt'"),
    ("Nul.tar.gz", "NUL is a reserved device name", "e.g. 'Nul_.tar.gz'"),
    ("COM1", "COM1 is a reserved device name", None),
    ("com9.png", "COM9 is a reserved device name", None),
    ("LPT1", "LPT1 is a reserved device name", None),
    ("lpt9", "LPT9 is a reserved device name", None),
    ("abc.", "ends with '.'", "e.g. 'abc'"),
    ("abc..", "ends with '.'", "e.g. 'abc'"),
    ("v1.2.", "ends with '.'", "e.g. 'v1.2'"),
    ("con.", "CON is a reserved device name", "e.g. 'con_'"),
]


@pytest.mark.parametrize(("job_id", "text", "hint"), UNSAFE_IDS, ids=[c[0] for c in UNSAFE_IDS])
def test_ids_windows_cannot_use_are_refused(folder: Path, job_id: str, text: str, hint: str | None) -> None:
    problem = assert_one(csv_problems(folder, {"id": job_id}), "id", "not safe as a file or folder name")
    assert text in problem.message
    assert "Windows" in problem.message
    if hint is not None:
        assert problem.hint == hint
    assert not is_safe_id(job_id)


@pytest.mark.parametrize(
    "job_id",
    ["CONSOLE", "con2", "com10", "COM0", "lpt", "nullable", "aux-1", "a.con", "x.nul", "v1.2", "abc._"],
)
def test_ids_near_reserved_names_are_fine(folder: Path, job_id: str) -> None:
    assert id_fault(job_id) is None
    assert is_safe_id(job_id)
    assert csv_problems(folder, {"id": job_id}) == []


def test_unsafe_id_suggestion_is_itself_safe(folder: Path) -> None:
    # 'sku 1 .' would be suggested as 'sku-1-.', which ends with a dot: offer the safe form instead.
    problem = assert_one(csv_problems(folder, {"id": "sku 1 ."}), "id", "not safe as a file name")
    assert problem.hint == "e.g. 'sku-1-'"


def test_trailing_dot_id_and_its_twin_in_json(folder: Path) -> None:
    (folder / "m.json").write_text(json.dumps([{"id": "abc", "prompt": "x"}, {"id": "abc.", "prompt": "y"}]))
    with pytest.raises(ManifestError) as info:
        load_manifest(folder / "m.json")
    [problem] = info.value.problems
    assert (problem.line, problem.job_id, problem.field) == (1, "abc.", "id")
    assert "would mix with those of 'abc'" in problem.message


# --- M2: the 50 MB limit is the service's on the images route, imagebatch's own on the native route -----

SIZE_CASES: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
    # (case, format, fields, {field: text in message})
    (
        "native reference",
        "csv",
        {"reference_images": "images/big.png"},
        {"reference_images": "imagebatch's own guard: the spec gives no limit for inline images there"},
    ),
    (
        "native by model",
        "csv",
        {"model": "native-image-pro", "reference_images": "images/ref.png;images/big.png"},
        {"reference_images": "on the native route (imagebatch's own guard"},
    ),
    (
        "images reference",
        "csv",
        {"route": "images", "reference_images": "images/big.png"},
        {"reference_images": "on the images route (the service's limit)"},
    ),
    (
        "images mask",
        "csv",
        {"route": "images", "reference_images": "images/ref.png", "mask": "images/big.png"},
        {"mask": "on the images route (the service's limit)"},
    ),
    (
        "turn reference",
        "json",
        {"turns": [{"prompt": "x", "reference_images": ["images/big.png"]}]},
        {"turns[0].reference_images": "imagebatch's own guard"},
    ),
    (
        "route unknown",
        "csv",
        {"route": "video", "reference_images": "images/big.png"},
        {
            "route": "unknown route",
            "reference_images": "the service's limit on the images route, imagebatch's own guard",
        },
    ),
]


@pytest.mark.parametrize(
    ("fmt", "row", "expected"), [c[1:] for c in SIZE_CASES], ids=[c[0] for c in SIZE_CASES]
)
def test_size_message_names_whose_limit_it_is(
    folder: Path, fmt: str, row: dict[str, Any], expected: dict[str, str]
) -> None:
    problems = csv_problems(folder, row) if fmt == "csv" else json_problems(folder, row)
    assert_fields(problems, expected)
    for problem in problems:
        if problem.field != "route":
            assert "must be under 50,000,000 bytes" in problem.message
            assert problem.hint == "downscale or recompress it"
    native = [p for p in problems if "native route (" in p.message]
    assert all("service" not in p.message for p in native)


@pytest.mark.parametrize(
    ("size", "route", "refused"),
    [
        (MAX_UPLOAD_BYTES - 1, "images", False),
        (MAX_UPLOAD_BYTES, "images", True),
        (MAX_NATIVE_IMAGE_BYTES - 1, "native", False),
        (MAX_NATIVE_IMAGE_BYTES, "native", True),
        (MAX_UPLOAD_BYTES, None, True),
        (None, "native", False),
        (10, None, False),
    ],
)
def test_size_fault(size: int | None, route: str | None, refused: bool) -> None:
    assert (size_fault(size, route) is not None) == refused


def test_a_large_plan_shares_what_its_rows_repeat(tmp_path: Path) -> None:
    """The plan is kept for a whole run: values that repeat across rows are one object, not one per row."""
    path = tmp_path / "m.csv"
    path.write_text(
        "id,prompt,image_size,aspect_ratio\n" + "".join(f"r{i},p {i},2K,16:9\n" for i in range(3))
    )
    first, _, last = load_manifest(path).jobs
    assert (first.image_size, first.aspect_ratio) == (last.image_size, last.aspect_ratio) == ("2K", "16:9")
    assert first.image_size is last.image_size and first.aspect_ratio is last.aspect_ratio
    assert first.model is last.model and first.__pydantic_fields_set__ is last.__pydantic_fields_set__
    assert first.prompt == "p 0" and last.prompt == "p 2"
