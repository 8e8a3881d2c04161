"""Manifest formats: CSV, JSON and JSON Lines read into the same jobs; unreadable files give clear errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from imagebatch.gateway.constants import DEFAULT_MAX_TOKENS
from imagebatch.manifest import Manifest, ManifestError, Problem, load_manifest
from imagebatch.manifest.plan import plan_job


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8", newline="")
    else:
        path.write_bytes(text)
    return path


def problems_of(path: Path, **kwargs: object) -> list[Problem]:
    with pytest.raises(ManifestError) as info:
        load_manifest(path, **kwargs)  # type: ignore[arg-type]
    return info.value.problems


def only_problem(path: Path) -> Problem:
    problems = problems_of(path)
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


# --- CSV --------------------------------------------------------------------------------------------


def test_csv_reads_fields_metadata_and_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path / "m.csv",
        "id,prompt,aspect_ratio,image_size,count,sku,colour\n"
        "a,Photo of a mug,16:9,2K,3,SKU-1,blue\n"
        "b,Photo of a bowl,,,,SKU-2,\n",
    )
    manifest = load_manifest(path)
    assert isinstance(manifest, Manifest)
    assert manifest.format == "csv"
    assert manifest.path == path
    assert manifest.metadata_columns == ["sku", "colour"]
    a, b = manifest.jobs
    assert (a.id, a.line, a.location, a.route, a.model) == ("a", 2, "line 2", "native", "native-image-2.1")
    assert (a.aspect_ratio, a.image_size, a.count, a.max_images) == ("16:9", "2K", 3, 1)
    assert a.metadata == {"sku": "SKU-1", "colour": "blue"}
    # Empty cells are absent: the defaults of the route are filled in.
    assert (b.aspect_ratio, b.image_size, b.count, b.max_images) == ("1:1", "1K", 1, 1)
    assert b.metadata == {"sku": "SKU-2", "colour": ""}
    assert (b.size, b.max_tokens, b.mask, b.reference_images, b.turns) == (None, None, None, [], [])


def test_csv_sha256_is_of_the_bytes(tmp_path: Path) -> None:
    import hashlib

    data = b"id,prompt\na,x\n"
    path = write(tmp_path / "m.csv", data)
    assert load_manifest(path).sha256 == hashlib.sha256(data).hexdigest()


def test_csv_byte_order_mark_is_tolerated(tmp_path: Path) -> None:
    path = write(tmp_path / "m.csv", b"\xef\xbb\xbfid,prompt\na,x\n")
    assert [job.id for job in load_manifest(path).jobs] == ["a"]


def test_csv_wrong_encoding_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "m.csv", "id,prompt\na,x\nb,caf\u00e9\n".encode("latin-1"))
    problem = only_problem(path)
    assert problem.line == 3
    assert "not UTF-8" in problem.message
    assert "UTF-8" in (problem.hint or "")


@pytest.mark.parametrize("text", ["", "\n\n", "   \n"])
def test_empty_file_is_a_clear_error(tmp_path: Path, text: str) -> None:
    assert "empty" in only_problem(write(tmp_path / "m.csv", text)).message


def test_header_only_has_no_jobs(tmp_path: Path) -> None:
    assert only_problem(write(tmp_path / "m.csv", "id,prompt\n")).message == "the manifest has no jobs"


def test_ragged_rows_are_all_reported_with_their_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "m.csv", "id,prompt,sku\na,x,1\nb,y\nc,z,3\nd,w,4,extra\n")
    problems = problems_of(path)
    assert [(p.line, p.message) for p in problems] == [
        (3, "the row has 2 cells but the header has 3 columns"),
        (5, "the row has 4 cells but the header has 3 columns"),
    ]


def test_physical_lines_survive_multiline_cells_and_blank_rows(tmp_path: Path) -> None:
    path = write(
        tmp_path / "m.csv",
        'id,prompt,image_size\na,"two\nline prompt",1K\n\n,,\nb,x,1k\n',
    )
    problem = only_problem(path)
    # Header line 1; row a spans lines 2-3; line 4 blank; line 5 empty cells (skipped); b is line 6.
    assert (problem.line, problem.job_id, problem.field) == (6, "b", "image_size")


def test_multiline_prompt_line_endings_are_normalised(tmp_path: Path) -> None:
    crlf = write(tmp_path / "crlf.csv", 'id,prompt\r\na,"one\r\ntwo "\r\n')
    assert load_manifest(crlf).jobs[0].prompt == "one\ntwo"


def test_unclosed_quote_gets_a_hint(tmp_path: Path) -> None:
    path = write(tmp_path / "m.csv", 'id,prompt,sku\na,"unclosed,1\nb,y,2\n')
    problem = only_problem(path)
    assert problem.line == 2
    assert problem.hint == "is a quote left open?"


def test_duplicate_column_is_an_error(tmp_path: Path) -> None:
    problem = only_problem(write(tmp_path / "m.csv", "id,prompt,prompt\na,x,y\n"))
    assert (problem.line, problem.field) == (1, "prompt")
    assert "appears twice" in problem.message


def test_semicolon_separated_file_gets_a_hint(tmp_path: Path) -> None:
    problem = problems_of(write(tmp_path / "m.csv", "id;prompt\na;x\n"))[0]
    assert "separated by ';'" in (problem.hint or "")


def test_missing_id_and_prompt_columns_reported_once(tmp_path: Path) -> None:
    path = write(tmp_path / "m.csv", "name,colour\nmug,blue\nbowl,red\n")
    problems = problems_of(path)
    assert [(p.line, p.field) for p in problems] == [(1, "id"), (1, "prompt")]


def test_unnamed_columns(tmp_path: Path) -> None:
    # A trailing empty column (spreadsheet export) is ignored; a nameless column with data is not.
    ok = write(tmp_path / "ok.csv", "id,prompt,\na,x,\n")
    assert load_manifest(ok).jobs[0].metadata == {}
    bad = write(tmp_path / "bad.csv", "id,prompt,\na,x,\nb,y,value\n")
    problem = only_problem(bad)
    assert (problem.line, problem.message) == (3, "column 3 has no name in the header but holds values")


def test_header_names_are_stripped(tmp_path: Path) -> None:
    path = write(tmp_path / "m.csv", " id , prompt ,image_size\na,x,2K\n")
    assert load_manifest(path).jobs[0].image_size == "2K"


def test_turns_column_in_csv_is_refused(tmp_path: Path) -> None:
    problem = only_problem(write(tmp_path / "m.csv", "id,prompt,turns\na,x,more\n"))
    assert (problem.line, problem.field) == (1, "turns")


def test_reference_images_separated_by_semicolons(tmp_path: Path, images: dict[str, Path]) -> None:
    path = write(tmp_path / "m.csv", "id,prompt,reference_images\na,x, images/ref.png ; images/photo.jpg ;\n")
    job = load_manifest(path).jobs[0]
    assert job.reference_images == [images["ref.png"], images["photo.jpg"]]
    assert all(p.is_absolute() for p in job.reference_images)
    assert len(job.reference_sha256) == 2


# --- JSON -------------------------------------------------------------------------------------------


def test_json_list_and_object_give_the_same_jobs(tmp_path: Path) -> None:
    jobs = [{"id": "a", "prompt": "x", "aspect_ratio": "3:2"}, {"id": "b", "prompt": "y", "count": 2}]
    as_list = load_manifest(write(tmp_path / "l.json", json.dumps(jobs)))
    as_object = load_manifest(write(tmp_path / "o.json", json.dumps({"jobs": jobs})))
    as_csv = load_manifest(write(tmp_path / "c.csv", "id,prompt,aspect_ratio,count\na,x,3:2,\nb,y,,2\n"))

    def fields(m: Manifest) -> list[tuple[object, ...]]:
        return [(j.id, j.prompt, j.aspect_ratio, j.count, j.route, j.model) for j in m.jobs]

    assert fields(as_list) == fields(as_object) == fields(as_csv)
    assert [j.location for j in as_list.jobs] == ["job #0", "job #1"]


def test_json_defaults_apply_only_where_they_belong(tmp_path: Path) -> None:
    doc = {
        "defaults": {"image_size": "2K", "size": "1536x1024", "max_tokens": 99, "count": 2, "campaign": "c1"},
        "jobs": [
            {"id": "n", "prompt": "x"},
            {"id": "i", "prompt": "x", "route": "images"},
            {"id": "m", "prompt": "x", "route": "messages", "model": "claude-compat-small"},
            {"id": "own", "prompt": "x", "image_size": "4K", "count": 1, "campaign": "c2"},
        ],
    }
    n, i, m, own = load_manifest(write(tmp_path / "m.json", json.dumps(doc))).jobs
    assert (n.image_size, n.size, n.max_tokens, n.count) == ("2K", None, None, 2)
    assert (i.image_size, i.size, i.model, i.count) == (None, "1536x1024", "compat-image-2", 2)
    assert (m.max_tokens, m.image_size, m.size) == (99, None, None)
    assert (own.image_size, own.count, own.metadata) == ("4K", 1, {"campaign": "c2"})
    assert n.metadata == {"campaign": "c1"}


def test_json_default_model_reaches_only_routes_that_serve_it(tmp_path: Path) -> None:
    doc = {
        "defaults": {"model": "native-image-pro"},
        "jobs": [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "x", "route": "images"}],
    }
    a, b = load_manifest(write(tmp_path / "m.json", json.dumps(doc))).jobs
    assert (a.model, b.model) == ("native-image-pro", "compat-image-2")


def test_json_problem_from_defaults_says_so(tmp_path: Path) -> None:
    doc = {"defaults": {"route": "chat", "model": "compat-image-2"}, "jobs": [{"id": "a", "prompt": "x"}]}
    problem = only_problem(write(tmp_path / "m.json", json.dumps(doc)))
    assert (problem.line, problem.unit, problem.field) == (0, "job", "model")
    assert problem.message.endswith("(value from defaults)")
    assert str(problem).startswith("job #0 (id=a), field model: ")


def test_json_numbers_and_booleans(tmp_path: Path) -> None:
    doc = [{"id": 17, "prompt": "x", "count": "2", "weight": 1.5, "new": True, "note": None}]
    job = load_manifest(write(tmp_path / "m.json", json.dumps(doc))).jobs[0]
    assert (job.id, job.count) == ("17", 2)
    assert job.metadata == {"weight": "1.5", "new": "true", "note": ""}


def test_json_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    problem = only_problem(write(tmp_path / "m.json", '[\n  {"id": "a",\n   "prompt" "x"}\n]'))
    assert problem.line == 3
    assert problem.message.startswith("not valid JSON: Expecting ':' delimiter (line 3, column")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"job": []}, "a JSON manifest is a list of jobs"),
        ({"jobs": [], "extra": 1}, "a JSON manifest is a list of jobs"),
        ({"jobs": {}}, "'jobs' must be a list of objects"),
        ({"jobs": [], "defaults": []}, "'defaults' must be an object"),
        ("just a string", "'jobs' must be a list of objects"),
        ([], "the manifest has no jobs"),
    ],
)
def test_json_bad_structure(tmp_path: Path, doc: object, expected: str) -> None:
    assert only_problem(write(tmp_path / "m.json", json.dumps(doc))).message.startswith(expected)


def test_json_job_that_is_not_an_object(tmp_path: Path) -> None:
    problems = problems_of(write(tmp_path / "m.json", json.dumps([{"id": "a", "prompt": "x"}, "b", 3])))
    assert [str(p) for p in problems] == [
        "job #1: a job must be an object",
        "job #2: a job must be an object",
    ]


def test_json_defaults_problems(tmp_path: Path) -> None:
    doc = {"defaults": {"id": "x", "image_size": "3K", "tags": [1]}, "jobs": [{"id": "a", "prompt": "x"}]}
    problems = problems_of(write(tmp_path / "m.json", json.dumps(doc)))
    assert {p.field for p in problems} == {"defaults.id", "defaults.image_size", "defaults.tags"}
    assert all(p.line is None for p in problems)


def test_json_nested_metadata_is_refused(tmp_path: Path) -> None:
    problem = only_problem(
        write(tmp_path / "m.json", json.dumps([{"id": "a", "prompt": "x", "tags": ["t"]}]))
    )
    assert problem.field == "tags"


def test_json_turns(tmp_path: Path, images: dict[str, Path]) -> None:
    doc = [
        {
            "id": "chain",
            "prompt": "Put it on a desk",
            "reference_images": ["images/ref.png"],
            "turns": ["Warmer light", {"prompt": "Add the badge", "reference_images": ["images/photo.jpg"]}],
        }
    ]
    job = load_manifest(write(tmp_path / "m.json", json.dumps(doc))).jobs[0]
    assert [t.prompt for t in job.turns] == ["Warmer light", "Add the badge"]
    assert job.turns[0].reference_images == []
    assert job.turns[1].reference_images == [images["photo.jpg"]]
    assert len(job.turns[1].reference_sha256) == 1
    assert [(r.request_index, r.turn_index) for r in plan_job(job)] == [
        (0, 0),
        (0, 1),
        (0, 2),
    ]  # prompt, 2 turns


# --- JSON Lines -------------------------------------------------------------------------------------


def test_jsonl_lines_and_bad_lines(tmp_path: Path) -> None:
    text = '{"id": "a", "prompt": "x"}\n\n{"id": "b", "prompt": "y", "image_size": "1k"}\n{broken\n[1]\n'
    problems = problems_of(write(tmp_path / "m.jsonl", text))
    assert [(p.line, p.field) for p in problems] == [(3, "image_size"), (4, None), (5, None)]
    assert problems[1].message.startswith("not valid JSON")
    assert problems[2].message == "each line must be a JSON object (one job)"


def test_jsonl_reads_like_json(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", '{"id": "a", "prompt": "x", "route": "messages", "model": "t"}\r\n')
    job = load_manifest(path).jobs[0]
    assert (job.id, job.line, job.route, job.max_tokens) == ("a", 1, "messages", DEFAULT_MAX_TOKENS)


def test_jsonl_keeps_unicode_line_separators_inside_strings(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", '{"id": "a", "prompt": "one\u2028two"}\n')
    assert load_manifest(path).jobs[0].prompt == "one\u2028two"


# --- the file itself --------------------------------------------------------------------------------


def test_unknown_extension_and_override(tmp_path: Path) -> None:
    path = write(tmp_path / "m.txt", "id,prompt\na,x\n")
    assert "cannot tell the manifest format" in only_problem(path).message
    assert load_manifest(path, format="csv").format == "csv"


def test_missing_manifest_and_folder(tmp_path: Path) -> None:
    assert only_problem(tmp_path / "nope.csv").message.startswith("manifest not found")
    (tmp_path / "dir.csv").mkdir()
    assert "is a folder" in only_problem(tmp_path / "dir.csv").message


def test_manifest_error_message_lists_every_problem(tmp_path: Path) -> None:
    path = write(tmp_path / "m.csv", "id,prompt,image_size\na,x,1k\nb,,2K\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    text = str(info.value)
    assert text.splitlines()[0] == f"{path}: 2 problems in the manifest"
    assert "line 2 (id=a), field image_size:" in text
    assert "line 3 (id=b), field prompt: prompt is required" in text


@pytest.fixture
def images(tmp_path: Path) -> dict[str, Path]:
    from PIL import Image

    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(folder / "ref.png")
    Image.new("RGB", (32, 32), (10, 200, 10)).save(folder / "photo.jpg")
    return {p.name: p for p in folder.iterdir()}


def test_leading_and_whitespace_only_lines_are_skipped(tmp_path: Path) -> None:
    path = write(tmp_path / "m.csv", "\n\nid,prompt,image_size\na,x,1K\n   \nb,y,1k\n")
    problem = only_problem(path)
    assert (problem.line, problem.job_id) == (6, "b")


def test_ragged_rows_hide_the_rows_problems_and_stop_the_load(tmp_path: Path) -> None:
    # A CSV's rows are checked as they are read; a row of the wrong length found after rows with problems
    # of their own still makes the file's only problems the wrong lengths, as a file that cannot be read
    # as a table.
    path = write(tmp_path / "m.csv", "id,prompt,model,\na,x,nope,\nb,y,,v\nc,z\nd,w,,,9\n")
    assert [(p.line, p.message) for p in problems_of(path)] == [
        (4, "the row has 2 cells but the header has 4 columns"),
        (5, "the row has 5 cells but the header has 4 columns"),
    ]


def test_a_nameless_column_found_after_a_rows_problem(tmp_path: Path) -> None:
    # The nameless column's values are found only as the rows are read: reported all the same.
    path = write(tmp_path / "m.csv", "id,prompt,\na,x,\nb,{nope},\nc,y,value\n")
    assert [(p.line, p.field) for p in problems_of(path)] == [(3, "prompt"), (4, None)]


def test_duplicate_column_and_ragged_rows_reported_together(tmp_path: Path) -> None:
    path = write(tmp_path / "m.csv", "id;x,prompt,prompt\na,x,y\nb\n")
    problems = problems_of(path)
    assert [(p.line, p.field) for p in problems] == [(1, "prompt"), (3, None)]


@pytest.mark.parametrize(
    "text",
    [
        "id,prompt\r\na,x\r\n",
        "id,prompt\ra,x\rb,y",
        'id,prompt\na,"two\r\nlines"\n\nb,y',
        "id\n",
        "id,prompt\na,x\nb,y",
        'id,prompt\r\na,x\rb,"y\r\nz\rw"\n\r\nc,w\r',
        'id,prompt\na,"two\nlines"\n\n\nb,y\n',
        # What str.splitlines would end a line at, in a cell and quoted: not line ends for the csv module.
        "id,prompt\na,x\x0by\x0cz\nb,p\x1cq\x1dr\x1es\n",
        'id,prompt\na,"x\x85y\u2028z"\nb,p\u2029q\n',
        "id,prompt\na,x\x85\nb,y\u2028\n\u2029\n",
    ],
)
@pytest.mark.parametrize("block", [3, 1 << 20])
def test_csv_lines_split_as_the_csv_module_reads_a_file(
    text: str, block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read in blocks of `block` bytes (a line longer than a block is read whole)."""
    import io

    from imagebatch.manifest import textfile
    from imagebatch.manifest.read import _lines

    monkeypatch.setattr(textfile, "BLOCK", block)
    path = tmp_path / "m.csv"
    path.write_bytes(text.encode())
    blocks = textfile.TextBlocks(path, escapes=False)
    assert list(_lines(blocks)) == list(io.StringIO(text, newline=""))
    assert blocks.sha256 == hashlib.sha256(text.encode()).hexdigest()
