"""The optional dependencies (pyproject.toml's extras) and the one line a user reads when a manifest or
a location needs one that is not installed: "reading .xlsx needs the xlsx extra: pip install
'imagebatch[xlsx]'" (exit 2, nothing sent or written: the commands check manifests and locations first).

The core reads CSV, JSON and JSON Lines into a local folder on Prefect, with the emulator; an Excel sheet
needs `xlsx` (openpyxl), a Parquet file `parquet` (pyarrow), an object store `s3` (obstore, which also
speaks gs:// and az://), the notebook API `imagebatch.results()` `notebook` (pandas); `all` is every one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from imagebatch.errors import Refusal

EXTRAS = {"xlsx": "openpyxl", "parquet": "pyarrow", "s3": "obstore", "notebook": "pandas"}
"""Each extra and the module whose absence means it is not installed."""


class MissingExtra(ValueError, Refusal):
    """A manifest or a location needs an extra that is not installed; the message is the whole line. A
    ValueError, as a location's other refusals are, so that a check that names the location says it too."""

    def __init__(self, extra: str, needs: str) -> None:
        super().__init__(f"{needs} needs the {extra} extra: pip install 'imagebatch[{extra}]'")
        self.extra = extra


@contextmanager
def needs_extra(extra: str, needs: str) -> Iterator[None]:
    """Around the import of an extra's module: its absence raises `MissingExtra` saying what `needs` it."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != EXTRAS[extra]:
            raise
        raise MissingExtra(extra, needs) from None
