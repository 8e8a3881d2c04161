"""Loading a manifest: read it, check every row, and return the Manifest or every problem at once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .check import JobChecker
from .models import Manifest, ManifestError, ManifestFormat, Problem
from .read import read_raw, split_sheet


def files_roots(folders: Sequence[str | Path] | None, path: Path | None = None) -> tuple[Path, ...]:
    """The operator's extra files roots (--files-root, a deployment's `files_root`), resolved (`~`, `..`,
    symlinks; relative to the working folder); ManifestError for one that is not a folder."""
    roots: list[Path] = []
    problems: list[Problem] = []
    for folder in folders or ():
        text = str(folder)
        if "\x00" in text or not text.strip():
            problems.append(Problem(None, None, None, f"files root {text!r} is not a folder name"))
            continue
        root = Path(text).expanduser().resolve()
        if not root.is_dir():
            problems.append(Problem(None, None, None, f"files root {text} ({root}) is not a folder"))
        else:
            roots.append(root)
    if problems:
        raise ManifestError(problems, path)
    return tuple(roots)


def load_manifest(
    path: str | Path,
    *,
    format: ManifestFormat | None = None,
    files_root: Sequence[str | Path] | None = None,
    sheet: str | None = None,
) -> Manifest:
    """Read and check a manifest; raise ManifestError with every problem found, or return it.

    `format` overrides the format the extension implies. Relative file paths in the manifest resolve
    against the manifest's folder. Each referenced file is read once, whatever the number of rows.
    Every reference image and mask must resolve inside the manifest's folder or one of `files_root`
    (the operator's choice), or inside the narrower folders of the manifest's own `defaults.files_root`.

    A workbook's sheet is `sheet`, or named after `#` in `path` (`catalog.xlsx#Products`), else its first
    visible sheet (`manifest.tables`).
    """
    path, named = split_sheet(Path(path).absolute(), format)
    roots = files_roots(files_root, path)
    raw = read_raw(path, format, sheet if sheet is not None else named)
    checker = JobChecker(raw, path.parent, roots)
    jobs = [job for row in raw.rows if (job := checker.check(row)) is not None]
    problems = raw.problems + checker.problems
    if not raw.rows and not problems:
        problems.append(Problem(None, None, None, "the manifest has no jobs"))
    if problems:
        raise ManifestError(problems, path)
    return Manifest.model_construct(
        path=path,
        sha256=raw.sha256,
        format=raw.format,
        jobs=jobs,
        metadata_columns=checker.metadata_columns,
        sheet=raw.sheet,
    )
