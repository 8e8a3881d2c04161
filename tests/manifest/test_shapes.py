"""A table's rows checked by their shape (`manifest.shapes`) give exactly what a full check of every row
gives: the same Jobs, the same problems in the same order, with a full check only for each shape's first
clean row and for rows with something wrong."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest

from imagebatch.manifest.check import JobChecker
from imagebatch.manifest.load import read_raw
from imagebatch.manifest.models import ID_PATTERN, SAFE_ID, id_fault, is_safe_id
from imagebatch.manifest.shapes import ShapeChecker

HEADER = ["id", "route", "model", "aspect_ratio", "size", "reference_images", "mask", "count", "max_tokens"]
HEADER += ["colour", "meta.size", "prompt"]

SHAPES = [  # route, model, aspect_ratio, size, reference_images, mask, count, max_tokens
    ["", "", "4:5", "", "images/ref.png", "", "", ""],
    ["images", "", "", "1024x1024", "images/ref-rgba.png", "images/mask.png", "", ""],
    ["messages", "claude-compat-small", "", "", "", "", "", "300"],
    ["", "", "16:9", "", "", "", "2", ""],
    ["", "", "", "", "", "", "", ""],
]
BAD_SHAPES = [
    ["", "native-image-3", "", "", "", "", "", ""],  # unknown model
    ["", "", "", "", "images/nope.png", "", "", ""],  # no such file
    ["images", "", "", "", "", "images/mask.png", "", ""],  # a mask with no reference image
    ["", "", "", "", "", "", "0", ""],  # count out of range
]


def _rows(n: int) -> list[list[str]]:
    """`n` rows cycling the good shapes, with every kind of fault of a row's own sprinkled in."""
    rows = []
    for i in range(n):
        shape = SHAPES[i % len(SHAPES)] if i % 17 else BAD_SHAPES[(i // 17) % len(BAD_SHAPES)]
        job_id, prompt, colour = f"job-{i}", "A {colour} mug, studio light", ["red", "blue", ""][i % 3]
        match i % 23:
            case 3:
                job_id = f"job-{i - 1}"  # a duplicate
            case 5:
                job_id = f"JOB-{i - 2}"  # differs only by case
            case 7:
                job_id = ["CON", "nul.txt", "abc.", "has space", "", " ", f" job-{i} ", f"job-{i}\r"][i % 8]
            case 9:
                prompt = ["{colur} mug", "{colour}", "", " {{literal}} ", "a\r\nb", "x {", "{prompt}"][i % 7]
            case 11:
                colour = "navy\r\nblue"
        rows.append([job_id, *shape, colour, f"m{i % 4}", prompt])
    return rows


def _write(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.mark.parametrize("extra", [[], ["turns"], ["modle"]], ids=["plain", "turns-column", "lookalike"])
def test_shapes_check_as_a_full_check_does(folder: Path, extra: list[str]) -> None:
    header = HEADER + extra
    rows = [row + ["x"] * len(extra) for row in _rows(600)]
    path = _write(folder / "m.csv", header, rows)
    raw = read_raw(path)  # a CSV's rows are read once, as they are checked
    full = JobChecker(raw, folder)
    full_jobs = [job for row in raw.rows if (job := full.check(row)) is not None]

    raw = read_raw(path)

    checker = JobChecker(raw, folder)
    calls = 0
    check_in_full = checker.check

    def counted(row):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return check_in_full(row)

    checker.check = counted  # type: ignore[method-assign]
    shapes = ShapeChecker(checker, raw)
    jobs = [job for row in raw.rows if (job := shapes.check(row)) is not None]

    assert [job.model_dump() for job in jobs] == [job.model_dump() for job in full_jobs]
    assert [repr(job) for job in jobs] == [repr(job) for job in full_jobs]
    assert checker.problems == full.problems
    assert checker.metadata_columns == full.metadata_columns
    assert len(full.problems) > 50 and 300 < len(jobs) < 600
    faulty_rows = len({(p.line, p.job_id) for p in full.problems if p.line != 1})
    with_cr = sum(any("\r" in cell for cell in row) for row in rows)
    # Only each shape's first clean row, the faulty rows and those with a carriage return (which a full
    # check normalises) are checked in full.
    assert calls <= len(SHAPES) + faulty_rows + with_cr


def test_the_safe_id_pattern_is_the_id_rules() -> None:
    """`SAFE_ID` (the shape path's one match) says what `is_safe_id` (`ID_PATTERN` and `id_fault`) says."""
    edges = ["a", "A.", "con", "CON", "con.txt", "Con.tar.gz", "nul.", "com1", "COM10", "com0", "lpt9.x"]
    edges += [
        "lpt1x",
        "xcon",
        "a" * 128,
        "a" * 129,
        ".a",
        "-a",
        "a-",
        "a.b.",
        "a\n",
        "a\r",
        "CON\n",
        "AUX.txt.",
    ]
    edges += ["\u212a", "\u017f", "x\u212a", "conx.txt", "COM\u00b9", "", " a", "a b"]
    pieces = ["con", "CoN", "nul", "Aux", "prn", "com1", "LPT9", "com0", "lpt", "co", "n", ".", "txt", "-"]
    pieces += ["_", "x", "7", "\r", "\n", "\u212a", " ", "a" * 60]
    generator = random.Random(7)
    drawn = ["".join(generator.choices(pieces, k=generator.randint(1, 4))) for _ in range(50_000)]
    for job_id in edges + drawn:
        assert (SAFE_ID.fullmatch(job_id) is not None) == is_safe_id(job_id), repr(job_id)
    devices = [j for j in drawn if ID_PATTERN.fullmatch(j) and id_fault(j) and not j.endswith(".")]
    assert len(devices) > 1000 and sum(is_safe_id(job_id) for job_id in drawn) > 10_000
