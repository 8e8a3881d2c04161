"""Hostile references (issue 21): only regular files are read, with a bounded read; references resolve inside
the files root; NUL characters, deep nesting and metadata named like a results column are refused with
their line and field."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from imagebatch.manifest import ManifestError, Problem, load_manifest
from imagebatch.manifest.fields import KNOWN_FIELDS, RESULTS_ONLY_COLUMNS
from imagebatch.manifest.files import FileChecker, InputFileError, read_regular
from imagebatch.manifest.read import MAX_DEPTH, TooDeepError, parse_json
from imagebatch.work.store import RESULT_COLUMNS


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """`tmp/m/` (the manifest's folder, with refs/ref.png and refs/mask.png) and `tmp/outside/x.png`."""
    (tmp_path / "m" / "refs").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    Image.new("RGB", (16, 16), (200, 0, 0)).save(tmp_path / "m" / "refs" / "ref.png")
    Image.new("RGBA", (16, 16), (0, 0, 0, 0)).save(tmp_path / "m" / "refs" / "mask.png")
    Image.new("RGB", (16, 16), (0, 0, 200)).save(tmp_path / "outside" / "x.png")
    Image.new("RGBA", (16, 16), (0, 0, 0, 0)).save(tmp_path / "outside" / "mask.png")
    return tmp_path


def problems(path: Path, **kwargs: Any) -> list[Problem]:
    try:
        load_manifest(path, **kwargs)
    except ManifestError as exc:
        return exc.problems
    return []


def jsonl(path: Path, *jobs: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(job) + "\n" for job in jobs))
    return path


def only(found: list[Problem]) -> Problem:
    assert len(found) == 1, [str(p) for p in found]
    return found[0]


# --- only regular files, read with a bound -----------------------------------------------------------------


@pytest.fixture
def fifo(tree: Path) -> Iterator[Path]:
    """A FIFO in the manifest's folder; opened for writing at the end, so a reader stuck on it (the bug)
    is released rather than left hanging."""
    path = tree / "m" / "refs" / "pipe.png"
    os.mkfifo(path)
    yield path
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader: nothing was stuck


def load_in_thread(path: Path, **kwargs: Any) -> list[Problem]:
    """`problems(path)` in a thread, failing (not hanging) if it does not return within a minute."""
    result: list[list[Problem]] = []
    thread = threading.Thread(target=lambda: result.append(problems(path, **kwargs)), daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the check hangs on the file"
    return result[0]


def test_a_fifo_is_refused_without_waiting_for_a_writer(tree: Path, fifo: Path) -> None:
    job = {"id": "a", "prompt": "x", "reference_images": ["refs/pipe.png"]}
    manifest = jsonl(tree / "m" / "m.jsonl", job)
    problem = only(load_in_thread(manifest))
    assert (problem.line, problem.field) == (1, "reference_images")
    assert "FIFO" in problem.message and "not a regular file" in problem.message


def test_a_device_is_refused_without_being_read(tree: Path) -> None:
    # /dev/null stands for /dev/zero: both have a size of 0; /dev/zero would be read without end.
    manifest = jsonl(tree / "m" / "m.jsonl", {"id": "a", "prompt": "x", "reference_images": ["/dev/null"]})
    problem = only(problems(manifest, files_root=["/dev"]))
    assert (problem.line, problem.field) == (1, "reference_images")
    assert "is a device, not a regular file" in problem.message


def test_a_folder_is_refused(tree: Path) -> None:
    manifest = jsonl(tree / "m" / "m.jsonl", {"id": "a", "prompt": "x", "reference_images": ["refs"]})
    assert "is a folder" in only(problems(manifest)).message


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux's /proc")
def test_the_size_is_that_of_the_bytes_read_not_the_one_stat_reports() -> None:
    # A /proc file is a regular file whose stat size is 0, as a file that grows after it was looked at.
    path = Path("/proc/self/status")
    assert path.stat().st_size == 0
    assert b"Name:" in read_regular(path, 1 << 20)
    with pytest.raises(InputFileError) as info:
        read_regular(path, 64)
    assert info.value.size == 64
    assert str(info.value) == "the file is 64 bytes or more; each file must be under 64 bytes"


def test_a_file_over_the_limit_by_its_size_is_not_read(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real(fd, n))
    path = tree / "m" / "refs" / "ref.png"
    assert path.stat().st_size > 10
    with pytest.raises(InputFileError, match="each file must be under 10 bytes"):
        read_regular(path, 10)
    assert reads == []


# --- the files root -------------------------------------------------------------------------------------


def outside_refs(tree: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Four spellings of tmp/outside/x.png from the manifest's folder: a symlink, absolute, `..`, `~`."""
    os.symlink(tree / "outside" / "x.png", tree / "m" / "refs" / "link.png")
    monkeypatch.setenv("HOME", str(tree / "outside"))
    return {
        "symlink": "refs/link.png",
        "absolute": str(tree / "outside" / "x.png"),
        "dotdot": "../outside/x.png",
        "home": "~/x.png",
    }


def test_references_outside_the_manifests_folder_are_refused_with_the_resolved_path(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refs = outside_refs(tree, monkeypatch)
    jobs = [{"id": name, "prompt": "x", "reference_images": [ref]} for name, ref in refs.items()]
    found = problems(jsonl(tree / "m" / "m.jsonl", *jobs))
    target = (tree / "outside" / "x.png").resolve()
    assert [(p.line, p.job_id, p.field) for p in found] == [
        (i + 1, name, "reference_images") for i, name in enumerate(refs)
    ]
    for p in found:
        assert f"resolves to {target}, outside the files root ({(tree / 'm').resolve()})" in p.message
        assert "--files-root" in (p.hint or "")


def test_files_root_allows_a_folder(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refs = outside_refs(tree, monkeypatch)
    jobs = [{"id": n, "prompt": "x", "reference_images": [ref, "refs/ref.png"]} for n, ref in refs.items()]
    manifest = load_manifest(jsonl(tree / "m" / "m.jsonl", *jobs), files_root=[tree / "outside"])
    target = (tree / "outside" / "x.png").resolve()
    assert {job.reference_images[0] for job in manifest.jobs} == {target}
    assert {job.reference_images[1] for job in manifest.jobs} == {(tree / "m" / "refs" / "ref.png").resolve()}


def test_a_mask_and_a_turns_image_are_confined_too(tree: Path) -> None:
    outside = str(tree / "outside" / "mask.png")
    jobs = [
        {"id": "e", "prompt": "x", "route": "images", "reference_images": ["refs/ref.png"], "mask": outside},
        {"id": "t", "prompt": "x", "turns": [{"prompt": "y", "reference_images": ["../outside/x.png"]}]},
    ]
    found = problems(jsonl(tree / "m" / "m.jsonl", *jobs))
    assert [(p.line, p.field) for p in found] == [(1, "mask"), (2, "turns[0].reference_images")]
    assert all("outside the files root" in p.message for p in found)


def test_a_file_outside_the_root_is_not_opened(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: opened.append(str(p)) or real(p, *a, **k))
    checker = FileChecker(tree / "m")
    assert "outside the files root" in (checker.check("../outside/x.png").error or "")
    assert checker.check("../outside/nope.png").error == checker.check("../outside/x.png").error.replace(
        "x.png", "nope.png"
    )  # a missing file and a present one look the same from inside: no probing
    assert opened == [] and checker.reads == 0


def test_a_files_root_that_is_not_a_folder_is_refused(tree: Path) -> None:
    manifest = jsonl(tree / "m" / "m.jsonl", {"id": "a", "prompt": "x"})
    problem = only(problems(manifest, files_root=[tree / "nope"]))
    assert problem.line is None and "is not a folder" in problem.message and "nope" in problem.message


def json_manifest(tree: Path, files_root: Any, *refs: str) -> Path:
    path = tree / "m" / "m.json"
    jobs = [{"id": f"j{i}", "prompt": "x", "reference_images": [ref]} for i, ref in enumerate(refs)]
    path.write_text(json.dumps({"defaults": {"files_root": files_root}, "jobs": jobs}))
    return path


def test_a_manifests_files_root_narrows_the_root(tree: Path) -> None:
    (tree / "m" / "other").mkdir()
    Image.new("RGB", (8, 8)).save(tree / "m" / "other" / "o.png")
    path = json_manifest(tree, "refs", "refs/ref.png", "other/o.png")
    problem = only(problems(path))
    assert (problem.line, problem.unit, problem.field) == (1, "job", "reference_images")
    assert f"outside the files root ({(tree / 'm' / 'refs').resolve()})" in problem.message
    assert "defaults.files_root" in (problem.hint or "")


@pytest.mark.parametrize("declared", ["..", "../outside", "/", "~"])
def test_a_manifest_cannot_widen_its_files_root(tree: Path, declared: str) -> None:
    path = json_manifest(tree, [declared], "../outside/x.png")
    found = problems(path)
    assert [(p.line, p.field) for p in found] == [(None, "defaults.files_root"), (0, "reference_images")]
    assert "a manifest can narrow its files root, never widen it" in found[0].message
    assert "--files-root" in (found[0].hint or "")


def test_a_manifests_files_root_may_name_a_folder_the_operator_allowed(tree: Path) -> None:
    path = json_manifest(tree, [str(tree / "outside")], "../outside/x.png")
    assert [p.field for p in problems(path)] == ["defaults.files_root", "reference_images"]
    manifest = load_manifest(path, files_root=[tree / "outside"])
    assert manifest.jobs[0].reference_images == [(tree / "outside" / "x.png").resolve()]
    assert manifest.metadata_columns == []  # a setting, not metadata


@pytest.mark.parametrize("declared", [3, [], ["refs", 3], {"a": "refs"}, [""], "refs/ref.png"])
def test_a_malformed_files_root_is_refused(tree: Path, declared: Any) -> None:
    found = problems(json_manifest(tree, declared, "refs/ref.png"))
    assert [p.field for p in found] == ["defaults.files_root"]


def test_files_root_is_no_column_nor_job_key(tree: Path) -> None:
    (tree / "m" / "m.csv").write_text("id,prompt,files_root\na,x,/\n")
    problem = only(problems(tree / "m" / "m.csv"))
    assert (problem.line, problem.field) == (1, "files_root") and "whole manifest" in problem.message
    job = {"id": "b", "prompt": "x", "files_root": "/"}
    path = jsonl(tree / "m" / "m.jsonl", {"id": "a", "prompt": "x"}, job)
    problem = only(problems(path))
    assert (problem.line, problem.field) == (2, "files_root")


# --- NUL characters ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "field"),
    [
        ({"prompt": "a cat\x00"}, "prompt"),
        ({"reference_images": ["refs/ref.png\x00"]}, "reference_images"),
        ({"reference_images": ["refs/ref.png\x00.jpg"], "route": "images"}, "reference_images"),
        ({"turns": [{"prompt": "y\x00"}]}, "turns"),
        ({"colour": "red\x00"}, "colour"),
        ({"model": "native-image-2\x00"}, "model"),
    ],
)
def test_a_nul_character_in_any_field_is_refused(tree: Path, job: dict[str, Any], field: str) -> None:
    path = jsonl(tree / "m" / "m.jsonl", {"id": "ok", "prompt": "x"}, {"id": "a", "prompt": "x", **job})
    problem = only(problems(path))
    assert (problem.line, problem.job_id, problem.field) == (2, "a", field)
    assert "NUL character" in problem.message


def test_a_nul_character_in_a_csv_cell_an_id_or_a_name_is_refused(tree: Path) -> None:
    path = tree / "m" / "m.csv"
    path.write_bytes(b"id,prompt,reference_images,n\x00te\na,x,refs/ref.png\x00,1\nb\x00,y,,2\n")
    found = problems(path)
    assert [(p.line, p.field) for p in found] == [(1, "n\\0te"), (2, "reference_images"), (3, "id")]
    assert all("NUL character" in p.message for p in found)
    assert all("\x00" not in str(p) for p in found)  # shown as \0, never written to a terminal as is


def test_a_nul_character_in_defaults_is_refused(tree: Path) -> None:
    path = tree / "m" / "m.json"
    path.write_text(json.dumps({"defaults": {"prompt": "\x00", "tag": "a\x00"}, "jobs": [{"id": "a"}]}))
    found = problems(path)
    assert {(p.line, p.field) for p in found} >= {(None, "defaults.prompt"), (None, "defaults.tag")}


def test_a_nul_character_in_a_path_never_reaches_the_file_system(tree: Path) -> None:
    facts = FileChecker(tree / "m").check("refs/ref.png\x00")
    assert facts.error == "the path holds a NUL character"


# --- nesting --------------------------------------------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_parse_json_refuses_nesting_past_the_limit_with_its_place() -> None:
    assert parse_json(nested(MAX_DEPTH)) is not None
    with pytest.raises(TooDeepError) as info:
        parse_json('{"a": "[[[[",\n "b": ' + nested(MAX_DEPTH) + "}")
    assert (info.value.line, info.value.column) == (2, 6 + MAX_DEPTH)  # brackets in strings do not count
    for depth in (10_000, 200_000):  # past Python's recursion limit
        with pytest.raises(TooDeepError):
            parse_json(nested(depth))


def test_a_json_manifest_nested_10000_deep_is_refused(tree: Path) -> None:
    path = tree / "m" / "m.json"
    path.write_text("[\n" + nested(10_000) + "\n]")
    problem = only(problems(path))
    assert problem.line == 2 and f"nested more than {MAX_DEPTH} deep" in problem.message


def test_a_field_nested_10000_deep_is_refused(tree: Path) -> None:
    path = tree / "m" / "m.json"
    path.write_text('[{"id": "a", "prompt": "x", "tag": ' + nested(10_000) + "}]")
    assert f"nested more than {MAX_DEPTH} deep" in only(problems(path)).message


def test_a_json_lines_line_nested_10000_deep_is_refused_and_the_others_checked(tree: Path) -> None:
    path = tree / "m" / "m.jsonl"
    path.write_text(
        '{"id": "a", "prompt": "x"}\n'
        '{"id": "b", "prompt": "x", "turns": ' + nested(10_000) + "}\n"
        '{"id": "c", "prompt": "x", "image_size": "1k"}\n'
    )
    found = problems(path)
    assert [(p.line, p.field) for p in found] == [(2, None), (3, "image_size")]
    assert f"nested more than {MAX_DEPTH} deep" in found[0].message


# --- metadata named like a results column ---------------------------------------------------------------


def test_the_refused_names_are_the_results_columns_that_are_not_fields() -> None:
    assert set(RESULTS_ONLY_COLUMNS) == set(RESULT_COLUMNS) - set(KNOWN_FIELDS)


@pytest.mark.parametrize("name", ["status", "paths", "error", "attempts", "idempotency_key"])
def test_metadata_named_like_a_results_column_is_refused(tree: Path, name: str) -> None:
    (tree / "m" / "m.csv").write_text(f"id,prompt,{name}\na,x,v\n")
    problem = only(problems(tree / "m" / "m.csv"))
    assert (problem.line, problem.field) == (1, name)
    assert "results.csv" in problem.message and f"'source_{name}'" in (problem.hint or "")
    path = jsonl(tree / "m" / "m.jsonl", {"id": "a", "prompt": "x"}, {"id": "b", "prompt": "x", name: "v"})
    assert (only(problems(path)).line, only(problems(path)).field) == (2, name)
    path = tree / "m" / "m.json"
    path.write_text(json.dumps({"defaults": {name: "v"}, "jobs": [{"id": "a", "prompt": "x"}]}))
    assert only(problems(path)).field == f"defaults.{name}"


def test_other_metadata_is_kept(tree: Path) -> None:
    (tree / "m" / "m.csv").write_text("id,prompt,Status,source_status\na,x,v,w\n")
    manifest = load_manifest(tree / "m" / "m.csv")
    assert manifest.jobs[0].metadata == {"Status": "v", "source_status": "w"}
