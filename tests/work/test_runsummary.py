"""run.json through its model (`work.runsummary.RunSummary`): a run.json written before `schema_version`
existed (data/run-before-schema-version.json, left by a real `imagebatch run` of the example catalog)
reads as version 1 and is written back field for field; a field of the wrong type, or a newer version,
is refused in one line naming the file and the field, by the command that reads it, the file untouched."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.review import review_folder
from helpers.runs import catalog, cli

from imagebatch.storage.objectstore import ObjectLocation
from imagebatch.work.runsummary import SCHEMA_VERSION, RunSummary, RunSummaryError
from imagebatch.work.store import OutputStore, RequestRecord

BEFORE = Path(__file__).parent / "data" / "run-before-schema-version.json"


def test_a_run_json_from_before_the_version_reads_as_version_1_and_round_trips() -> None:
    raw = BEFORE.read_bytes()
    assert "schema_version" not in json.loads(raw)
    summary = RunSummary.parse(raw, str(BEFORE))
    assert (summary.schema_version, summary.state, summary.requests) == (1, "finished", 6)
    assert summary.counts is not None and summary.counts["succeeded"] == 6
    assert summary.prefect is not None and summary.prefect.task_runs == 6
    written = json.loads(summary.record())
    assert written == {"schema_version": SCHEMA_VERSION, **json.loads(raw)}
    assert list(written)[1:] == list(json.loads(raw))  # the fields in the order the run wrote them
    assert RunSummary.parse(summary.record(), "again") == summary


def _out(tmp_path: Path, run: dict[str, object]) -> Path:
    """An output folder as a finished run leaves it, with `run` as its run.json."""
    out = tmp_path / "out"
    store = OutputStore(out)
    store.backend.prepare()
    record = RequestRecord("mug", 0, 0, "failed", "compat-image-2", "images", "key-0", error="503")
    store.write_results([record.to_row()], [])
    (out / "run.json").write_text(json.dumps(run))
    return out


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"counts": {"succeeded": "six"}}, "field 'counts.succeeded': Input should be a valid integer"),
        ({"requests": "6"}, "field 'requests': Input should be a valid integer (it is '6')"),
        ({"state": "done"}, "field 'state': Input should be 'running', 'finished'"),
        ({"started_at": "yesterday"}, "field 'started_at': Invalid isoformat string"),
        ({"schema_version": 2}, "schema_version 2 is newer than this imagebatch reads (1): upgrade"),
    ],
)
def test_the_report_refuses_a_run_json_the_model_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object], said: str
) -> None:
    out = _out(tmp_path, json.loads(BEFORE.read_bytes()) | change)
    before = (out / "run.json").read_bytes()
    code, _, err = cli(capsys, "report", str(out))
    assert code == 2
    assert err.startswith(f"imagebatch report: {out}/run.json: ") and said in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (out / "run.json").read_bytes() == before and not (out / "report.html").exists()


def test_a_dead_runs_run_json_is_marked_through_the_model(tmp_path: Path) -> None:
    running = json.loads(BEFORE.read_bytes()) | {"state": "running", "ended_at": None}
    for name in ("counts", "usage", "prefect", "stopped", "superseded", "rate_limited", "sent"):
        running.pop(name)
    out = _out(tmp_path, running | {"a_later_field": [1, 2]})
    settled = OutputStore(out).settle_dead_run("2026-11-28T12:00:00+00:00")
    assert settled is not None and settled.state == "crashed"
    left = json.loads((out / "run.json").read_text())
    assert left["schema_version"] == 1 and left["noticed_at"] == "2026-11-28T12:00:00+00:00"
    assert left["a_later_field"] == [1, 2]  # a field this model does not know is kept
    assert left["options"] == running["options"] and "counts" not in left


def test_a_writer_cannot_write_a_field_of_the_wrong_type(tmp_path: Path) -> None:
    store = OutputStore(tmp_path / "out")
    store.backend.prepare()
    with pytest.raises(ValueError, match="requests"):
        store.write_run({"state": "running", "requests": "many"})
    assert not (tmp_path / "out" / "run.json").exists()
    with pytest.raises(RunSummaryError, match="not JSON"):
        RunSummary.parse(b"{", "run.json")


def test_a_run_into_a_folder_whose_run_json_is_refused_sends_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _out(tmp_path, json.loads(BEFORE.read_bytes()) | {"state": "running", "requests": -1})
    manifest = catalog(tmp_path / "catalog.csv", 2)
    before = sorted(p.name for p in out.iterdir())
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out), "--no-report")
    assert code == 2
    assert err == (
        f"{out}/run.json: field 'requests': Input should be greater than or equal to 0 (it is -1); "
        "nothing was sent.\n"
    )
    assert sorted(p.name for p in out.iterdir()) == before


def test_review_refuses_a_run_json_the_model_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = review_folder(tmp_path, 2)
    (out / "run.json").write_text(json.dumps({"state": "finished", "counts": []}))
    code, _, err = cli(capsys, "review", str(out), "--port", "0")
    assert code == 2
    said = "field 'counts': Input should be a valid dictionary (it is [])"
    assert err == f"imagebatch review: {out}/run.json: {said}\n"


def test_a_writer_may_give_a_path_or_a_counter(tmp_path: Path) -> None:
    store = OutputStore(tmp_path / "out")
    store.backend.prepare()
    report = tmp_path / "out" / "report.html"
    store.write_run({"state": "finished", "report": report, "counts": Counter(succeeded=2)})
    written = RunSummary.parse((tmp_path / "out" / "run.json").read_bytes(), "run.json")
    assert (written.report, written.counts) == (str(report), {"succeeded": 2})


def test_validate_out_refuses_a_run_json_the_model_refuses_as_a_run_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _out(tmp_path, {"state": "stopped", "stopped": 3})
    manifest = catalog(tmp_path / "catalog.csv", 2)
    code, _, err = cli(capsys, "validate", str(manifest), "--out", str(out))
    assert code == 2
    assert err == (
        f"imagebatch validate: {out}/run.json: field 'stopped': Input should be a valid string (it is 3)\n"
    )


def test_a_run_into_a_bucket_whose_run_json_is_refused_sends_nothing(
    s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = s3.bucket()
    url = f"s3://{bucket}/run"
    ObjectLocation(url).put("run.json", json.dumps({"state": "running", "sent": "all"}).encode())
    manifest = catalog(tmp_path / "catalog.csv", 2)
    code, _, err = cli(capsys, "run", str(manifest), "--out", url, "--no-report")
    assert code == 2
    said = "field 'sent': Input should be a valid integer (it is 'all')"
    assert err == f"{url}/run.json: {said}; nothing was sent.\n"
    assert set(s3.objects(bucket, "run/")) == {"run.json"}  # nothing else written
