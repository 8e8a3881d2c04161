"""The one table of manifest formats: every name, suffix and extra is read from it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

import pytest

from imagebatch.cli.main import build_parser
from imagebatch.extras import EXTRAS
from imagebatch.manifest import (
    FORMAT_NAMES,
    FORMATS,
    ManifestError,
    ManifestFormat,
    detect_format,
    load_manifest,
)


def test_the_type_and_the_command_line_name_the_formats_of_the_table() -> None:
    assert get_args(ManifestFormat) == FORMAT_NAMES == ("csv", "json", "jsonl", "xlsx", "parquet")
    [subcommands] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    [action] = [a for a in subcommands.choices["validate"]._actions if a.dest == "format"]
    assert tuple(action.choices) == FORMAT_NAMES
    assert all(f.extra is None or f.extra in EXTRAS for f in FORMATS.values())


@pytest.mark.parametrize(
    ("name", "fmt"),
    [(f"m{suffix.upper() if i % 2 else suffix}", f.name)
     for i, f in enumerate(FORMATS.values()) for suffix in f.suffixes],
)  # fmt: skip
def test_each_suffix_means_its_format_in_any_case(name: str, fmt: str) -> None:
    assert detect_format(Path(name)) == fmt
    assert detect_format(f"s3://bucket/{name}") == fmt


def test_an_unknown_suffix_or_format_names_the_known_ones() -> None:
    with pytest.raises(ManifestError) as info:
        detect_format(Path("m.txt"))
    assert str(info.value.problems[0]).endswith("(use .csv, .json, .jsonl, .ndjson, .xlsx or .parquet)")
    with pytest.raises(ManifestError) as info:
        detect_format(Path("m.csv"), "tsv")
    assert (
        str(info.value.problems[0])
        == "unknown manifest format 'tsv' (one of csv, json, jsonl, xlsx, parquet)"
    )


def test_an_ndjson_file_is_read_as_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.ndjson"
    path.write_text('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n')
    manifest = load_manifest(path)
    assert (manifest.format, [job.id for job in manifest.jobs]) == ("jsonl", ["a", "b"])
