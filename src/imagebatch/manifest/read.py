"""Reading a manifest file (CSV, JSON, JSON Lines, and through `manifest.tables` XLSX or Parquet) into raw
rows that know where they came from.

Nothing here knows the spec: this module turns bytes into `{field: value}` rows with a line number (or a
job index, or a spreadsheet row), and turns unreadable files into clear problems instead of tracebacks.
JSON may nest lists and objects at most `MAX_DEPTH` deep: deeper is refused with its line, before it can
exhaust Python's stack. The tables (CSV, XLSX, Parquet) share one set of header rules (`table_rows`).
XLSX and Parquet readers are imported only for such a file, so that a CSV run never imports them.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .models import Location, ManifestError, ManifestFormat, Problem
from .textfile import TextBlocks

MAX_DEPTH = 32
"""How deep a JSON manifest (the whole document) or a JSON Lines line may nest lists and objects. A job
needs a few levels (`{"jobs": [{"turns": [{"reference_images": [...]}]}]}` is 5); the limit keeps a
hostile file from exhausting the stack of the parser or of the checks after it."""


@dataclass(slots=True)
class RawRow:
    """One job as written, before any checking."""

    line: int
    """Physical line (CSV, JSON Lines), index in `jobs` (JSON), or row (XLSX, Parquet: see `Location`)."""
    unit: Location
    values: dict[str, Any]
    """Column or key -> value; a table's values are always strings ("" for an empty cell)."""


@dataclass(slots=True)
class RawManifest:
    """A manifest file read but not yet checked."""

    path: Path | str
    """The file, or the object's URL."""
    format: ManifestFormat
    sha256: str
    """The file's sha256 (hex); a CSV's or JSON Lines' is set once its rows have all been read."""
    rows: Iterable[RawRow]
    """The rows, in order. A CSV's are read as they are iterated, once (`_csv_rows`): its whole-file
    problems (a row of the wrong length) are raised at the end of the iteration, and a column with no name
    that holds values is added to `problems` then."""
    columns: list[str] | None = None
    """Tables only (CSV, XLSX, Parquet): the header's column names (stripped), in order."""
    header_line: int | None = 1
    """Tables only: the line (CSV) or row (XLSX) of the header; None for Parquet (no header row)."""
    sheet: str | None = None
    """XLSX only: the sheet read."""
    unit: Location = "line"
    """How the rows (and the header) are named: `line` (CSV, JSON Lines), `job` (JSON), `row` (XLSX,
    Parquet)."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """JSON only: the `defaults` object."""
    problems: list[Problem] = field(default_factory=list)
    """Problems found while reading that do not stop the other rows from being checked."""
    may_hold_nul: bool = True
    """False while the text read so far holds no NUL character (nor a JSON escape of one): the rows read so
    far need no NUL check. Set before the rows of the text that holds one are given out."""


def split_sheet(path: Path, format: str | None = None) -> tuple[Path, str | None]:
    """`catalog.xlsx#Products` -> (`catalog.xlsx`, `Products`): a workbook's sheet named after `#` (the
    first `.xlsx#`: a sheet's name may hold `#` too). A path that exists as given is never split (a file
    may have `#` in its name), nor one that names no workbook."""
    name = path.name
    if "#" not in name or path.exists():
        return path, None
    at = name.lower().find(".xlsx#")
    if at >= 0:
        file, sheet = name[: at + 5], name[at + 6 :]
    elif format == "xlsx":
        file, _, sheet = name.rpartition("#")
    else:
        return path, None
    if not file or not sheet:
        return path, None
    return path.with_name(file), sheet


def read_text_manifest(path: Path | str, fmt: ManifestFormat) -> RawManifest:
    """Read a CSV, JSON or JSON Lines manifest `path` (a file, or an object's URL: `sources`) into raw rows;
    raise ManifestError when it cannot be read as a manifest (a workbook or Parquet file: `manifest.tables`;
    the reader of each format: `formats.FORMATS`).

    A CSV's or JSON Lines' rows are read from the file as they are iterated (`textfile.TextBlocks`): what is
    learnt on the way (a NUL character: `may_hold_nul`; the sha256, at the end) is set on the raw manifest
    then. A JSON document is read whole: its parser needs it so."""
    blocks = TextBlocks(path, escapes=fmt != "csv")
    raw = RawManifest(path=path, format=fmt, sha256="", rows=[], may_hold_nul=False)
    if fmt == "json":
        text = "".join(_text(blocks, raw))
        if not text.strip():
            raise ManifestError([Problem(None, None, None, "the manifest is empty")], path)
        _read_json(text, raw)
    elif fmt == "csv":
        _read_csv(_lines(_text(blocks, raw)), raw)
    else:
        raw.rows = _jsonl_rows(_text(blocks, raw), raw)
    return raw


def _text(blocks: TextBlocks, raw: RawManifest) -> Iterator[str]:
    """The blocks of text, each noted on `raw` before it is given out: a NUL character in it, and (after
    the last) the file's sha256."""
    for block in blocks:
        if blocks.nul:
            raw.may_hold_nul = True
        yield block
    assert blocks.sha256 is not None
    raw.sha256 = blocks.sha256


# --- CSV -------------------------------------------------------------------------------------------


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
"""A line with its ending, as `io.StringIO(text, newline="")` gives them (a line ends at `\r\n`, `\r` or
`\n`). A block of text ends at a `\n`, so its lines are the file's."""


_OTHER_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
"""What `str.splitlines` ends a line at besides `\r\n`, `\r` and `\n` (which it ends lines at as `_LINE`
does): a block with none of them splits as `_LINE` splits it."""


def _lines(blocks: Iterable[str]) -> Iterator[str]:
    """The lines of the text in `blocks`, with their endings (`_LINE`). A block with none of the rarer line
    breaks (nearly every file: one scan of the block finds them) is split by `str.splitlines`, and its
    lines reach the csv module without a Python step between them."""
    return itertools.chain.from_iterable(map(_block_lines, blocks))


def _block_lines(block: str) -> list[str]:
    if _OTHER_BREAKS.search(block) is None:
        return block.splitlines(keepends=True)
    return [match.group() for match in _LINE.finditer(block)]


def _csv_records(lines: Iterator[str], path: Path | str) -> Iterator[tuple[int, list[str]]]:
    """Each non-blank record with the physical line it starts on, as the csv module reads them.

    pandas pads short rows silently and reports only the first long one, and it does not know physical
    line numbers once a quoted cell spans lines; the csv module, walked once, knows all of that.
    """
    reader = csv.reader(lines)
    end = 0
    try:
        for record in reader:
            start, end = end + 1, reader.line_num
            # Blank and whitespace-only lines are not rows (pandas skips them too).
            if record and not (len(record) == 1 and not record[0].strip()):
                yield start, record
    except csv.Error as exc:
        raise ManifestError(
            [Problem(reader.line_num, None, None, f"the CSV cannot be read: {exc}")], path
        ) from None


def _read_csv(lines: Iterator[str], raw: RawManifest) -> None:
    """The header read now; the rows as they are iterated (`RawManifest.rows`), unless the header is
    refused: then every record is read now, for every problem of the file at once."""
    records = _csv_records(lines, raw.path)
    first = next(records, None)
    if first is None:
        raise ManifestError([Problem(None, None, None, "the manifest is empty")], raw.path)
    header_line, header = first[0], [h.strip() for h in first[1]]
    fatal: list[Problem] = []
    if len(header) == 1 and ";" in header[0]:
        fatal.append(
            Problem(
                header_line,
                None,
                None,
                f"the header has a single column {header[0]!r}",
                "the file looks separated by ';'; save it with ',' as the separator",
            )
        )
    twice = _named_twice(raw, header_line, header)
    if fatal or twice:
        for _ in _of_length(records, len(header), fatal):
            pass
        raise ManifestError(fatal + twice, raw.path)
    raw.columns = [name for name in header if name]
    raw.header_line = header_line
    raw.rows = _csv_rows(raw, header, records)


def _csv_rows(
    raw: RawManifest, header: list[str], records: Iterator[tuple[int, list[str]]]
) -> Iterator[RawRow]:
    wrong: list[Problem] = []
    yield from _table_records(raw, header, _of_length(records, len(header), wrong))
    if wrong:
        raise ManifestError(wrong, raw.path)


def _of_length(
    records: Iterable[tuple[int, list[str]]], width: int, wrong: list[Problem]
) -> Iterator[tuple[int, list[str]]]:
    """The records with `width` cells; a problem in `wrong` for each of the others."""
    for line, record in records:
        if len(record) == width:
            yield line, record
            continue
        multiline = any("\n" in cell for cell in record)
        wrong.append(
            Problem(
                line,
                None,
                None,
                f"the row has {len(record)} cells but the header has {width} columns",
                "is a quote left open?"
                if multiline
                else "quote cells that contain commas, and give every row as many cells as the header",
            )
        )


def table_rows(
    raw: RawManifest,
    header_line: int | None,
    header: list[str],
    records: list[tuple[int, list[str]]],
    fatal: list[Problem] | None = None,
) -> None:
    """A table's rows (CSV, XLSX, Parquet) into `raw`, by the rules every table shares: a column named
    twice is refused, a nameless column is dropped unless it holds values (reported), and a row of empty
    cells is not a job. Each record has as many cells as the header (strings); `fatal` problems found by
    the caller are raised with the header's. Rows are named in `raw.unit`, on `raw.sheet`."""
    fatal = list(fatal or ()) + _named_twice(raw, header_line, header)
    if fatal:
        raise ManifestError(fatal, raw.path)
    raw.columns = [name for name in header if name]
    raw.header_line = header_line
    raw.rows = list(_table_records(raw, header, records))


def _named_twice(raw: RawManifest, header_line: int | None, header: list[str]) -> list[Problem]:
    """A problem for each column named as an earlier one."""
    seen: dict[str, int] = {}
    problems = []
    for i, name in enumerate(header):
        if name and name in seen:
            problems.append(
                Problem(
                    header_line,
                    None,
                    name,
                    f"column {name!r} appears twice (columns {seen[name] + 1} and {i + 1})",
                    unit=raw.unit,
                    sheet=raw.sheet,
                )
            )
        seen.setdefault(name, i)
    return problems


def _table_records(
    raw: RawManifest, header: list[str], records: Iterable[tuple[int, list[str]]]
) -> Iterator[RawRow]:
    """The rows of `records` that hold a value; once they are all read, a problem in `raw.problems` for
    each column with no name that holds values (at its first)."""
    unit, sheet = raw.unit, raw.sheet
    unnamed = [i for i, name in enumerate(header) if not name]
    first: dict[int, int] = {}
    named = [(i, name) for i, name in enumerate(header) if name]
    for line, record in records:
        # A row of empty cells (`,,,`) is what spreadsheets leave below the data: not a job. (One join and
        # strip per row: a cell holds more than whitespace exactly when the joined cells do.)
        if unnamed:
            for i in unnamed:
                if i not in first and record[i].strip():
                    first[i] = line
            values = {name: record[i] for i, name in named}
            if "".join(values.values()).strip():
                yield RawRow(line, unit, values)
        elif "".join(record).strip():
            yield RawRow(line, unit, dict(zip(header, record, strict=True)))
    # Spreadsheets often export trailing empty columns; only a nameless column with data is a mistake.
    for i in unnamed:
        if i in first:
            message = f"column {i + 1} has no name in the header but holds values"
            raw.problems.append(Problem(first[i], None, None, message, unit=unit, sheet=sheet))


# --- JSON and JSON Lines ------------------------------------------------------------------------------


def _json_problem(exc: json.JSONDecodeError, line: int | None = None) -> Problem:
    where = f" (column {exc.colno})" if line is not None else f" (line {exc.lineno}, column {exc.colno})"
    return Problem(line if line is not None else exc.lineno, None, None, f"not valid JSON: {exc.msg}{where}")


_TOKENS = re.compile(r'"(?:[^"\\]+|\\.)*"?|[\[\]{}]')


def _too_deep(text: str) -> tuple[int, int]:
    """The line and column (1-based) where `text`'s lists and objects first nest deeper than MAX_DEPTH
    (strings skipped); (1, 1) if they never do."""
    depth = 0
    for token in _TOKENS.finditer(text):
        char = token.group()
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                start = token.start()
                line_start = text.rfind("\n", 0, start) + 1
                return text.count("\n", 0, start) + 1, start - line_start + 1
        elif char in "]}":
            depth -= 1
    return 1, 1


def _deeper_than(doc: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests lists and objects more than `limit` deep: level by level, no
    recursion (about 0.1 s for a 100,000-job manifest)."""
    level = [doc] if isinstance(doc, dict | list) else []
    for _ in range(limit):
        deeper: list[Any] = []
        for value in level:
            children = value.values() if isinstance(value, dict) else value
            deeper += [c for c in children if isinstance(c, dict | list)]
        if not deeper:
            return False
        level = deeper
    return bool(level)


class TooDeepError(Exception):
    """A JSON text that nests deeper than MAX_DEPTH; `line` and `column` say where (1-based)."""

    def __init__(self, line: int, column: int) -> None:
        super().__init__(f"nested more than {MAX_DEPTH} deep (line {line}, column {column})")
        self.line, self.column = line, column


def parse_json(text: str) -> Any:
    """`json.loads`, refusing nesting deeper than MAX_DEPTH (`TooDeepError`) rather than raising
    RecursionError (Python's parser recurses) or handing a deep value to checks that may recurse too."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise TooDeepError(*_too_deep(text)) from None
    # No walk when the text has too few brackets to nest that deep (a JSON Lines line, usually).
    if text.count("[") + text.count("{") > MAX_DEPTH and _deeper_than(doc, MAX_DEPTH):
        raise TooDeepError(*_too_deep(text))
    return doc


def _depth_problem(exc: TooDeepError, line: int | None = None) -> Problem:
    return Problem(
        line if line is not None else exc.line,
        None,
        None,
        f"lists and objects are nested more than {MAX_DEPTH} deep (column {exc.column})",
        "a job needs only a few levels; is the file what it should be?",
    )


def _read_json(text: str, raw: RawManifest) -> None:
    try:
        doc = parse_json(text)
    except json.JSONDecodeError as exc:
        raise ManifestError([_json_problem(exc)], raw.path) from None
    except TooDeepError as exc:
        raise ManifestError([_depth_problem(exc)], raw.path) from None
    if isinstance(doc, dict):
        extra = sorted(set(doc) - {"defaults", "jobs"})
        if extra or "jobs" not in doc:
            raise ManifestError(
                [
                    Problem(
                        None,
                        None,
                        None,
                        "a JSON manifest is a list of jobs, or an object with 'jobs' (and optional "
                        f"'defaults'); found keys {', '.join(map(repr, doc)) or '(none)'}",
                    )
                ],
                raw.path,
            )
        defaults = doc.get("defaults")
        defaults = {} if defaults is None else defaults
        if not isinstance(defaults, dict):
            raise ManifestError([Problem(None, None, "defaults", "'defaults' must be an object")], raw.path)
        raw.defaults = defaults
        jobs = doc["jobs"]
    else:
        jobs = doc
    raw.unit = "job"
    if not isinstance(jobs, list):
        raise ManifestError([Problem(None, None, "jobs", "'jobs' must be a list of objects")], raw.path)
    rows: list[RawRow] = []
    raw.rows = rows
    for i, job in enumerate(jobs):
        if isinstance(job, dict):
            rows.append(RawRow(i, "job", job))
        else:
            raw.problems.append(Problem(i, None, None, "a job must be an object", unit="job"))


def _jsonl_rows(blocks: Iterator[str], raw: RawManifest) -> Iterator[RawRow]:
    """Each line's job as the lines are read; a line that is not a job is a problem in `raw.problems`."""
    number, seen = 0, False
    for block in blocks:
        # split on "\n" only: str.splitlines would also split inside strings holding U+2028 and friends.
        lines = block.split("\n")
        if block.endswith("\n"):
            lines.pop()
        for line in lines:
            number += 1
            if not line.strip():
                continue
            seen = True
            if (row := _jsonl_row(number, line, raw)) is not None:
                yield row
    if not seen:
        raise ManifestError([Problem(None, None, None, "the manifest is empty")], raw.path)


def _jsonl_row(number: int, line: str, raw: RawManifest) -> RawRow | None:
    try:
        job = parse_json(line)
    except json.JSONDecodeError as exc:
        raw.problems.append(_json_problem(exc, number))
        return None
    except TooDeepError as exc:
        raw.problems.append(_depth_problem(exc, number))
        return None
    if isinstance(job, dict):
        return RawRow(number, "line", job)
    raw.problems.append(Problem(number, None, None, "each line must be a JSON object (one job)"))
    return None
