"""The output folder on a real file system that refuses writes: full (a small tmpfs) or read-only, checked
before Prefect starts where it can be, reported in one line where it cannot (issue 13 #2, #6)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import cli, read_results, summary_counts, write_jsonl

from imagebatch.run.exit_codes import EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE
from imagebatch.work.store import OutputStore


def _mount(target: Path, options: str) -> bool:
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True, check=False
    )
    return done.returncode == 0


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Any]:
    """Mount small tmpfs file systems under tmp_path (needs root and mount: skipped, saying so, without)."""
    points: list[Path] = []

    def mount(name: str, options: str) -> Path:
        target = tmp_path / name
        if not _mount(target, options):
            pytest.skip("mounting a tmpfs needs root and the mount command (CAP_SYS_ADMIN)")
        points.append(target)
        return target

    yield mount
    for point in reversed(points):
        subprocess.run(["umount", "-l", str(point)], check=False)


def test_a_read_only_out_exits_2_before_prefect_starts(
    mounted: Any, examples: Path, capsys: Any, service_env: Any
) -> None:
    target = mounted("ro", "ro,size=1m") / "out"
    code, _, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", str(target))
    assert code == EXIT_USAGE, err
    assert err.strip().splitlines() == [
        f"--out {target} cannot be written: Read-only file system; nothing was sent."
    ]
    assert service_env.requests() == []


def test_an_out_another_run_holds_exits_2(examples: Path, out: Path, capsys: Any, service_env: Any) -> None:
    with OutputStore(out).backend.hold():
        code, _, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", str(out))
    assert code == EXIT_USAGE and "another imagebatch run is using" in err and "Traceback" not in err
    assert service_env.requests() == []


def test_a_disk_that_fills_mid_run_stops_it_with_one_message_and_a_rerun_finishes(
    mounted: Any, tmp_path: Path, capsys: Any, service_env: Any
) -> None:
    disk = mounted("small", "size=4m")
    out = disk / "out"
    manifest = write_jsonl(
        tmp_path / "m.jsonl", [{"id": f"j{i:02d}", "prompt": f"vase {i}"} for i in range(40)]
    )
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (4096 - 48) * 1024)  # leave about 48 KB: a few requests' worth
    code, stdout, err = cli(capsys, "run", str(manifest), "--out", str(out), "--concurrency", "2")

    assert code == EXIT_INCOMPLETE, err
    assert f"disk full at {out}: free space, then rerun" in err
    assert "Traceback" not in err and err.count("disk full at") <= 3, err
    counts = summary_counts(stdout)
    assert sum(counts.values()) == 40 and counts.get("not_attempted", 0) > 0, stdout
    billed = Counter(e["idempotency_key"] for e in service_env.ledger())
    assert 0 < len(billed) < 40

    filler.unlink()  # free space, then rerun
    code, stdout, err = cli(capsys, "run", str(manifest), "--out", str(out), "--concurrency", "2")
    rows = read_results(out)
    assert "disk full" not in err, err
    statuses = Counter(r["status"] for r in rows)
    assert set(statuses) <= {"succeeded", "skipped", "unknown"}, rows
    # Answered (billed) requests whose files did not make it are `unknown`, never sent again on their own.
    billed_again = Counter(e["idempotency_key"] for e in service_env.ledger())
    assert max(billed_again.values()) == 1
    done = {r["idempotency_key"] for r in rows if r["status"] != "unknown"}
    assert done <= set(billed_again) and statuses["unknown"] <= 3
    for row in rows:
        if row["status"] in ("succeeded", "skipped"):
            assert all((out / p).is_file() for p in row["paths"].split(";"))
    assert json.loads((out / "run.json").read_text())["state"] == "finished"
    assert code == (EXIT_OK if not statuses["unknown"] else EXIT_INCOMPLETE)


def test_a_disk_full_before_the_end_still_gets_the_runs_records(
    mounted: Any, tmp_path: Path, capsys: Any, service_env: Any
) -> None:
    """Issue 21 #1: 200 requests on a 2 MB disk. The records of the units finished as it filled were cut
    short in the records spool (a traceback at the end, no results.csv, run.json "running"); now the one
    line, the summary, and results.csv, usage-summary.csv and run.json ("stopped") in the space the run
    kept back."""
    out = mounted("tiny", "size=2m") / "out"
    manifest = write_jsonl(
        tmp_path / "m.jsonl", [{"id": f"j{i:03d}", "prompt": f"vase {i}"} for i in range(200)]
    )
    code, stdout, err = cli(capsys, "run", str(manifest), "--out", str(out))

    assert code == EXIT_INCOMPLETE, err
    assert "Traceback" not in err and "not written" not in err, err
    assert err.count("disk full at") == 1 and f"Stopped early: disk full at {out}" in err, err
    counts = summary_counts(stdout)
    assert sum(counts.values()) == 200 and counts.get("not_attempted", 0) > 0, stdout
    rows = read_results(out)
    assert len(rows) == 200 and Counter(r["status"] for r in rows) == counts
    run = json.loads((out / "run.json").read_text())
    assert run["state"] == "stopped" and run["stopped"].startswith("disk full at")
    assert (out / "usage-summary.csv").is_file()
