"""Preflight checks: every rule reports its row and field (with a hint where one helps), all at once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from helpers.manifests import assert_one, csv_problems, json_problems

from imagebatch.manifest import ManifestError, load_manifest
from imagebatch.manifest import files as manifest_files
from imagebatch.manifest.check import FileChecker, looks_like_field

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
    ("lookalike key", {"imageSize": "2K"}, "imageSize", "is not a field; did you mean"),
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


def test_lookalike_column_reported_once_at_the_header(folder: Path) -> None:
    (folder / "m.csv").write_text("id,prompt,Image Size\na,x,1K\nb,y,2K\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(folder / "m.csv")
    [problem] = info.value.problems
    assert (problem.line, problem.field) == (1, "Image Size")
    assert "did you mean 'image_size'?" in problem.message


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
