"""Review decisions: appended whole, the last one for an image wins, nothing of two writers lost, on a
local folder and on a real S3-compatible server (moto)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from imagebatch.storage.layout import REVIEW_FILE
from imagebatch.storage.location import LocalFolder, Location
from imagebatch.storage.objectstore import ObjectLocation
from imagebatch.work.decisions import (
    MAX_NOTE,
    Decision,
    decided,
    iter_decisions,
    read_decisions,
    record_decision,
)


def _decide(location: Location) -> None:
    first = record_decision(location, Decision("ib1-a", 1, "rejected", note="wrong colour", reviewer="ann"))
    assert first.at.endswith("Z")
    record_decision(location, Decision("ib1-b", 1, "approved", reviewer="bob"))
    record_decision(location, Decision("ib1-a", 1, "cleared", reviewer="ann"))
    record_decision(location, Decision("ib1-a", 1, "approved", reviewer="ann"))
    record_decision(location, Decision("ib1-c", 2, "rejected", note="handle missing ✂", reviewer="ann"))
    record_decision(location, Decision("ib1-b", 1, "cleared", reviewer="bob"))


def _check(location: Location) -> None:
    assert len(list(iter_decisions(location))) == 6
    now = read_decisions(location)
    assert {k: d.decision for k, d in now.items()} == {
        "ib1-a": "approved",
        "ib1-b": "cleared",
        "ib1-c": "rejected",
    }
    assert now["ib1-c"].note == "handle missing ✂" and now["ib1-c"].variant == 2
    assert set(decided(location)) == {"ib1-a", "ib1-c"}


def test_the_last_decision_wins_in_a_folder(tmp_path: Path) -> None:
    folder = LocalFolder(tmp_path)
    _decide(folder)
    _check(folder)
    assert len((tmp_path / REVIEW_FILE).read_text().splitlines()) == 6


def test_the_last_decision_wins_in_a_bucket(s3: Any) -> None:
    name = s3.bucket()
    bucket = ObjectLocation(f"s3://{name}/run")
    _decide(bucket)
    _check(bucket)
    names = sorted(s3.objects(name, "run/review/"))
    assert len(names) == 6 and all(name.endswith(".json") for name in names)


def test_a_torn_line_loses_only_itself(tmp_path: Path) -> None:
    folder = LocalFolder(tmp_path)
    record_decision(folder, Decision("ib1-a", 1, "approved"))
    with (tmp_path / REVIEW_FILE).open("ab") as fh:
        fh.write(b'{"key":"ib1-b","variant":1,"deci')  # a crash mid-write
    record_decision(folder, Decision("ib1-c", 1, "rejected", note="n"))
    with (tmp_path / REVIEW_FILE).open("ab") as fh:
        fh.write(b'{"key":"","decision":"approved"}\n{"key":"ib1-d","decision":"maybe"}\n[1]\n')
    assert set(read_decisions(folder)) == {"ib1-a", "ib1-c"}


def test_an_unknown_decision_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="approved, rejected, cleared"):
        record_decision(LocalFolder(tmp_path), Decision("ib1-a", 1, "maybe"))  # type: ignore[arg-type]
    assert not (tmp_path / REVIEW_FILE).exists()


def _writer(root: str, who: str, n: int) -> None:
    folder = LocalFolder(Path(root))
    for i in range(n):
        record_decision(folder, Decision(f"ib1-{who}-{i}", 1, "approved", note="x" * MAX_NOTE, reviewer=who))


@pytest.mark.slow  # processes of their own
def test_two_writers_at_once_lose_nothing(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), who, 150)) for who in ("ann", "bob")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    decisions = read_decisions(LocalFolder(tmp_path))
    assert len(decisions) == 300 and all(len(d.note) == MAX_NOTE for d in decisions.values())
