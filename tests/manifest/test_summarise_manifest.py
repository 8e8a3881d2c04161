"""`summarise_manifest` (what a plain `imagebatch validate` prints) checks a manifest as `load_manifest`
does, row for row, and counts the plan the loaded manifest's jobs would make: the same summary, the same
problems in the same order, with no job kept and none made only to be counted."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import openpyxl
import pytest
from helpers.manifests import collide_and_count_readings

from imagebatch.manifest import (
    ManifestError,
    load_manifest,
    plan,
    summarise,
    summarise_manifest,
)
from imagebatch.manifest import shapes as shapes_module

HEADER = ["id", "route", "model", "aspect_ratio", "image_size", "size", "reference_images", "mask", "count"]
HEADER += ["max_images", "max_tokens", "colour", "sku", "prompt"]
METADATA = ("colour", "sku")

# route, model, aspect_ratio, image_size, size, reference_images, mask, count, max_images, max_tokens
SHAPES = [
    ["", "", "4:5", "", "", "images/ref.png", "", "", "", ""],
    ["", "", "16:9", "2K", "", "", "", "3", "2", ""],
    ["images", "", "", "", "1024x1024", "images/ref-rgba.png", "images/mask.png", "", "", ""],
    ["images", "", "", "", "1024x1024", "", "", "2", "", ""],
    ["messages", "claude-compat-small", "", "", "", "", "", "", "", "300"],
    ["chat", "", "1:1", "", "", "", "", "", "4", ""],
    ["responses", "gpt-compat-mini", "", "", "", "", "", "4", "", ""],
    ["", "", "", "", "", "", "", "", "", ""],
]
BAD_SHAPES = [
    ["", "native-image-3", "", "", "", "", "", "", "", ""],  # unknown model
    ["", "", "", "", "", "images/nope.png", "", "", "", ""],  # no such file
    ["images", "", "", "", "", "", "images/mask.png", "", "", ""],  # a mask with no reference image
    ["", "", "", "", "", "", "", "0", "", ""],  # count out of range
    ["", "", "", "1k", "", "", "", "", "", ""],  # image size in the wrong case
]


def _clean_rows(n: int) -> list[list[str]]:
    """`n` clean rows cycling the shapes, with templated prompts and a metadata column or two."""
    rows = []
    for i in range(n):
        colour = ["red", "sage green", ""][i % 3]
        prompt = ["A {colour} mug", "Photo of {sku}", "plain words", " {{braces}} and {colour} "][i % 4]
        rows.append([f"job-{i}", *SHAPES[i % len(SHAPES)], colour, f"SKU{i:05d}", prompt])
    return rows


def _faulty_rows(n: int) -> list[list[str]]:
    """Clean rows with every kind of fault sprinkled in: a bad shape, an id taken twice or unsafe, a
    prompt that does not fill in, a carriage return."""
    rows = _clean_rows(n)
    for i, row in enumerate(rows):
        if i % 17 == 0:
            row[1:11] = BAD_SHAPES[(i // 17) % len(BAD_SHAPES)]
        match i % 23:
            case 3:
                row[0] = f"job-{i - 1}"  # a duplicate
            case 5:
                row[0] = f"JOB-{i - 2}"  # differs only by case
            case 7:
                row[0] = ["CON", "nul.txt", "abc.", "has space", "", " ", f" job-{i} ", f"job-{i}\r"][i % 8]
            case 9:
                row[-1] = ["{colur} mug", "{colour}", "", "a\r\nb", "x {", "{prompt}"][i % 6]
            case 11:
                row[11] = "navy\r\nblue"
    return rows


def _csv(path: Path, rows: list[list[str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(HEADER)
        writer.writerows(rows)
    return path


def _xlsx(path: Path, rows: list[list[str]]) -> Path:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.title = "Products"
    sheet.append(HEADER)
    for row in rows:
        sheet.append(row)
    book.save(path)
    return path


def _jsonl(path: Path, rows: list[list[str]]) -> Path:
    """The rows as JSON Lines jobs (their empty fields left out, not their metadata), every third with
    turns."""
    lines = []
    for i, row in enumerate(rows):
        job: dict[str, object] = {k: v for k, v in zip(HEADER, row, strict=True) if v or k in METADATA}
        for key in ("count", "max_images", "max_tokens"):
            if key in job:
                job[key] = int(str(job[key]))
        job["reference_images"] = [job["reference_images"]] if "reference_images" in job else []
        if i % 3 == 0 and job.get("route", "native") == "native":
            job["turns"] = ["make it brighter", "now at dusk"]
        lines.append(json.dumps(job))
    path.write_text("\n".join(lines) + "\n")
    return path


def _manifests(folder: Path, rows: list[list[str]]) -> Iterator[Path]:
    yield _csv(folder / "m.csv", rows)
    yield _xlsx(folder / "m.xlsx", rows)
    yield _jsonl(folder / "m.jsonl", rows)


def test_a_summary_counts_what_the_loaded_manifests_plan_would(folder: Path) -> None:
    for path in _manifests(folder, _clean_rows(400)):
        loaded = load_manifest(path)
        expected = summarise(plan(loaded))

        summary = summarise_manifest(path)

        assert summary.plan == expected, path.name
        assert summary.plan.table() == expected.table()
        assert (summary.path, summary.sha256, summary.format, summary.sheet) == (
            loaded.path,
            loaded.sha256,
            loaded.format,
            loaded.sheet,
        )
        assert summary.plan.jobs == 400
        assert len(summary.plan.by_route_model) >= 6


def test_a_summary_refuses_what_loading_refuses_with_the_same_problems(folder: Path) -> None:
    for path in _manifests(folder, _faulty_rows(600)):
        with pytest.raises(ManifestError) as loading:
            load_manifest(path)
        with pytest.raises(ManifestError) as summarising:
            summarise_manifest(path)
        assert [str(p) for p in summarising.value.problems] == [str(p) for p in loading.value.problems]
        assert summarising.value.problems == loading.value.problems
        assert len(loading.value.problems) > 50, path.name


def test_a_summary_makes_no_job_for_a_row_of_a_shape_already_checked(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = 0
    real = shapes_module.checked_job

    def counted(values):  # type: ignore[no-untyped-def]
        nonlocal made
        made += 1
        return real(values)

    monkeypatch.setattr(shapes_module, "checked_job", counted)
    path = _csv(folder / "m.csv", _clean_rows(400))
    assert summarise_manifest(path).plan.jobs == 400
    assert made == 0
    assert len(load_manifest(path).jobs) == 400
    assert made == 400 - len(SHAPES)  # loading makes each later row's own Job


def test_a_summary_read_twice_for_two_ids_of_one_hash_counts_each_job_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id,prompt,count\n" + "".join(f"id-{i},a cat,2\n" for i in range(50)))
    reads = collide_and_count_readings(monkeypatch, "id-30")
    summary = summarise_manifest(path)
    assert len(reads) == 2
    assert (summary.plan.jobs, summary.plan.requests) == (50, 100)


def test_a_summary_of_an_empty_manifest_is_refused_as_loading_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id,prompt\n,\n")
    with pytest.raises(ManifestError) as loading:
        load_manifest(path)
    with pytest.raises(ManifestError) as summarising:
        summarise_manifest(path)
    assert summarising.value.problems == loading.value.problems
    assert [str(p) for p in summarising.value.problems] == ["the manifest has no jobs"]
