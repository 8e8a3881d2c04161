"""The cells of the CSV files people open in a spreadsheet (results.csv, usage-summary.csv): written so
that no cell runs as a formula, and read back to the original values.

Metadata values and model names come from a manifest someone else may have written: `=HYPERLINK(...)`
or `=cmd|' /C calc'!A0` in a cell would run when the file is opened. One pair of functions does it for
every writer and reader, so that what a program reads back is what was written.
"""

from __future__ import annotations

import contextlib
import csv
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

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


def write_csv(fh: IO[str], columns: Iterable[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """A CSV table, header and cells through `csv_cell`; a column a row lacks is an empty cell."""
    names = list(columns)
    writer = csv.writer(fh, lineterminator="\n")
    writer.writerow([csv_cell(c) for c in names])
    for row in rows:
        writer.writerow([csv_cell(row.get(c)) for c in names])


def read_csv(path: Path | IO[str]) -> Iterator[dict[str, str]]:
    """The rows of a CSV file `write_csv` wrote (a path, or a text stream opened with `newline=""`, such
    as an object's bytes in `io.StringIO`), header and cells as they were before `csv_cell`."""
    opened = (
        path.open(newline="", encoding="utf-8") if isinstance(path, Path) else contextlib.nullcontext(path)
    )
    with opened as fh:
        reader = csv.reader(fh)
        header = [csv_value(c) for c in next(reader, [])]
        for cells in reader:
            yield dict(zip(header, (csv_value(c) for c in cells), strict=False))
