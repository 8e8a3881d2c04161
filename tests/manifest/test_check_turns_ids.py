"""Preflight of the turns and the ids: each turn is checked on its own (one malformed turn does not hide the
others' problems); an id is used once, and never as a name Windows cannot give a file or folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.manifests import assert_fields, assert_one, csv_problems, json_problems

from imagebatch.manifest import ManifestError, id_fault, is_safe_id, load_manifest

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


# --- ids: each once, never a name Windows cannot use ----------------------------------------------


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
