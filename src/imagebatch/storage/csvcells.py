"""The cells of the CSV files people open in a spreadsheet (results.csv, usage-summary.csv): written so
that no cell runs as a formula, and read back to the original values.

Metadata values and model names come from a manifest someone else may have written: `=HYPERLINK(...)`
or `=cmd|' /C calc'!A0` in a cell would run when the file is opened. One pair of functions does it for
every writer and reader, so that what a program reads back is what was written.
"""

from __future__ import annotations

import contextlib
import csv
import io
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from imagebatch.storage.bounded import BadLine, open_record

FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r", "\n")
"""A cell starting with one of these may be run as a formula by a spreadsheet (OWASP, "CSV Injection")."""
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def csv_cell(value: Any) -> str:
    """`value` as a cell of a CSV file people open in a spreadsheet: never run as a formula.

    A text starting with `=`, `+`, `-`, `@`, a tab or a line break gets a leading `'` (OWASP's advice), so
    a spreadsheet shows it as text; a plain number (`-3`, `+1.5`, `-2e3`) is left alone, as it is a number
    and nothing else. A text already starting with `'` gets one more, so `csv_value` always reads back the
    original value exactly. None is an empty cell."""
    text = "" if value is None else str(value)
    if (text.startswith(FORMULA_TRIGGERS) and not _PLAIN_NUMBER.fullmatch(text)) or text.startswith("'"):
        return "'" + text
    return text


def csv_value(cell: str) -> str:
    """The original value of a cell `csv_cell` wrote (its one leading `'` removed)."""
    return cell[1:] if cell.startswith("'") else cell


_NEEDS_QUOTES = re.compile(r'[,"\r\n]')


def csv_line(cells: Iterable[str]) -> str:
    """One line of CSV, `\n`-terminated: a cell holding a comma, a quote, a CR or an LF is quoted.

    Python's `csv.writer` quotes only the characters of its own line terminator, so with `\n` a bare CR
    would go out unquoted and every reader (Excel, pandas, ours) split the row there."""
    return (
        ",".join(f'"{c.replace(chr(34), chr(34) * 2)}"' if _NEEDS_QUOTES.search(c) else c for c in cells)
        + "\n"
    )


def write_csv(fh: IO[str], columns: Iterable[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """A CSV table, header and cells through `csv_cell`; a column a row lacks is an empty cell. The one
    CSV writer of the project: every file it writes (results, usage summary, export.csv) goes through it."""
    names = list(columns)
    fh.write(csv_line(csv_cell(c) for c in names))
    for row in rows:
        fh.write(csv_line(csv_cell(row.get(c)) for c in names))


def _open_text(path: Path) -> IO[str]:
    """A CSV file opened through `storage.bounded` (a FIFO or a device refused, never waited on)."""
    fh = open_record(path)
    if fh is None:
        raise FileNotFoundError(f"{path}: no such file")
    return io.TextIOWrapper(fh, encoding="utf-8", newline="")


def read_csv(
    path: Path | IO[str], columns: Iterable[str] = (), bad: BadLine | None = None
) -> Iterator[dict[str, str]]:
    """The rows of a CSV file `write_csv` wrote (a path, or a text stream opened with `newline=""`, such
    as an object's bytes in `io.StringIO`), header and cells as they were before `csv_cell`.

    Each row has every column of the header and every one of `columns` (empty when absent): a file another
    tool wrote, or cut short, may lack cells or columns, and a reader must not fail on a missing key.
    Cells beyond the header are dropped. With `bad`, a row the csv module refuses (a cell over its
    field limit, 128 KiB) is skipped and `bad` told the line it ended on; without, `csv.Error` goes on."""
    opened = _open_text(path) if isinstance(path, Path) else contextlib.nullcontext(path)
    with opened as fh:
        reader = csv.reader(fh)
        header = [csv_value(c) for c in next(reader, [])]
        blank = dict.fromkeys([*header, *columns], "")
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error:
                if bad is None:
                    raise
                bad(reader.line_num)  # the reader starts afresh at the next line
                continue
            if cells:  # a blank line is no row
                yield blank | dict(zip(header, (csv_value(c) for c in cells), strict=False))
