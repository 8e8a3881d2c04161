"""XLSX and Parquet manifests: one sheet, or one Parquet table, read into the same raw rows as a CSV (every
cell as text, the CSV's header rules: `read.table_rows`), each problem named by its sheet and row (or its
record) and column. Imported only for such a file: a CSV run never loads these readers.

The readers are the engines pandas reads these formats with, openpyxl and pyarrow, called directly:
through `pandas.read_excel` a manifest would lose what it needs, a cell's number format (a SKU shown as
`00123` is the number 123 formatted `00000`), whether an empty value is a formula never calculated, and
the check of a Parquet file's types before any row is read.

Cells to text (what a person sees in the spreadsheet, as a CSV export writes it):
- text as it is; an empty cell (or a null, or NaN) is absent, as an empty CSV cell;
- a whole number without a decimal point (`12`, also when stored as 12.0); a whole number whose number
  format is zeros only (`00000`) padded to that width, as the spreadsheet shows it (`00123`); another
  number as the shortest text that reads back the same (`12.5`). Other number formats (thousands
  separators, currencies, percentages) are not applied: the value is used;
- `true` / `false` (as a JSON manifest's booleans read in a prompt);
- a date `2024-05-01`, a date and time `2024-05-01 13:30:00` (with its offset if it has one), a time
  `13:30:00`.

Formulas are not evaluated: the value the spreadsheet program calculated and saved in the file is used
(what it shows). A file whose formulas have no saved value at all (written by a program that does not
calculate, such as openpyxl or pandas) is refused, naming the cells: open and save it in a spreadsheet
program, or paste the values. Error values (`#N/A`, `#DIV/0!`) are refused with their cell.

Which sheet: the one named (`catalog.xlsx#Products`, or `--sheet Products`), else the first visible
worksheet (the leftmost tab shown). Its header is its first row with a value; rows are numbered as the
spreadsheet numbers them. Hidden rows and columns are read like the others (a filter hides, it does not
delete).

Parquet: columns of text, integers, floats, decimals, booleans, dates, times, timestamps (or a
dictionary of those: pandas' categoricals); a list, struct, map, binary or other column is refused,
naming the column and its type (`reference_images` is text separated by `;`, as in a CSV). Records are
numbered from 1 (`row 1` is the first); pandas' unnamed index (`__index_level_0__`) is not a column.

Bounds (what a hostile file can make us hold): the file is under `MAX_TABLE_BYTES`; an XLSX's parts,
uncompressed, add up to under `MAX_TABLE_BYTES` as its archive declares them, checked before any is
inflated (zipfile stops a part at its declared size: one that inflates further fails its CRC), so a zip
bomb is refused unopened; a Parquet file's data, uncompressed, as its footer declares, is under the same,
and so is what reading it expands to (its text, a dictionary's value counted once per record that names
it), batch by batch before a batch's cells are made; at most `MAX_TABLE_ROWS` rows (Excel's own limit of
a sheet), as a Parquet footer declares them or as a sheet's rows are read; at most `MAX_TABLE_CELLS`
cells, counted as reading pays for them: a sheet's rows as openpyxl makes them (each row as wide as its
last cell) and the rows with a value padded to the widest one, checked before padding; a Parquet file's
records times its columns, from its footer. A sheet's empty rows cost nothing, so a lone cell at XFD1048576
is one short row, not a million padded ones (figures in bench/README.md).
"""

from __future__ import annotations

import datetime as dt
import decimal
import difflib
import hashlib
import io
import math
import re
import warnings
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebatch.extras import needs_extra

from .models import ManifestError, ManifestFormat, Problem
from .read import RawManifest, table_rows
from .textfile import read_file

if TYPE_CHECKING:
    import pyarrow

MAX_TABLE_BYTES = 512 * 1024 * 1024
"""A workbook's parts or a Parquet file's data, uncompressed, and the file itself, must be under this
(512 MiB; a 100,000-row catalog is about 12 MB of CSV, 30 MB of sheet XML)."""
MAX_TABLE_ROWS = 1_048_576
"""The most rows a sheet or a Parquet file may have: Excel's limit of one sheet."""
MAX_TABLE_CELLS = 16_000_000
"""The most cells a sheet or a Parquet file may spread over (rows by columns, as reading pays for them):
about 1.2 GB of text at most in memory; a 100,000-row catalog of 30 columns is 3 million."""
PARQUET_BATCH_ROWS = 4096
"""Records read from a Parquet file at a time, their expanded size checked before their cells are made."""
MAX_FORMULA_PROBLEMS = 20
"""Formula cells without a saved value named one by one; the rest are counted in one more problem."""
PANDAS_INDEX = re.compile(r"__index_level_\d+__")
"""The column pandas writes for an unnamed index that is not a plain range (`DataFrame.to_parquet`)."""
_ZEROS = re.compile(r"0+")
_FAR_HINT = "is a value far to the right of the data? delete it, or split the catalog over several manifests"


def read_table(
    path: Path,
    fmt: ManifestFormat,
    sheet: str | None = None,
    *,
    max_bytes: int = MAX_TABLE_BYTES,
    max_rows: int = MAX_TABLE_ROWS,
    max_cells: int = MAX_TABLE_CELLS,
) -> RawManifest:
    """Read an XLSX (`sheet`, else the first visible one) or Parquet manifest into raw rows of text;
    ManifestError naming the file, sheet, row and column when it cannot be read as one."""
    data = read_file(path, limit=max_bytes)
    raw = RawManifest(path=path, format=fmt, sha256=hashlib.sha256(data).hexdigest(), rows=[], unit="row")
    if not data:
        raise ManifestError([Problem(None, None, None, "the manifest is empty")], path)
    if fmt == "xlsx":
        header_line, header, records = _read_xlsx(raw, data, sheet, max_bytes, (max_rows, max_cells))
    else:
        if sheet is not None:
            why = f"a Parquet file has no sheets (asked for {sheet!r})"
            raise ManifestError([Problem(None, None, None, why)], path)
        header_line, header, records = None, *_read_parquet(raw, data, max_bytes, (max_rows, max_cells))
    if not header:
        where = f"sheet {raw.sheet!r}" if raw.sheet is not None else "the file"
        raise ManifestError(
            [Problem(None, None, None, f"the manifest is empty ({where} has no header)")], path
        )
    table_rows(raw, header_line, header, records)
    return raw


def _whole_file(
    raw: RawManifest, message: str, hint: str | None = None, field: str | None = None
) -> ManifestError:
    return ManifestError([Problem(None, None, field, message, hint, sheet=raw.sheet)], raw.path)


# --- cells to text ------------------------------------------------------------------------------------


def number_text(value: float | int | decimal.Decimal) -> str:
    """A number as a CSV export writes it: a whole number without a decimal point; NaN is empty."""
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "" if math.isnan(value) else str(value)
    if value == value.to_integral_value() if isinstance(value, decimal.Decimal) else value.is_integer():
        return str(int(value))
    return str(value)  # float: the shortest text that reads back the same; Decimal: as stored


def cell_text(value: Any, number_format: str = "General") -> str:
    """One cell's value as the text a CSV export of it holds (see the module docstring)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | decimal.Decimal):
        text = number_text(value)
        zeros = number_format.split(";", 1)[0]
        if _ZEROS.fullmatch(zeros) and text.lstrip("-").isdigit():
            sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text)
            return sign + digits.zfill(len(zeros))
        return text
    if isinstance(value, dt.datetime):
        if value.time() == dt.time() and value.tzinfo is None:
            return value.date().isoformat()
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    return str(value)  # a duration, say: its text


# --- XLSX ---------------------------------------------------------------------------------------------


def _check_archive(raw: RawManifest, data: bytes, max_bytes: int) -> None:
    """A zip archive whose parts, uncompressed, add up to under `max_bytes` (before any is inflated)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            parts = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise _whole_file(
            raw,
            f"not an XLSX workbook (an .xlsx file is a zip archive: {exc})",
            "an old .xls or a password-protected workbook cannot be read: save it as .xlsx",
        ) from None
    total = sum(part.file_size for part in parts)
    if total >= max_bytes:
        raise _whole_file(
            raw,
            f"the workbook's parts add up to {total:,} bytes uncompressed (from a {len(data):,}-byte file); "
            f"a manifest must be under {max_bytes:,}",
            "is it the workbook you meant? split the catalog over several manifests",
        )


@dataclass(slots=True)
class _Sheet:
    """A sheet as read: its rows (number, cell texts), its formula cells, and its error cells."""

    rows: list[tuple[int, list[str]]]
    formulas: dict[tuple[int, int], str]
    """(row, column) -> the formula's text, for the cells holding a formula (text "" in `rows`)."""
    errors: dict[tuple[int, int], str]
    """(row, column) -> the error value (`#N/A`) a cell holds."""


def _read_xlsx(
    raw: RawManifest, data: bytes, sheet: str | None, max_bytes: int, bounds: tuple[int, int]
) -> tuple[int, list[str], list[tuple[int, list[str]]]]:
    _check_archive(raw, data, max_bytes)
    max_cells = bounds[1]
    read = _read_sheet(raw, data, sheet, bounds)
    uncalculated: dict[tuple[int, int], str] = {}
    if read.formulas:
        # A second read, for the values saved with the formulas (the cells holding one, and only them).
        saved = _read_sheet(raw, data, raw.sheet, bounds, only=read.formulas)
        cells = dict(read.rows)
        for row, texts in saved.rows:
            for column, text in enumerate(texts, start=1):
                if (row, column) in read.formulas:
                    cells[row][column - 1] = text
        read.errors |= saved.errors
        if not any(text for _, texts in saved.rows for text in texts):
            uncalculated = read.formulas  # none has a saved value: never calculated
    start = next((i for i, (_, texts) in enumerate(read.rows) if any(c.strip() for c in texts)), None)
    if start is None:
        return 0, [], []
    header_line, header = read.rows[start]
    records = read.rows[start + 1 :]
    width = max([len(header), *(len(texts) for _, texts in records)])
    if width * (len(records) + 1) > max_cells:  # before padding: a stray far cell would pay for all rows
        raise _whole_file(
            raw,
            f"sheet {raw.sheet!r} spans {len(records) + 1:,} rows with values by {width:,} columns "
            f"({width * (len(records) + 1):,} cells); a manifest may have at most {max_cells:,}",
            _FAR_HINT,
        )
    header = [h.strip() for h in header] + [""] * (width - len(header))
    for _, texts in records:
        texts.extend([""] * (width - len(texts)))
    problems = [
        _cell_problem(raw, header, cell, f"the cell holds the error value {error}")
        for cell, error in read.errors.items()
    ]
    problems += _uncalculated(raw, header, uncalculated)
    if problems:
        raise ManifestError(problems, raw.path)
    return header_line, header, records


def _cell_problem(raw: RawManifest, header: list[str], cell: tuple[int, int], message: str) -> Problem:
    """A problem of one cell: its row, and its column's name (or letter, outside the header's columns)."""
    with needs_extra("xlsx", "reading .xlsx"):
        from openpyxl.utils import get_column_letter

    row, column = cell
    letter = get_column_letter(column)
    name = header[column - 1] if column <= len(header) else ""
    return Problem(
        row, None, name or f"column {letter}", f"cell {letter}{row}: {message}", unit="row", sheet=raw.sheet
    )


def _uncalculated(raw: RawManifest, header: list[str], formulas: dict[tuple[int, int], str]) -> list[Problem]:
    hint = (
        "formulas are not calculated here: open and save the file in a spreadsheet program (it saves each "
        "formula's value), or paste the values"
    )
    problems = [
        replace(
            _cell_problem(raw, header, cell, f"the formula {formula[:60]!r} has no saved value"), hint=hint
        )
        for cell, formula in list(formulas.items())[:MAX_FORMULA_PROBLEMS]
    ]
    if len(formulas) > MAX_FORMULA_PROBLEMS:
        more = len(formulas) - MAX_FORMULA_PROBLEMS
        problems.append(Problem(None, None, None, f"and {more:,} more formula cells with no saved value"))
    return problems


def _read_sheet(
    raw: RawManifest,
    data: bytes,
    sheet: str | None,
    bounds: tuple[int, int],
    only: dict[tuple[int, int], str] | None = None,
) -> _Sheet:
    """One pass over the sheet's rows: each formula's text (`formulas`) and every other cell's value; or,
    with `only`, the values saved with the formulas of the cells in `only` (the others empty)."""
    with needs_extra("xlsx", "reading .xlsx"):
        import openpyxl

    with warnings.catch_warnings():
        # openpyxl warns of parts it does not read (data validation, some extensions): cells are read.
        warnings.simplefilter("ignore")
        try:
            book = openpyxl.load_workbook(
                io.BytesIO(data),
                read_only=True,
                data_only=only is not None,
                keep_links=False,
                rich_text=False,
            )
            try:
                ws = _choose_sheet(raw, book, sheet)
                ws.reset_dimensions()  # a wrong <dimension> in the file must not cut rows off
                return _sheet_rows(raw, ws.iter_rows(), bounds, only)
            finally:
                book.close()
        except ManifestError:
            raise
        except Exception as exc:  # a damaged or hostile workbook: openpyxl, zipfile and the XML parser
            # raise many kinds (KeyError, BadZipFile, ParseError, ValueError...); each is the file's fault
            raise _whole_file(raw, f"the workbook cannot be read ({type(exc).__name__}: {exc})") from None


def _choose_sheet(raw: RawManifest, book: Any, sheet: str | None) -> Any:
    """The sheet named `sheet`, else the first visible worksheet; its name goes to `raw.sheet`."""
    if sheet is None:
        shown = [ws for ws in book.worksheets if ws.sheet_state == "visible"]
        if not shown:
            raise _whole_file(raw, "the workbook has no visible worksheet")
        raw.sheet = shown[0].title
        return shown[0]
    if sheet not in book.sheetnames:
        close = difflib.get_close_matches(sheet, book.sheetnames, n=1)
        hint = f"did you mean {close[0]!r}?" if close else None
        names = ", ".join(map(repr, book.sheetnames))
        raise _whole_file(raw, f"the workbook has no sheet {sheet!r}; its sheets are {names}", hint)
    ws = book[sheet]
    if ws not in book.worksheets:
        raise _whole_file(raw, f"sheet {sheet!r} is a chart, not a worksheet")
    raw.sheet = sheet
    return ws


def _sheet_rows(
    raw: RawManifest,
    rows: Iterable[tuple[Any, ...]],
    bounds: tuple[int, int],
    only: dict[tuple[int, int], str] | None,
) -> _Sheet:
    """The rows holding a value (or a formula, or an error), each cut after its last such cell; the
    cells openpyxl makes are counted against the bound before a row's are looked at."""
    max_rows, max_cells = bounds
    read = _Sheet([], {}, {})
    made = 0
    for number, cells in enumerate(rows, start=1):  # gaps come as empty rows: the k-th row is row k
        if number > max_rows:
            raise _whole_file(
                raw, f"sheet {raw.sheet!r} has more than {max_rows:,} rows", "split it over several manifests"
            )
        made += len(cells)
        if made > max_cells:
            raise _whole_file(
                raw,
                f"sheet {raw.sheet!r} spreads over more than {max_cells:,} cells by row {number:,} (each row "
                "counted up to its last cell)",
                _FAR_HINT,
            )
        texts: list[str] = []
        last = 0
        for column, cell in enumerate(cells, start=1):
            value = cell.value
            if value is None or (only is not None and (number, column) not in only):
                texts.append("")
                continue
            last = column
            kind = cell.data_type
            if kind == "f":
                read.formulas[(number, column)] = str(getattr(value, "text", value))
                texts.append("")
            elif kind == "e":
                read.errors[(number, column)] = str(value)
                texts.append("")
            else:
                texts.append(cell_text(value, cell.number_format if kind == "n" else "General"))
        if last:  # a row of empty cells is no job: not kept, so a gap of a million rows costs nothing
            del texts[last:]
            read.rows.append((number, texts))
    return read


# --- Parquet ------------------------------------------------------------------------------------------


def _read_parquet(
    raw: RawManifest, data: bytes, max_bytes: int, bounds: tuple[int, int]
) -> tuple[list[str], list[tuple[int, list[str]]]]:
    with needs_extra("parquet", "reading .parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

    max_rows, max_cells = bounds
    try:
        schema = pq.ParquetFile(pa.BufferReader(data)).schema_arrow
        # Text columns are read as dictionaries, as stored: decoding one would pay for its expansion
        # before it could be measured (a 9 KB file naming one 1 MiB value in 4,000 records: 4 GB).
        text = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
        parquet = pq.ParquetFile(pa.BufferReader(data), read_dictionary=text)
    except (pa.ArrowException, OSError, ValueError, KeyError) as exc:
        raise _whole_file(raw, f"not a Parquet file ({exc})") from None
    with parquet:
        meta = parquet.metadata
        if meta.num_rows > max_rows:
            raise _whole_file(
                raw,
                f"the file has {meta.num_rows:,} rows; at most {max_rows:,}",
                "split it over several manifests",
            )
        if meta.num_rows * len(schema) > max_cells:
            raise _whole_file(
                raw,
                f"the file has {meta.num_rows:,} rows by {len(schema):,} columns; a manifest may have at "
                f"most {max_cells:,} cells",
                "split it over several manifests",
            )
        declared = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if declared >= max_bytes:
            raise _whole_file(
                raw,
                f"the file's data is {declared:,} bytes uncompressed; a manifest must be under {max_bytes:,}",
            )
        problems = [
            Problem(None, None, field.name, message, hint)
            for field in parquet.schema_arrow
            if (found := _column_fault(field.type)) is not None
            for message, hint in [found]
        ]
        if problems:
            raise ManifestError(problems, raw.path)
        keep = [i for i, field in enumerate(schema) if not PANDAS_INDEX.fullmatch(field.name)]
        header = [schema.field(i).name.strip() for i in keep]
        try:
            columns = _parquet_columns(raw, parquet, keep, max_bytes)
        except (pa.ArrowException, OSError) as exc:
            raise _whole_file(raw, f"the Parquet file cannot be read ({exc})") from None
    records = [(number, list(cells)) for number, cells in enumerate(zip(*columns, strict=True), start=1)]
    return header, records


def _parquet_columns(raw: RawManifest, parquet: Any, keep: list[int], max_bytes: int) -> list[list[str]]:
    """The cells of the `keep` columns as text, a batch at a time; each batch's expanded size is added up
    and checked before its cells are made."""
    columns: list[list[str]] = [[] for _ in keep]
    held = read = 0
    for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, use_threads=False):
        held += sum(_expanded_bytes(batch.column(i)) for i in keep)
        if held >= max_bytes:
            raise _whole_file(
                raw,
                f"the file's data exceeds {max_bytes:,} bytes once read (by record "
                f"{read + batch.num_rows:,}; a value repeated through a dictionary counts once per record "
                "naming it)",
                "is it the file you meant? split the catalog over several manifests",
            )
        read += batch.num_rows
        for texts, i in zip(columns, keep, strict=True):
            texts += map(cell_text, batch.column(i).to_pylist())
    return columns


def _expanded_bytes(column: pyarrow.Array) -> int:
    """The bytes `column` holds once decoded: a dictionary's text counted once per index naming it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(column, pa.DictionaryArray):
        return int(column.nbytes)
    values = column.dictionary
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        return int(column.indices.nbytes) + int(values.nbytes)
    lengths = pc.binary_length(values)
    named = pc.sum(pc.take(lengths, column.indices)).as_py() or 0
    return int(column.indices.nbytes) + int(named)


def _column_fault(kind: pyarrow.DataType) -> tuple[str, str | None] | None:
    """Why a Parquet column's type cannot be a manifest column, or None when it can."""
    import pyarrow.types as t

    if t.is_dictionary(kind):
        return _column_fault(kind.value_type)
    accepted: tuple[Callable[[Any], bool], ...] = (
        t.is_string, t.is_large_string, t.is_string_view, t.is_integer, t.is_floating, t.is_decimal,
        t.is_boolean, t.is_date, t.is_time, t.is_timestamp, t.is_null,
    )  # fmt: skip
    if any(accepts(kind) for accepts in accepted):
        return None
    hint = None
    if t.is_list(kind) or t.is_large_list(kind) or t.is_fixed_size_list(kind) or t.is_list_view(kind):
        hint = "write a list (reference_images) as text separated by ';', as in a CSV"
    return f"the column holds {kind} values; a manifest column holds text, numbers, true/false or dates", hint
