"""XLSX and Parquet manifests: the same columns, rules and idempotency keys as a CSV; cells read as a person
sees them; every problem named by sheet and row (or record) and field; hostile files refused, bounded."""

from __future__ import annotations

import datetime as dt
import re
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import openpyxl
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from imagebatch.cli.main import main
from imagebatch.manifest import ManifestError, load_manifest, plan
from imagebatch.manifest.tables import MAX_TABLE_BYTES, cell_text, read_table
from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE

CELLS = "a manifest column holds text, numbers, true/false or dates"
HEADER = ["id", "prompt", "sku", "count", "image_size", "launch"]


def xlsx(path: Path, sheets: dict[str, list[list[Any]]], formats: dict[str, str] | None = None) -> Path:
    """A workbook with one sheet per entry (rows appended in order; `None` cells left empty), cells of
    the first sheet formatted as `formats` says (`{"C3": "00000"}`)."""
    book = openpyxl.Workbook()
    book.remove(book.active)
    for name, rows in sheets.items():
        ws = book.create_sheet(name)
        for row in rows:
            ws.append(row)
    for cell, number_format in (formats or {}).items():
        book.worksheets[0][cell].number_format = number_format
    book.save(path)
    return path


def rewrite_part(path: Path, part: str, change: Any) -> None:
    """Rewrite one part of a zip archive (`change(bytes) -> bytes`), the others copied as they are."""
    with zipfile.ZipFile(path) as source:
        parts = [(info, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as target:
        for info, data in parts:
            target.writestr(info, change(data) if info.filename == part else data)


def save_values(path: Path, values: dict[str, str]) -> None:
    """What a spreadsheet program does on saving: each formula cell keeps the value it calculated (the
    cells in `values`, as text); openpyxl itself never calculates."""

    def change(xml: bytes) -> bytes:
        text = xml.decode()
        for cell, value in values.items():
            text, n = re.subn(
                rf'<c r="{cell}"><f>(.*?)</f><v ?/>', rf'<c r="{cell}" t="str"><f>\1</f><v>{value}</v>', text
            )
            assert n == 1, cell
        return text.encode()

    rewrite_part(path, "xl/worksheets/sheet1.xml", change)


def problems_of(path: Path | str, **kwargs: Any) -> list[str]:
    with pytest.raises(ManifestError) as info:
        load_manifest(path, **kwargs)
    return [str(p) for p in info.value.problems]


# --- the same manifest as a CSV, a workbook and a Parquet file ----------------------------------------


def test_a_workbook_and_a_parquet_file_give_the_csv_s_jobs_and_keys(tmp_path: Path) -> None:
    csv_path = tmp_path / "m.csv"
    csv_path.write_text(
        "id,prompt,sku,count,image_size,launch\n"
        "mug,Photo of mug {sku},00123,2,2K,2024-05-01\n"
        "vase,Photo of vase {sku},SKU-9,1,,2024-05-01 13:30:00\n"
    )
    sheet = [
        [],  # a blank first row: the header is the first row with a value
        HEADER,
        ["mug", "Photo of mug {sku}", 123, 2.0, "2K", dt.date(2024, 5, 1)],  # 00123 is 123 shown as 00000
        [None, None],  # a blank row between rows is not a job
        ["vase", "Photo of vase {sku}", "SKU-9", 1, None, dt.datetime(2024, 5, 1, 13, 30)],
    ]
    book = xlsx(tmp_path / "m.xlsx", {"Products": sheet}, formats={"C3": "00000"})
    frame = pd.DataFrame(
        {
            "id": ["mug", "vase"],
            "prompt": ["Photo of mug {sku}", "Photo of vase {sku}"],
            "sku": ["00123", "SKU-9"],
            "count": [2.0, 1.0],  # floats, as pandas keeps an integer column with a missing value
            "image_size": ["2K", None],
            "launch": [pd.Timestamp("2024-05-01"), pd.Timestamp("2024-05-01 13:30")],
        }
    )
    parquet = tmp_path / "m.parquet"
    frame.to_parquet(parquet)

    expected = load_manifest(csv_path)
    keys = [r.idempotency_key for r in plan(expected)]
    for path, fmt, lines in ((book, "xlsx", [3, 5]), (parquet, "parquet", [1, 2])):
        manifest = load_manifest(path)
        assert manifest.format == fmt
        assert [r.idempotency_key for r in plan(manifest)] == keys
        assert [j.metadata for j in manifest.jobs] == [j.metadata for j in expected.jobs]
        assert manifest.jobs[0].metadata == {"sku": "00123", "launch": "2024-05-01"}
        assert manifest.jobs[1].metadata == {"sku": "SKU-9", "launch": "2024-05-01 13:30:00"}
        assert manifest.jobs[0].prompt == "Photo of mug 00123"
        assert [j.line for j in manifest.jobs] == lines
    workbook = load_manifest(book)
    assert workbook.sheet == "Products" and workbook.source == f"{book}#Products"
    assert [j.location for j in workbook.jobs] == ["row 3", "row 5"]


def test_cells_read_as_text_the_way_a_csv_export_writes_them() -> None:
    assert cell_text(12.0) == "12"
    assert cell_text(12.5) == "12.5"
    assert cell_text(0.1) == "0.1"
    assert cell_text(-7, "00000") == "-00007"
    assert cell_text(123, "00000;[Red]-00000") == "00123"
    assert cell_text(1234.5, "#,##0.00") == "1234.5"  # other number formats are not applied
    assert cell_text(float("nan")) == ""
    assert cell_text(None) == ""
    assert cell_text(True) == "true" and cell_text(False) == "false"
    assert cell_text(dt.datetime(2024, 5, 1)) == "2024-05-01"
    assert cell_text(dt.time(13, 30)) == "13:30:00"
    assert cell_text(dt.datetime(2024, 5, 1, 13, 30, tzinfo=dt.UTC)) == "2024-05-01 13:30:00+00:00"
    assert cell_text(pd.Timestamp("2024-05-01 13:30")) == "2024-05-01 13:30:00"
    import decimal

    assert cell_text(decimal.Decimal("2.00")) == "2" and cell_text(decimal.Decimal("2.50")) == "2.50"


# --- problems named by sheet, row and field ------------------------------------------------------------


def test_every_problem_names_its_sheet_row_and_field(tmp_path: Path) -> None:
    rows = [
        ["id", "prompt", "image_size", "Aspect Ratio", None],
        ["a", "a mug", "3K", "1:1"],
        ["b", None, "1K", None, "stray"],  # no prompt; a value under no column name
        ["a", "a bowl"],  # a duplicate id
    ]
    path = xlsx(tmp_path / "m.xlsx", {"Hidden": [["x"]], "Products": rows})
    book = openpyxl.load_workbook(path)
    book["Hidden"].sheet_state = "hidden"  # the first sheet, hidden: the first visible one is read
    book.save(path)
    assert problems_of(path) == [
        "sheet 'Products' row 1, field Aspect Ratio: column 'Aspect Ratio' is not a field; did you mean "
        "'aspect_ratio'? (if it is metadata, declare it so: name it 'meta.Aspect Ratio')",
        "sheet 'Products' row 2 (id=a), field image_size: image size must be one of 1K, 2K, 4K "
        "(case-sensitive), not '3K'",
        "sheet 'Products' row 3: column 5 has no name in the header but holds values",
        "sheet 'Products' row 3 (id=b), field prompt: prompt is required",
        "sheet 'Products' row 4 (id=a), field id: duplicate id 'a': also used on row 2",
    ]


def test_a_header_without_the_required_columns_or_with_a_column_twice(tmp_path: Path) -> None:
    path = xlsx(tmp_path / "m.xlsx", {"Sheet": [[], [None, "id", "name", "name"], [None, "a", "x", "y"]]})
    assert problems_of(path) == [
        "sheet 'Sheet' row 2, field name: column 'name' appears twice (columns 3 and 4)",
    ]
    path = xlsx(tmp_path / "n.xlsx", {"Sheet": [["id", "colour"], ["a", "red"]]})
    assert problems_of(path) == [
        "sheet 'Sheet' row 1, field prompt: the manifest has no 'prompt' column; every job needs one"
    ]


def test_a_parquet_file_names_its_records_from_1(tmp_path: Path) -> None:
    path = tmp_path / "m.parquet"
    pd.DataFrame({"id": ["a", "b"], "prompt": ["x", "y"], "image_size": ["1K", "5K"]}).to_parquet(path)
    assert problems_of(path) == [
        "row 2 (id=b), field image_size: image size must be one of 1K, 2K, 4K (case-sensitive), not '5K'"
    ]


# --- which sheet -----------------------------------------------------------------------------------------


def test_a_sheet_is_named_after_a_hash_or_with_sheet_else_the_first_visible_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = xlsx(
        tmp_path / "m.xlsx",
        {"Draft": [["id", "prompt"], ["draft", "x"]], "Final": [["id", "prompt"], ["final", "y"]]},
    )
    assert [j.id for j in load_manifest(path).jobs] == ["draft"]
    assert [j.id for j in load_manifest(f"{path}#Final").jobs] == ["final"]
    assert [j.id for j in load_manifest(path, sheet="Final").jobs] == ["final"]
    assert problems_of(f"{path}#final") == [
        "the workbook has no sheet 'final'; its sheets are 'Draft', 'Final' (did you mean 'Final'?)"
    ]

    assert main(["validate", str(path), "--sheet", "Final"]) == EXIT_OK
    assert capsys.readouterr().out.startswith(f"{path}#Final: valid (xlsx, sheet 'Final', sha256 ")
    csv_path = tmp_path / "m.csv"
    csv_path.write_text("id,prompt\na,x\n")
    assert main(["validate", str(csv_path), "--sheet", "Final"]) == EXIT_USAGE
    assert "--sheet is for an .xlsx manifest" in capsys.readouterr().err


def test_a_file_or_a_sheet_whose_name_holds_a_hash(tmp_path: Path) -> None:
    path = xlsx(
        tmp_path / "catalog#2.xlsx",
        {"S": [["id", "prompt"], ["a", "x"]], "Q1#2024": [["id", "prompt"], ["q", "y"]]},
    )
    assert load_manifest(path).sheet == "S"  # the file exists as named: never split
    assert [j.id for j in load_manifest(f"{path}#Q1#2024").jobs] == ["q"]


# --- formulas and error values -----------------------------------------------------------------------


def test_formulas_are_read_by_the_values_saved_with_them(tmp_path: Path) -> None:
    rows = [["id", "colour", "prompt"], ["a", "red", '="A "&B2&" mug"'], ["b", "blue", '=IF(B3="","","x")']]
    path = xlsx(tmp_path / "m.xlsx", {"S": rows})
    save_values(path, {"C2": "A red mug", "C3": "A blue mug"})
    assert [j.prompt for j in load_manifest(path).jobs] == ["A red mug", "A blue mug"]


def test_a_workbook_whose_formulas_were_never_calculated_is_refused(tmp_path: Path) -> None:
    rows = [["id", "colour", "prompt"], ["a", "red", '="A "&B2'], ["b", "blue", "a bowl"]]
    path = xlsx(tmp_path / "m.xlsx", {"S": rows})  # openpyxl saves no value for a formula
    (problem,) = problems_of(path)
    assert problem.startswith(
        "sheet 'S' row 2, field prompt: cell C2: the formula '=\"A \"&B2' has no saved value "
        "(formulas are not calculated here: open and save the file in a spreadsheet program"
    )


def test_a_formula_saved_without_a_value_in_a_calculated_workbook_is_an_empty_cell(tmp_path: Path) -> None:
    rows = [["id", "prompt", "note"], ["a", '="a "&"mug"', '=IF(1,"","x")']]
    path = xlsx(tmp_path / "m.xlsx", {"S": rows})
    save_values(path, {"B2": "a mug"})  # the other formula's value is the empty text
    (job,) = load_manifest(path).jobs
    assert job.prompt == "a mug" and job.metadata == {"note": ""}


def test_an_error_value_is_refused_with_its_cell(tmp_path: Path) -> None:
    path = xlsx(tmp_path / "m.xlsx", {"S": [["id", "prompt", "sku"], ["a", "x", "#N/A"]]})
    assert problems_of(path) == ["sheet 'S' row 2, field sku: cell C2: the cell holds the error value #N/A"]


# --- hostile and broken files ----------------------------------------------------------------------------


def _central_size(path: Path, part: str, size: int) -> None:
    """Make the archive's central directory declare `size` bytes for `part` (its data unchanged)."""
    data = bytearray(path.read_bytes())
    at = -1
    for start in [m.start() for m in re.finditer(b"PK\x01\x02", bytes(data))]:
        name_length = struct.unpack_from("<H", data, start + 28)[0]
        if data[start + 46 : start + 46 + name_length].decode() == part:
            struct.pack_into("<I", data, start + 24, size)
            at = start
    assert at >= 0
    path.write_bytes(bytes(data))


def test_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    path = xlsx(tmp_path / "bomb.xlsx", {"S": [["id", "prompt"], ["a", "x"]]})
    _central_size(path, "xl/worksheets/sheet1.xml", 0xFFFFFFF0)  # it says 4 GiB
    (problem,) = problems_of(path)
    assert re.match(r"the workbook's parts add up to 4,294,9\d\d,\d{3} bytes uncompressed", problem)
    assert f"a manifest must be under {MAX_TABLE_BYTES:,}" in problem


def test_a_sheet_that_inflates_past_the_bound_is_refused(tmp_path: Path) -> None:
    # 20 MB of rows that compress to a few hundred KB; the reader is given a 1 MB bound.
    path = xlsx(tmp_path / "big.xlsx", {"S": [["id", "prompt"], ["a", "x"]]})
    row = b'<row><c t="inlineStr"><is><t>' + b"x" * 200 + b"</t></is></c></row>"
    rewrite_part(
        path,
        "xl/worksheets/sheet1.xml",
        lambda xml: xml.replace(b"</sheetData>", row * 80_000 + b"</sheetData>"),
    )
    assert path.stat().st_size < 1_000_000
    with pytest.raises(ManifestError) as info:
        read_table(path, "xlsx", max_bytes=1_000_000)
    assert "uncompressed" in str(info.value) and "must be under 1,000,000" in str(info.value)


def test_a_part_that_inflates_past_what_it_declares_is_a_damaged_workbook(tmp_path: Path) -> None:
    path = xlsx(tmp_path / "lying.xlsx", {"S": [["id", "prompt"], *([["a", "x" * 100]] * 1000)]})
    _central_size(path, "xl/worksheets/sheet1.xml", 64)
    (problem,) = problems_of(path)
    assert problem.startswith("the workbook cannot be read (")


def test_a_sheet_past_the_row_bound_is_refused(tmp_path: Path) -> None:
    path = xlsx(tmp_path / "rows.xlsx", {"S": [["id", "prompt"], *([[f"r{i}", "x"] for i in range(150)])]})
    with pytest.raises(ManifestError) as info:
        read_table(path, "xlsx", max_rows=100)
    assert [str(p) for p in info.value.problems] == [
        "sheet 'S' has more than 100 rows (split it over several manifests)"
    ]
    parquet = tmp_path / "rows.parquet"
    pd.DataFrame({"id": [f"r{i}" for i in range(150)], "prompt": "x"}).to_parquet(parquet)
    with pytest.raises(ManifestError) as info:
        read_table(parquet, "parquet", max_rows=100)
    assert "the file has 150 rows; at most 100" in str(info.value)


@pytest.mark.parametrize("name", ["m.xlsx", "m.parquet"])
def test_a_file_that_is_not_what_its_extension_says_is_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("id,prompt\na,x\n")
    (problem,) = problems_of(path)
    kind = "not an XLSX workbook" if name.endswith("xlsx") else "not a Parquet file"
    assert problem.startswith(kind)


def test_parquet_columns_that_are_not_cells_are_refused_by_name(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": ["a"],
            "prompt": ["x"],
            "reference_images": pa.array([["a.png", "b.png"]]),
            "dims": pa.array([{"w": 1, "h": 2}]),
            "blob": pa.array([b"\x00\x01"]),
            "colour": pa.array(["red"]).dictionary_encode(),  # a categorical: fine
        }
    )
    path = tmp_path / "m.parquet"
    pq.write_table(table, path)
    problems = problems_of(path)
    assert problems == [
        f"field reference_images: the column holds list<element: string> values; {CELLS} (write a list "
        "(reference_images) as text separated by ';', as in a CSV)",
        f"field dims: the column holds struct<w: int64, h: int64> values; {CELLS}",
        f"field blob: the column holds binary values; {CELLS}",
    ]


def test_parquet_nulls_nan_and_pandas_index(tmp_path: Path) -> None:
    frame = pd.DataFrame({"prompt": ["x", "y"], "weight": [1.5, float("nan")], "note": ["n", None]})
    frame.index = pd.Index(["a", "b"], name="id")  # written as a column named id
    path = tmp_path / "m.parquet"
    frame.to_parquet(path)
    jobs = load_manifest(path).jobs
    assert [(j.id, j.metadata) for j in jobs] == [
        ("a", {"weight": "1.5", "note": "n"}),
        ("b", {"weight": "", "note": ""}),
    ]
    pd.DataFrame({"id": ["a"], "prompt": ["x"]}, index=[7]).to_parquet(path)  # an unnamed index
    assert load_manifest(path).metadata_columns == []


@pytest.mark.slow  # a process of its own
def test_reading_a_csv_loads_no_table_reader() -> None:
    code = (
        "import sys, tempfile, pathlib\n"
        "from imagebatch.manifest import load_manifest\n"
        "p = pathlib.Path(tempfile.mkdtemp()) / 'm.csv'\n"
        "p.write_text('id,prompt\\na,x\\n')\n"
        "load_manifest(p)\n"
        "import imagebatch\n"
        "readers = ('pandas', 'openpyxl', 'pyarrow', 'imagebatch.manifest.tables')\n"
        "loaded = [m for m in readers if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_workbook_is_read_from_its_bytes_once(tmp_path: Path) -> None:
    # The manifest's sha256 is of the file's bytes, whatever sheet is read.
    import hashlib

    path = xlsx(
        tmp_path / "m.xlsx", {"A": [["id", "prompt"], ["a", "x"]], "B": [["id", "prompt"], ["b", "y"]]}
    )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert load_manifest(path).sha256 == digest == load_manifest(f"{path}#B").sha256


# --- issue 29 #1, #3: what reading costs, bounded before it is paid -----------------------------------


def sparse_workbook(path: Path, far: dict[tuple[int, int], str]) -> Path:
    """A 5 KB workbook: a header `id, prompt` and the cells in `far` ((row, column) -> value)."""
    book = openpyxl.Workbook()
    book.active.append(["id", "prompt"])
    for (row, column), value in far.items():
        book.active.cell(row=row, column=column, value=value)
    book.save(path)
    return path


def dictionary_bomb(path: Path, records: int = 4000) -> Path:
    """A ~9 KB Parquet file whose `prompt` names one 1 MiB dictionary value in every record (4 GiB once
    decoded; its footer declares about 1 MB)."""
    prompt = pa.DictionaryArray.from_arrays(pa.array([0] * records, pa.int32()), pa.array(["x" * (1 << 20)]))
    table = pa.table({"id": [f"r{i}" for i in range(records)], "prompt": prompt})
    pq.write_table(table, path, compression="zstd", dictionary_pagesize_limit=4 << 20, store_schema=False)
    assert path.stat().st_size < 20_000
    return path


def test_a_lone_cell_at_xfd1048576_is_one_short_row_named_not_a_million_padded_ones(tmp_path: Path) -> None:
    path = sparse_workbook(tmp_path / "sparse.xlsx", {(1_048_576, 16_384): "x"})
    assert problems_of(path) == [
        "sheet 'Sheet' row 1048576: column 16384 has no name in the header but holds values"
    ]
    path = sparse_workbook(tmp_path / "last.xlsx", {(1_048_576, 1): "g1", (1_048_576, 2): "a vase"})
    (job,) = load_manifest(path).jobs
    assert (job.id, job.line) == ("g1", 1_048_576)


def test_a_header_cell_far_right_is_refused_before_every_row_is_padded_to_it(tmp_path: Path) -> None:
    far = {(1, 16_384): "far"} | {(r, c): f"v{r}" for r in range(2, 40) for c in (1, 2)}
    path = sparse_workbook(tmp_path / "wide.xlsx", far)
    with pytest.raises(ManifestError) as info:
        read_table(path, "xlsx", max_cells=100_000)
    (problem,) = map(str, info.value.problems)
    assert problem.startswith("sheet 'Sheet' spans 39 rows with values by 16,384 columns (638,976 cells);")


def test_rows_each_reaching_column_xfd_are_refused_as_they_are_read(tmp_path: Path) -> None:
    path = sparse_workbook(tmp_path / "far.xlsx", {(r, 16_384): "x" for r in range(2, 200)})
    with pytest.raises(ManifestError) as info:
        read_table(path, "xlsx", max_cells=100_000)
    (problem,) = map(str, info.value.problems)
    assert problem.startswith(
        "sheet 'Sheet' spreads over more than 100,000 cells by row 8 "
    )  # 2 + 7 x 16,384


def test_a_parquet_dictionary_bomb_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    (problem,) = problems_of(dictionary_bomb(tmp_path / "bomb.parquet"))
    assert problem.startswith(
        f"the file's data exceeds {MAX_TABLE_BYTES:,} bytes once read (by record 4,000;"
    )
    small = dictionary_bomb(tmp_path / "small.parquet", records=3)  # the same encoding, within bounds
    assert [job.prompt[:3] for job in load_manifest(small).jobs] == ["xxx"] * 3


def test_the_hostile_tables_are_refused_in_bounded_memory_and_time(tmp_path: Path) -> None:
    """The attacker's files, read in a child process: peak memory well under the issue's 500 MB."""
    files = [
        sparse_workbook(tmp_path / "sparse.xlsx", {(1_048_576, 16_384): "x"}),
        sparse_workbook(tmp_path / "two.xlsx", {(1_048_576, 1): "g1", (1_048_576, 3): "x"}),
        dictionary_bomb(tmp_path / "bomb.parquet"),
    ]
    # The peak is the child's own: a forked child starts with its parent's high-water mark (a long pytest
    # process's), so it is reset first (`clear_refs` 5) and read from /proc (VmHWM, in kB).
    code = (
        "import re, sys\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "from imagebatch.manifest import ManifestError, load_manifest\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        load_manifest(name)\n"
        "    except ManifestError:\n"
        "        pass\n"
        "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, files)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 400 * 1024, f"peak RSS {int(done.stdout) // 1024} MB"  # VmHWM is in kB
