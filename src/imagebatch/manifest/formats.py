"""The manifest formats, in one table: each format's file suffixes, its reader, the extra that reader needs,
whether its rows are a header's columns, and whether it can be read from a bucket.

Everything that names the formats reads them here: choosing a format by suffix (`detect_format`), the
command line's `--format` choices, `load.read_raw`'s choice of reader. `models.ManifestFormat` is the
same names as a type (a test keeps the two equal).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from .models import ManifestError, ManifestFormat, Problem

if TYPE_CHECKING:
    from .read import RawManifest

Reader = Callable[[Path | str, ManifestFormat, str | None], "RawManifest"]
"""(path or object's URL, format, sheet) -> raw rows, or ManifestError."""


def _read_text(path: Path | str, fmt: ManifestFormat, sheet: str | None) -> RawManifest:
    from .read import read_text_manifest

    return read_text_manifest(path, fmt)


def _read_table(path: Path | str, fmt: ManifestFormat, sheet: str | None) -> RawManifest:
    # Imported only for such a file: a CSV run loads no table reader (tested).
    from .tables import read_table

    assert isinstance(path, Path)  # `local` below: never an object's URL
    return read_table(path, fmt, sheet)


@dataclass(frozen=True, slots=True)
class Format:
    """One manifest format."""

    name: ManifestFormat
    suffixes: tuple[str, ...]
    """The file suffixes that mean this format (lower case; a file's suffix is compared in any case)."""
    read: Reader
    extra: str | None
    """The extra (pyproject.toml's optional dependencies) its reader needs; None for the core."""
    table: bool
    """Rows are a header's columns, every value text (the CSV rules: `read.table_rows`)."""
    local: bool
    """Read from a local file only (a workbook's or Parquet file's reader needs the whole file at hand)."""


FORMATS: dict[ManifestFormat, Format] = {
    f.name: f
    for f in (
        Format("csv", (".csv",), _read_text, None, table=True, local=False),
        Format("json", (".json",), _read_text, None, table=False, local=False),
        Format("jsonl", (".jsonl", ".ndjson"), _read_text, None, table=False, local=False),
        Format("xlsx", (".xlsx",), _read_table, "xlsx", table=True, local=True),
        Format("parquet", (".parquet",), _read_table, "parquet", table=True, local=True),
    )
}
"""Every manifest format, by name, in the order the manual lists them."""

FORMAT_NAMES: tuple[ManifestFormat, ...] = tuple(FORMATS)
SUFFIXES: dict[str, ManifestFormat] = {suffix: f.name for f in FORMATS.values() for suffix in f.suffixes}


def detect_format(path: Path | str, format: str | None = None) -> ManifestFormat:
    """The format named by `format`, else by the file's (or object's) suffix; ManifestError otherwise."""
    if format is not None:
        for name in FORMAT_NAMES:
            if name == format:
                return name
        why = f"unknown manifest format {format!r}"
        raise ManifestError([Problem(None, None, None, why, f"one of {', '.join(FORMAT_NAMES)}")], path)
    suffix = PurePosixPath(str(path)).suffix
    try:
        return SUFFIXES[suffix.lower()]
    except KeyError:
        *first, last = SUFFIXES
        why = f"cannot tell the manifest format from the extension {suffix or '(none)'!r}"
        hint = f"use {', '.join(first)} or {last}"
        raise ManifestError([Problem(None, None, None, why, hint)], path) from None
