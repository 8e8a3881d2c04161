"""The manual's walkthroughs run as a reader follows them: every code block marked `<!-- example: NAME -->`
(tests/helpers/walkthroughs.py) runs, command by command, in the order of the pages in mkdocs.yml's nav,
all in one folder holding a copy of manifests/examples, on the embedded emulator; after each block, what
the page says it leaves (and the figures it claims) is checked against what the reader now has. The
README's blocks run the same way in a folder of their own. Every shell block of a page that runs
`imagebatch` is either marked and run here (or in tests/test_docs_nightly.py, which needs a Prefect
server) or says why not (`<!-- not run: REASON -->`).

`imagebatch review` serves until Ctrl-C, so it runs as its own process, as a reviewer starts it: the test
reads its address, takes the token from its page as a browser would, approves every image but SKU-1001's
(rejected, with a note) through its API, then stops it with SIGINT."""

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from helpers.runs import cli, read_results, summary_counts
from helpers.walkthroughs import SHELLS, Block, examples, imagebatch_argv, walkthrough_blocks
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
BOUND = 120.0
"""Seconds the review server gets to start or stop: generous, a loaded machine's import time."""
OWN_TEST = {"nightly": "tests/test_docs_nightly.py, with a Prefect server and a worker"}
"""Marked blocks that a test of their own runs."""
NOT_HERE = (["uv", "run", "pytest"],)
"""Commands a walkthrough shows that the tests cannot run inside themselves: the tests."""
EXAMPLES = examples()


@dataclass
class Reader:
    """A reader's working folder and what each command of the block just followed printed."""

    here: Path
    outputs: list[tuple[list[str], str]] = field(default_factory=list)

    def printed(self, sub: str) -> list[str]:
        return [out for argv, out in self.outputs if argv[0] == sub]


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


def test_every_shell_block_that_runs_imagebatch_is_run_or_says_why() -> None:
    unmarked = [
        b.where
        for b in walkthrough_blocks()
        if (b.lang in SHELLS or not b.lang) and re.search(r"(?m)^\s*(uv run\b.*)?imagebatch ", b.body)
        if not (b.marker == "example" or (b.marker == "not run" and len(b.label) > 10))
    ]
    assert not unmarked, "mark each `<!-- example: NAME -->` (and check it here) or `<!-- not run: WHY -->`"


def test_each_example_is_named_once() -> None:
    names = [b.label for b in walkthrough_blocks() if b.marker == "example"]
    assert len(names) == len(set(names)), names


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


def a_reviewer(out: Path) -> dict[str, tuple[str, str]]:
    """Every image approved but SKU-1001's, rejected with a note (the handle)."""
    return {
        r["idempotency_key"]: ("rejected", "make the handle point right")
        if r["sku"] == "SKU-1001"
        else ("approved", "")
        for r in read_results(out)
    }


def follow(block: Block, reader: Reader, capsys: pytest.CaptureFixture[str]) -> None:
    """Every command of `block`, in order, as the reader types it; each must succeed."""
    reader.outputs.clear()
    for argv in block.commands():
        if argv in NOT_HERE:
            continue
        args = imagebatch_argv(argv)
        assert args is not None, f"{block.where}: a command this test cannot follow: {argv}"
        if args[0] == "review":
            review(args, a_reviewer(reader.here / args[1]))
            continue
        code, out, err = cli(capsys, *args)
        assert code == 0, f"{block.where}: imagebatch {shlex.join(args)} exited {code}\n{err}"
        reader.outputs.append((args, out + err))


def claimed(block: Block) -> list[str]:
    """The lines of output a block shows as comments (`# exported 6 images to shop: ...`): its claims."""
    return [line.lstrip("# ") for line in block.body.splitlines() if re.match(r"#\s*\w+ \d+ \w+", line)]


# What each marked block leaves, checked right after the reader followed it.


def quick_start(reader: Reader) -> None:
    out = reader.here / "out"
    (printed,) = reader.printed("run")
    assert "embedded emulator" in printed
    rows = read_results(out)
    assert len(rows) == 6 and {r["status"] for r in rows} == {"succeeded"}
    for name in ("results.csv", "usage.jsonl", "usage-summary.csv", "run.json", "report.html"):
        assert (out / name).is_file(), name
    images = [p for p in (out / "images").glob("*/*") if p.suffix in (".png", ".jpg")]
    assert {p.parent.name for p in images} == {r["job_id"] for r in rows}  # out/images/<job>/


def first_batch(reader: Reader) -> None:
    validated, *runs = reader.printed("validate") + reader.printed("run")
    assert validated.startswith("manifests/examples/catalog.csv: valid")
    assert len(runs) == 2 and all(summary_counts(r) == {"skipped": 6} for r in runs)  # the quick start's
    # Without a Prefect server of the reader's own, Prefect is not even started then: the session's
    # harness is one, so tests/run/test_nothing_to_send.py checks that.
    assert reader.printed("report") == ["out/report.html\n"]


def own_manifest(reader: Reader) -> None:
    rows = read_results(reader.here / "out" / "mine")
    assert [(r["sku"], r["status"]) for r in rows] == [("SKU-1001", "succeeded"), ("SKU-1002", "succeeded")]


def validated(reader: Reader) -> None:
    (printed,) = reader.printed("validate")
    assert re.match(r"manifests/examples/\S+: valid", printed), printed


def review_loop(reader: Reader) -> None:
    out = reader.here / "out" / "catalog"
    rejected = next(r for r in read_results(out) if r["sku"] == "SKU-1001")
    variants = [r for r in read_results(out) if r["job_id"] == rejected["job_id"]]
    assert sorted(r["variant"] for r in variants) == ["1", "2"]
    assert json.loads((out / "run.json").read_text())["redo"]  # the redo is recorded, edits counted
    delivered = _delivered(reader.here / "deliver")
    assert len(delivered) == 5  # the rejected product's new variant is not approved yet: left out
    assert "SKU-1002/sage green.jpg" in delivered and not any(p.startswith("SKU-1001/") for p in delivered)
    with Image.open(reader.here / "deliver" / "SKU-1002" / "sage green.jpg") as image:
        assert image.format == "JPEG" and max(image.size) <= 2000
    listed = list(csv.DictReader(io.StringIO((reader.here / "deliver" / "export.csv").read_text())))
    assert sorted(r["path"] for r in listed if r["status"] == "delivered") == delivered
    assert [r["sku"] for r in listed if r["status"] == "missing"] == ["SKU-1001"]  # named, and why


def redo_again(reader: Reader) -> None:
    """After the loop, the newest variant of the rejected image is unreviewed: a redo sends nothing."""
    assert [summary_counts(p) for p in reader.printed("run")] == [{"skipped": 7}] * 2
    assert len(read_results(reader.here / "out" / "catalog")) == 7


def export(reader: Reader) -> None:
    first, approved = reader.printed("export")
    assert approved.startswith("exported 5 images to approved: 5 written")
    (claim, *_) = claimed(EXAMPLES["export"])
    assert claim in first  # "exported 6 images to shop: 6 written, 0 unchanged; ..."
    assert len(_delivered(reader.here / "shop")) == 6
    assert "cobalt blue" in "".join(_delivered(reader.here / "shop"))  # SKU-1001's redone variant
    assert _delivered(reader.here / "approved") == _delivered(reader.here / "deliver")


def cost(reader: Reader) -> None:
    plan, *_ = reader.printed("validate")
    assert "most this run can cost" in plan and "total                    0.00 USD" in plan  # all done
    assert [summary_counts(p) for p in reader.printed("run")] == [{"skipped": 6}]


def readme_first_batch(reader: Reader) -> None:
    validated(reader)
    assert [summary_counts(p) for p in reader.printed("run")] == [{"skipped": 6}]  # the quick start's


def readme_review(reader: Reader) -> None:
    assert [summary_counts(p) for p in reader.printed("run")] == [
        {"skipped": 6, "succeeded": 1}
    ]  # SKU-1001 v2
    delivered = _delivered(reader.here / "deliver")
    assert len(delivered) == 5 and not any(p.startswith("SKU-1001/") for p in delivered)


def _delivered(dest: Path) -> list[str]:
    return sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.jpg"))


def csv_above(block: Block, reader: Reader) -> None:
    """The manifest the page shows above the block, saved as the block's comment says."""
    page = (ROOT / block.page).read_text().splitlines()
    above = "\n".join(page[: block.line])
    rows = re.findall(r"```csv\n(.*?)```", above, re.S)[-1]
    (reader.here / "my-catalog.csv").write_text(rows)


CHECKS: dict[str, Callable[[Reader], None]] = {
    "quick-start": quick_start,
    "first-batch": first_batch,
    "own-manifest": own_manifest,
    "check-a-manifest": validated,
    "check-the-names": validated,
    "review-and-delivery": review_loop,
    "redo": redo_again,
    "export": export,
    "cost": cost,
    "readme-quick-start": quick_start,
    "readme-first-batch": readme_first_batch,
    "readme-review": readme_review,
}
BEFORE: dict[str, Callable[[Block, Reader], None]] = {"own-manifest": csv_above}


def test_each_example_has_a_check() -> None:
    assert set(EXAMPLES) - set(OWN_TEST) == set(CHECKS)


@pytest.mark.parametrize("book", ["the manual", "the README"])
def test_a_reader_follows_every_walkthrough_in_order(
    book: str, here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reader = Reader(here)
    followed = []
    for name, block in EXAMPLES.items():
        if name in OWN_TEST or (block.page == "README.md") != (book == "the README"):
            continue
        BEFORE.get(name, lambda *_: None)(block, reader)
        follow(block, reader, capsys)
        CHECKS[name](reader)
        followed.append(name)
    assert followed and followed[0].endswith("quick-start")
