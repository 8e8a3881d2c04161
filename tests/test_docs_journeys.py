"""The manual's local examples run as written: each code block marked `<!-- example: NAME -->` in docs/
(the quick start, a first batch, the review-and-delivery loop) is run line by line, on the embedded
emulator, in a folder holding a copy of manifests/examples, and what the page says it leaves is checked.

`imagebatch review` serves until Ctrl-C, so it runs as its own process, as a reviewer starts it: the test
reads its address, takes the token from its page as a browser would, records decisions through its API,
then stops it with SIGINT."""

from __future__ import annotations

import csv
import http.client
import io
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from helpers.runs import cli, read_results
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- example: ([\w-]+) -->\s*\n```\w*\n(.*?)^```", re.M | re.S)
BOUND = 120.0
"""Seconds the review server gets to start or stop: generous, a loaded machine's import time."""


def examples() -> dict[str, list[list[str]]]:
    """Each marked block's `imagebatch` commands, as argv lists (`uv run imagebatch` and comments cut)."""
    blocks: dict[str, list[list[str]]] = {}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for name, body in MARKER.findall(page.read_text()):
            lines = body.replace("\\\n", " ").splitlines()
            argv = [shlex.split(line, comments=True) for line in lines]
            blocks[name] = [a[3:] for a in argv if a[:3] == ["uv", "run", "imagebatch"]]
    return blocks


EXAMPLES = examples()


@pytest.fixture
def here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_harness: str, restore_logging: None
) -> Path:
    """A clone's working folder with manifests/examples, no service address and no key (so `run` uses its
    embedded emulator), as the quick start assumes."""
    shutil.copytree(ROOT / "manifests" / "examples", tmp_path / "manifests" / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("IMAGEBATCH_BASE_URL", raising=False)
    monkeypatch.delenv("IMAGEBATCH_API_KEY", raising=False)
    return tmp_path


def test_the_marked_examples_are_found() -> None:
    assert set(EXAMPLES) == {"quick-start", "first-batch", "review-and-delivery"}
    assert EXAMPLES["quick-start"] == [["run", "manifests/examples/catalog.csv", "--out", "out"]]


def test_the_quick_start(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (argv,) = EXAMPLES["quick-start"]
    code, out, err = cli(capsys, *argv)
    assert code == 0, err
    assert "embedded emulator" in out + err
    rows = read_results(here / "out")
    assert len(rows) == 6 and {r["status"] for r in rows} == {"succeeded"}
    for name in ("results.csv", "usage.jsonl", "usage-summary.csv", "run.json", "report.html"):
        assert (here / "out" / name).is_file(), name
    images = [p for p in (here / "out" / "images").glob("*/*") if p.suffix in (".png", ".jpg")]
    assert {p.parent.name for p in images} == {r["job_id"] for r in rows}  # out/images/<job>/


def test_a_first_batch(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    validate, first, again, report = EXAMPLES["first-batch"]
    assert validate[0] == "validate" and first[0] == again[0] == "run" and report[0] == "report"
    code, out, _ = cli(capsys, *validate)
    assert code == 0 and "valid" in out.splitlines()[0]
    assert cli(capsys, *first)[0] == 0
    assert cli(capsys, *again)[0] == 0
    assert {r["status"] for r in read_results(here / "out")} == {"skipped"}  # nothing sent again
    (here / "out" / "report.html").unlink()
    code, out, _ = cli(capsys, *report)
    assert code == 0 and (here / "out" / "report.html").is_file()


def _post(url: str, token: str, body: dict[str, Any]) -> int:
    """A decision as the review page posts it: its token, its origin, JSON."""
    host = urlsplit(url).netloc
    connection = http.client.HTTPConnection(host, timeout=BOUND)
    headers = {"Content-Type": "application/json", "Origin": f"http://{host}", "X-Review-Token": token}
    connection.request("POST", "/api/decision", json.dumps(body), headers)
    status = connection.getresponse().status
    connection.close()
    return status


def review(argv: list[str], decide: dict[str, tuple[str, str]]) -> None:
    """Run `imagebatch review ...` as a reviewer does and record `decide` ({key: (decision, note)})."""
    command = [sys.executable, "-m", "imagebatch.cli.main", *argv]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("imagebatch review: http://127.0.0.1:"), line
            url = line.split()[2]
            connection = http.client.HTTPConnection(urlsplit(url).netloc, timeout=BOUND)
            connection.request("GET", "/")
            page = connection.getresponse().read().decode()
            connection.close()
            token = re.search(r'<meta name="review-token" content="([^"]+)">', page)
            assert token is not None
            for key, (decision, note) in decide.items():
                body = {"key": key, "decision": decision, "note": note}
                assert _post(url, token.group(1), body) == 200
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=BOUND) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def test_review_redo_and_export(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, review_argv, redo, export = EXAMPLES["review-and-delivery"]
    assert [run[0], review_argv[0], redo[0], export[0]] == ["run", "review", "run", "export"]
    assert cli(capsys, *run)[0] == 0
    out = here / review_argv[1]
    rows = read_results(out)
    rejected = next(r for r in rows if r["sku"] == "SKU-1001")
    decide = {r["idempotency_key"]: ("approved", "") for r in rows}
    decide[rejected["idempotency_key"]] = ("rejected", "make the handle point right")
    review(review_argv, decide)

    code, _, err = cli(capsys, *redo)
    assert code == 0, err
    variants = [r for r in read_results(out) if r["job_id"] == rejected["job_id"]]
    assert sorted(r["variant"] for r in variants) == ["1", "2"]
    assert json.loads((out / "run.json").read_text())["redo"]  # the redo is recorded, edits counted

    code, _, err = cli(capsys, *export)
    assert code == 0, err
    dest = here / export[export.index("--to") + 1]
    delivered = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.jpg"))
    assert len(delivered) == 5  # the rejected product's new variant is not approved yet: left out
    assert "SKU-1002/sage green.jpg" in delivered and not any(p.startswith("SKU-1001/") for p in delivered)
    with Image.open(dest / "SKU-1002" / "sage green.jpg") as image:
        assert image.format == "JPEG" and max(image.size) <= 2000
    listed = list(csv.DictReader(io.StringIO((dest / "export.csv").read_text())))
    assert sorted(r["path"] for r in listed if r["status"] == "delivered") == delivered
    assert [r["sku"] for r in listed if r["status"] == "missing"] == ["SKU-1001"]  # named, and why
