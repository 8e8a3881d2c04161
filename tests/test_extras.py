"""The optional dependencies: the core runs CSV and JSON into a folder without them, and a manifest or a
location that needs a missing extra is refused in one line naming it (exit 2). A missing module is made
missing for real: None in sys.modules makes Python's import raise ModuleNotFoundError, as when it is not
installed."""

from __future__ import annotations

import re
import sys
from importlib.metadata import requires
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import cli

import imagebatch
import imagebatch.delivery
from imagebatch.extras import EXTRAS, MissingExtra
from imagebatch.run.exit_codes import EXIT_USAGE

FIXTURE = Path(__file__).parent / "fixtures" / "output-1.0" / "out"


def _table(path: Path) -> Path:
    """A one-row manifest in the format of path's suffix, written with the format's own library."""
    if path.suffix == ".xlsx":
        import openpyxl

        book = openpyxl.Workbook()
        book.active.append(["id", "prompt"])
        book.active.append(["a", "a red mug"])
        book.save(path)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": ["a"], "prompt": ["a red mug"]}), path)
    return path


def uninstall(monkeypatch: pytest.MonkeyPatch, top: str) -> None:
    """`top` and its loaded submodules unimportable for the test, as if not installed."""
    for name in [n for n in sys.modules if n == top or n.startswith(f"{top}.")] + [top]:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize(("suffix", "extra"), [(".xlsx", "xlsx"), (".parquet", "parquet")])
def test_a_manifest_whose_reader_is_missing_is_refused_naming_the_extra(
    suffix: str, extra: str, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = _table(tmp_path / f"m{suffix}")
    uninstall(monkeypatch, EXTRAS[extra])
    code, out, err = cli(capsys, "validate", str(manifest))
    assert (code, out) == (EXIT_USAGE, "")
    assert err.splitlines() == [
        f"imagebatch validate: reading {suffix} needs the {extra} extra: pip install 'imagebatch[{extra}]'"
    ]


def test_an_object_store_without_the_s3_extra_is_refused_naming_it(
    capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    uninstall(monkeypatch, "obstore")
    code, out, err = cli(capsys, "report", "s3://bucket/prefix")
    assert (code, out) == (EXIT_USAGE, "")
    assert err.splitlines() == [
        "imagebatch report: --out s3://bucket/prefix: an object store location (s3://) needs the s3 extra: "
        "pip install 'imagebatch[s3]'"
    ]


def test_the_notebook_api_without_pandas_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    uninstall(monkeypatch, "pandas")
    monkeypatch.delitem(sys.modules, "imagebatch.delivery.frames", raising=False)  # imported afresh
    monkeypatch.delattr(imagebatch.delivery, "frames", raising=False)
    with pytest.raises(MissingExtra, match=re.escape("pip install 'imagebatch[notebook]'")):
        imagebatch.results(FIXTURE)


def test_the_core_requires_no_extra_and_all_holds_every_one() -> None:
    """The installed metadata: the core without the extras' modules, `all` the union of the others."""
    by_extra: dict[str, set[str]] = {}
    for requirement in requires("imagebatch") or []:
        name = re.split(r"[<>=!~ ;\[]", requirement)[0]
        marker = re.search(r"extra == [\"'](\w+)[\"']", requirement)
        by_extra.setdefault(marker.group(1) if marker else "", set()).add(name)
    assert not by_extra[""] & set(EXTRAS.values())
    assert {"prefect", "pillow", "httpx"} <= by_extra[""]
    assert {extra: by_extra[extra] for extra in EXTRAS} == {
        extra: {module} for extra, module in EXTRAS.items()
    }
    assert by_extra["all"] == set(EXTRAS.values())
