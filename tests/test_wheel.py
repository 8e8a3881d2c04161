"""The built distributions: the wheel, installed into a fresh virtual environment outside the repository
with no extra, runs the quick start on its own (`imagebatch init demo && imagebatch run demo/catalog.csv
--out demo/out`) and names the extra an Excel manifest needs; the sdist holds the package, its docs, its
tests and its licence, nothing else.

The wheel's dependencies come from uv's cache (`uv pip install --offline`, pinned by uv.lock): the test
needs no network, and skips, saying so, when the cache lacks one of them."""

from __future__ import annotations

import csv
import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
UV = shutil.which("uv")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(UV is None, reason="uv is not on PATH")]


def _uv(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(UV), *map(str, args)], cwd=cwd, capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("dist")
    done = _uv("build", "--out-dir", out)
    assert done.returncode == 0, done.stderr
    yield out


def test_the_sdist_holds_the_package_docs_tests_and_licence(dist: Path) -> None:
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]
    tops = {name.split("/")[0] for name in names}
    assert tops == {
        "src", "docs", "tests", "manifests", "bench", "LICENSE", "README.md", "CHANGELOG.md",
        "CONTRIBUTING.md", "pyproject.toml", "mkdocs.yml", "PKG-INFO", ".gitignore",
    }  # fmt: skip
    assert [n for n in names if n.startswith("bench/")] == ["bench/README.md"]  # the docs include it
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheel_names_its_licence_and_its_addresses(dist: Path) -> None:
    """What `pip show imagebatch` shows (pip 25 and later: License-Expression, and Home-page from the
    Homepage URL; `pip show -v` lists every Project-URL)."""
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
        assert f"imagebatch-{PROJECT_VERSION}.dist-info/licenses/LICENSE" in archive.namelist()
    assert metadata["License-Expression"] == "Apache-2.0"
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Repository", "Issues", "Changelog"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())
    assert metadata["Requires-Python"] and metadata.get_all("Provides-Extra")


def _clean_env(home: Path) -> dict[str, str]:
    """A stranger's environment: no service configured (the embedded emulator), Prefect's home their own."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("IMAGEBATCH_", "PREFECT_", "VIRTUAL_ENV"))
    }
    return env | {"PREFECT_HOME": str(home / ".prefect")}


def test_the_wheel_runs_the_quick_start_outside_the_repository(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    venv, requirements = tmp_path / "venv", tmp_path / "requirements.txt"
    exported = _uv(
        "export", "--frozen", "--no-default-groups", "--no-hashes", "--no-emit-project", "-o", requirements
    )
    assert exported.returncode == 0, exported.stderr
    assert _uv("venv", "--python", sys.executable, venv).returncode == 0
    installed = _uv(
        "pip", "install", "--offline", "--python", venv / "bin" / "python", "-r", requirements, wheel
    )
    if installed.returncode != 0:
        pytest.skip(f"the wheel's dependencies are not all in uv's cache: {installed.stderr.strip()[-300:]}")
    command, env = venv / "bin" / "imagebatch", _clean_env(tmp_path)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(command), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )

    assert run("--version").stdout == f"imagebatch {PROJECT_VERSION}\n"
    assert run("init", "demo").returncode == 0
    done = run("run", "demo/catalog.csv", "--out", "demo/out")
    assert done.returncode == 0, done.stderr
    assert "embedded emulator" in done.stderr + done.stdout
    with (tmp_path / "demo" / "out" / "results.csv").open() as table:
        rows = list(csv.DictReader(table))
    assert len(rows) == 6 and {row["status"] for row in rows} == {"succeeded"}
    assert all((tmp_path / "demo" / "out" / row["paths"]).is_file() for row in rows)
    _workbook(tmp_path / "m.xlsx")
    refused = run("validate", "m.xlsx")  # installed without extras
    assert (refused.returncode, refused.stdout) == (2, "")
    assert (
        refused.stderr
        == "imagebatch validate: reading .xlsx needs the xlsx extra: pip install 'imagebatch[xlsx]'\n"
    )


def _workbook(path: Path) -> None:
    import openpyxl  # this environment's: the tests have every extra

    book = openpyxl.Workbook()
    book.active.append(["id", "prompt"])
    book.active.append(["a", "a red mug"])
    book.save(path)
