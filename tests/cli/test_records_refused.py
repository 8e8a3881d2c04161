"""Every command that reads OUT's records, attacked through them: a record that is a FIFO (no writer will
ever come), or a link to `/dev/zero` (a read without end). Each command runs as a real process with a
generous bound; each must end promptly with one line naming the file on stderr, exit 2, no traceback.
Before the bounded reader, export, report, review and `validate --out` waited on the FIFO forever and
read `/dev/zero` until memory ran out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import cli

from imagebatch.storage.bounded import MAX_RECORD_LINE_BYTES
from imagebatch.work.store import OutputStore, RequestRecord

pytestmark = pytest.mark.slow  # each case starts the command in a process of its own (seconds)

BOUND = 60.0
"""Seconds a command is given: far longer than a refusal takes, far shorter than forever."""


def _out(tmp_path: Path) -> Path:
    """An output folder as a finished run leaves it (results.csv, run.json, the journal)."""
    out = tmp_path / "out"
    out.mkdir()
    store = OutputStore(out)
    record = RequestRecord("mug", 0, 0, "failed", "compat-image-2", "images", "key-0", error="503")
    store.write_results([record.to_row()], [])
    store.journal("outcome", **record.to_row())
    store.backend.sync()
    store.write_run({"state": "finished"})
    return out


def _command(name: str, out: Path, tmp_path: Path) -> list[str]:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "mug", "prompt": "a mug", "model": "compat-image-2"}) + "\n")
    return {
        "export": ["export", str(out), "--to", str(tmp_path / "dest")],
        "report": ["report", str(out)],
        "review": ["review", str(out), "--port", "0"],
        "validate": ["validate", str(manifest), "--out", str(out)],
        "run": ["run", str(manifest), "--out", str(out)],
    }[name]


def _refused(argv: list[str], record: Path) -> None:
    env = {**os.environ, "IMAGEBATCH_REVIEWER": "ana"}
    done = subprocess.run(
        [sys.executable, "-m", "imagebatch.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=BOUND,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and str(record) in lines[0] and "not read" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_journal_line_over_the_bound(tmp_path: Path, command: str) -> None:
    """A rerun's replay (and what `validate --out` forecasts from) refuses a line it would have to hold
    whole, naming the file and the line."""
    out = _out(tmp_path)
    with (out / "journal.jsonl").open("ab") as fh:
        fh.write(b'{"pad": "' + b"x" * MAX_RECORD_LINE_BYTES + b'"}\n')
    _refused(_command(command, out, tmp_path), out / "journal.jsonl")


READERS = [
    ("export", "results.csv"),
    ("report", "results.csv"),
    ("review", "results.csv"),
    ("review", "review.jsonl"),  # the decisions the page starts from
    ("validate", "journal.jsonl"),
    ("run", "journal.jsonl"),  # refused before Prefect starts: nothing sent
]


@pytest.mark.parametrize(("command", "record"), READERS)
def test_a_record_that_is_a_fifo(tmp_path: Path, command: str, record: str) -> None:
    out = _out(tmp_path)
    (out / record).unlink(missing_ok=True)
    os.mkfifo(out / record)
    _refused(_command(command, out, tmp_path), out / record)


@pytest.mark.parametrize(("command", "record"), READERS)
def test_a_record_linked_to_dev_zero(tmp_path: Path, command: str, record: str) -> None:
    out = _out(tmp_path)
    (out / record).unlink(missing_ok=True)
    (out / record).symlink_to("/dev/zero")
    _refused(_command(command, out, tmp_path), out / record)


@pytest.mark.usefixtures("restore_logging")
def test_a_journal_line_over_the_bound_stops_the_flow_before_it_sends(
    tmp_path: Path, service_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a Prefect server configured, the flow itself replays the journal: its refusal ends the command
    with its line (last, after Prefect's own log of the flow's failure) and exit 2; nothing is sent."""
    out = _out(tmp_path)
    with (out / "journal.jsonl").open("ab") as fh:
        fh.write(b'{"pad": "' + b"x" * MAX_RECORD_LINE_BYTES + b'"}\n')
    code, _, err = cli(capsys, *_command("run", out, tmp_path))
    why = "has a line over 1,048,576 bytes (line 2): not read"
    assert code == 2 and err.strip().splitlines()[-1] == f"{out / 'journal.jsonl'} {why}", err
    assert service_env.requests() == []
