"""A misspelt field name (`aspect_ration`, `image_sise`) is refused, in every format, by validate and run
alike, before anything is sent; a name declared as metadata (`meta.` prefix) and common metadata names
pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openpyxl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.runs import cli

from imagebatch.manifest import ManifestError, load_manifest, plan
from imagebatch.manifest.fields import edit_distance, looks_like_field
from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE

MISSPELT = "id,prompt,aspect_ration,image_sise\na,a mug,4:5,2K\nb,a cup,4:5,2K\n"
EXPECTED = [
    "line 1, field aspect_ration: column 'aspect_ration' is not a field; did you mean 'aspect_ratio'? "
    "(if it is metadata, declare it so: name it 'meta.aspect_ration')",
    "line 1, field image_sise: column 'image_sise' is not a field; did you mean 'image_size'? "
    "(if it is metadata, declare it so: name it 'meta.image_sise')",
]


def test_validate_refuses_misspelt_columns_naming_each(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "m.csv"
    path.write_text(MISSPELT)
    code, out, _ = cli(capsys, "validate", str(path))
    assert code == EXIT_USAGE
    assert out.splitlines() == [*EXPECTED, f"{path}: 2 problems; nothing was sent"]


def test_misspelt_columns_are_reported_with_every_other_problem(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id,prompt,Aspect-Ratio,image_size\na,a mug,4:5,3K\n")
    code, out, _ = cli(capsys, "validate", str(path))
    assert code == EXIT_USAGE
    lines = out.splitlines()
    assert lines[0].startswith("line 1, field Aspect-Ratio: column 'Aspect-Ratio' is not a field; did you")
    assert lines[1].startswith("line 2 (id=a), field image_size: image size must be one of")
    assert lines[2] == f"{path}: 2 problems; nothing was sent"


def test_run_refuses_misspelt_columns_and_sends_nothing(
    emulator: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("IMAGEBATCH_BASE_URL", emulator.url)
    monkeypatch.setenv("IMAGEBATCH_API_KEY", emulator.api_key)
    path = tmp_path / "m.csv"
    path.write_text(MISSPELT)
    out_dir = tmp_path / "out"
    code, out, err = cli(capsys, "run", str(path), "--out", str(out_dir))
    assert (code, out) == (EXIT_USAGE, "")
    for line in EXPECTED:
        assert line in err
    assert "2 problems; nothing was sent" in err
    assert emulator.requests() == []
    assert not out_dir.exists()


COMMON_METADATA = (
    "sku", "colour", "color", "category", "title", "name", "notes", "note", "brand", "description",
    "country", "amount", "mode", "site", "task", "tags", "channel", "product_name", "model_name", "size_note",
)  # fmt: skip


def test_common_metadata_names_pass_and_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text(",".join(("id", "prompt", *COMMON_METADATA)) + "\na,a mug," + ",".join("v" * 20) + "\n")
    manifest = load_manifest(path)
    assert manifest.metadata_columns == list(COMMON_METADATA)
    assert manifest.jobs[0].metadata == dict.fromkeys(COMMON_METADATA, "v")


def test_a_meta_prefix_declares_a_near_miss_as_metadata(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id,prompt,meta.image_sise,Meta.Size\na,a mug {meta.image_sise},2K,big\n")
    manifest = load_manifest(path)
    [job] = manifest.jobs
    assert manifest.metadata_columns == ["meta.image_sise", "Meta.Size"]
    assert job.metadata == {"meta.image_sise": "2K", "Meta.Size": "big"}
    assert (job.prompt, job.image_size) == ("a mug 2K", "1K")  # metadata: not the field


def test_json_keys_job_defaults_and_turns(tmp_path: Path, capsys: Any) -> None:
    """A job key is named once, at the first job holding it; a turn's misspelt key gets the nearest."""
    path = tmp_path / "m.json"
    doc = {
        "defaults": {"imge_size": "2K", "meta.aspect_ration": "x"},
        "jobs": [
            {"id": "a", "prompt": "a mug", "aspect_ration": "4:5", "sku": "1"},
            {"id": "b", "prompt": "a cup", "aspect_ration": "4:5", "turns": [{"promt": "bluer"}]},
        ],
    }
    path.write_text(json.dumps(doc))
    code, out, _ = cli(capsys, "validate", str(path))
    assert code == EXIT_USAGE
    assert out.splitlines() == [
        "field defaults.imge_size: key 'imge_size' is not a field; did you mean 'image_size'? (if it is "
        "metadata, declare it so: name it 'meta.imge_size')",
        "job #0 (id=a), field aspect_ration: key 'aspect_ration' is not a field; did you mean "
        "'aspect_ratio'? (if it is metadata, declare it so: name it 'meta.aspect_ration')",
        "job #1 (id=b), field turns[0].promt: a turn has only prompt and reference_images (did you mean "
        "'prompt'?)",
        "job #1 (id=b), field turns[0].prompt: each turn needs a prompt",
        f"{path}: 4 problems; nothing was sent",
    ]


def test_jsonl_with_declared_metadata_is_valid(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"id": "a", "prompt": "a mug", "meta.aspect_ration": "4:5", "title": "Mug"}\n')
    code, out, _ = cli(capsys, "validate", str(path))
    assert code == EXIT_OK, out
    [request] = plan(load_manifest(path))
    assert request.aspect_ratio == "1:1"


def _workbook(path: Path, rows: list[list[str]]) -> Path:
    book = openpyxl.Workbook()
    for row in rows:
        book.active.append(row)
    book.save(path)
    return path


@pytest.mark.parametrize("suffix", ["xlsx", "parquet"])
def test_spreadsheets_and_parquet_refuse_a_misspelt_column(tmp_path: Path, suffix: str) -> None:
    rows = [["id", "prompt", "image_sise", "meta.aspect_ration"], ["a", "a mug", "2K", "4:5"]]
    path = tmp_path / f"m.{suffix}"
    if suffix == "xlsx":
        _workbook(path, rows)
    else:
        pq.write_table(pa.table({name: [value] for name, value in zip(*rows, strict=True)}), path)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    [problem] = info.value.problems
    assert problem.field == "image_sise"
    assert problem.message == "column 'image_sise' is not a field; did you mean 'image_size'?"


@pytest.mark.parametrize(
    ("name", "meant"),
    [("aspect_ration", "aspect_ratio"), ("image_sise", "image_size"), ("Aspect-Ratio", "aspect_ratio"),
     ("imgae_size", "image_size"), ("promt", "prompt"), ("modle", "model"), ("cuont", "count"),
     ("refrence_images", "reference_images"), ("max_token", "max_tokens"),
     ("x-aspect_ration", "aspect_ratio"), ("meta.aspect_ration", None), ("META.image_size", None),
     ("sise", None), ("maks", None)],
)  # fmt: skip
def test_near_misses(name: str, meant: str | None) -> None:
    assert looks_like_field(name) == meant


def test_edit_distance_counts_a_swap_as_one_and_stops_past_its_limit() -> None:
    assert edit_distance("imgaesize", "imagesize", 2) == 1
    assert edit_distance("aspectration", "aspectratio", 2) == 1
    assert edit_distance("colour", "count", 2) == 3  # limit + 1: more than the limit
    assert edit_distance("a", "abcdef", 2) == 3
