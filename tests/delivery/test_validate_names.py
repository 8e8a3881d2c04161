"""`imagebatch validate MANIFEST --name TEMPLATE`: export's naming rules on every row before anything is
sent, each problem naming the manifest's own row (the sheet and row of a workbook), exit 2; the
emulator's request log shows nothing sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openpyxl
import pytest
from helpers.runs import cli

from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE

TEMPLATE = "{sku}/{colour}.{ext}"


def workbook(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Products"
    sheet.append(["id", "sku", "colour", "prompt"])
    for job, sku, colour in rows:
        sheet.append([job, sku, colour, f"a tote bag in {colour or 'grey'}"])
    book.save(path)
    return path


def test_validate_name_names_each_spreadsheet_row_and_sends_nothing(
    service_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = workbook(
        tmp_path / "catalog.xlsx",
        [
            ("ok", "SKU-4001", "sand"),
            ("slash", "SKU-4003", "black/natural"),
            ("padded", "SKU-4004 ", "rust"),  # a trailing space a spreadsheet hides
            ("colon", "SKU-4005", "red:blue"),
            ("empty", "SKU-4006", ""),
            ("twin", "sku-4001", "Sand"),  # one file with row 2's on macOS and Windows
        ],
    )
    before = len(service_env.requests())
    code, out, err = cli(capsys, "validate", str(manifest), "--name", TEMPLATE)
    assert code == EXIT_USAGE, err
    lines = out.splitlines()
    assert (
        "sheet 'Products' row 3 (id=slash): {colour} is 'black/natural': a '/' inside a value would make "
        "folders (--slug makes it '-')"
    ) in lines
    assert (
        "sheet 'Products' row 4 (id=padded): its name 'SKU-4004 /rust.png' is refused: the segment "
        "'SKU-4004 ' ends in ' ', which Windows drops"
    ) in lines
    assert any(
        line.startswith("sheet 'Products' row 5 (id=colon): its name") and "':'" in line for line in lines
    )
    assert "sheet 'Products' row 6 (id=empty): its name 'SKU-4006/.png' is refused: the hidden segment" in out
    assert (
        "sheet 'Products' row 2 (id=ok) and sheet 'Products' row 7 (id=twin): both would be named "
        "'sku-4001/Sand.png'"
    ) in out
    assert lines[-1] == f"--name {TEMPLATE!r}: 5 problems; nothing was sent"
    assert len(service_env.requests()) == before

    # --slug makes clean names of every value: only the collision (now exact) and the empty value remain
    code, out, _ = cli(capsys, "validate", str(manifest), "--name", TEMPLATE, "--slug")
    assert code == EXIT_USAGE
    assert "both would be named 'sku-4001/sand.png'" in out and "id=empty" in out and "id=slash" not in out


def test_validate_name_passes_clean_names_and_refuses_an_unknown_field(
    examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = str(examples / "catalog.csv")
    code, out, err = cli(capsys, "validate", catalog, "--name", TEMPLATE)
    assert code == EXIT_OK, out + err
    assert f"--name {TEMPLATE!r}: 6 names, each safe and unique ({{ext}} taken as png)" in out
    code, out, _ = cli(capsys, "validate", catalog, "--name", "{sku}-{width}.{ext}")
    assert code == EXIT_USAGE and "names {width}: known only after a run" in out
    code, out, _ = cli(capsys, "validate", catalog, "--name", "{sku}/{size}.{ext}")
    assert code == EXIT_USAGE and "names {size}: not a column of the manifest" in out
    code, out, _ = cli(capsys, "validate", catalog, "--name", "{sku")
    assert code == EXIT_USAGE and "expected '}' before end of string" in out
