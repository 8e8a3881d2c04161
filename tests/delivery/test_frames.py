"""`imagebatch.results(OUT)`: a run's results, usage and review decisions as DataFrames, from a folder or a
bucket, after real runs on the emulator; `import imagebatch` does not import pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from helpers.runs import cli, run_flow, write_jsonl

import imagebatch
from imagebatch.delivery.frames import DECISION_COLUMNS, USAGE_COLUMNS
from imagebatch.run.exit_codes import EXIT_OK
from imagebatch.run.hooks import RunHooks, run_hooks
from imagebatch.storage.kinds import open_location
from imagebatch.work.decisions import Decision, record_decision
from imagebatch.work.store import RESULT_COLUMNS

pytestmark = pytest.mark.usefixtures("prefect_harness", "restore_logging")  # flow runs

JOBS = [
    {"id": f"mug-{i}", "prompt": f"a mug, angle {i}", "model": "compat-image-2", "sku": f"00{i}"}
    for i in range(3)
]
TEXT = {"id": "alt", "prompt": "alt text for a mug", "route": "messages", "model": "claude-compat-small"}


def test_results_of_a_folder_after_a_run_with_retries(service_env: Any, tmp_path: Path) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [*JOBS, TEXT])
    out = tmp_path / "out"
    service_env.set_faults(scripts=[{"outcomes": [503, "ok"], "match": "angle 0"}])  # one retry
    with run_hooks(RunHooks(sleep=lambda _: None)):
        info = run_flow(manifest=str(manifest), out=str(out))
    assert info["counts"]["succeeded"] == 4

    r = imagebatch.results(out)
    assert isinstance(r, imagebatch.Results)
    frame = r.results
    at = RESULT_COLUMNS.index("status") + 1  # the outcome over every run, beside the last run's status
    assert list(frame.columns) == [*RESULT_COLUMNS[:at], "outcome", *RESULT_COLUMNS[at:], "sku"]
    assert set(frame.outcome) == {"succeeded"}
    assert len(frame) == 4 and set(frame.status) == {"succeeded"}
    assert frame.sku.tolist() == ["000", "001", "002", pd.NA]  # text kept as text: leading zeros stay
    assert str(frame.request_index.dtype) == "Int64" and frame.variant.tolist() == [1, 1, 1, 1]
    assert frame.loc[frame.job_id == "mug-0", "attempts"].item() == 2
    assert frame.width.tolist()[:3] == [1024, 1024, 1024] and pd.isna(frame.width.tolist()[3])

    usage = r.usage
    assert list(usage.columns)[: len(USAGE_COLUMNS)] == list(USAGE_COLUMNS)
    assert len(usage) == len(service_env.requests()) == 5  # one row per HTTP attempt
    assert usage.http_status.tolist().count(503) == 1
    assert str(usage.started_at.dtype).startswith("datetime64") and str(usage.started_at.dt.tz) == "UTC"
    text = usage[usage.route == "messages"]
    assert text.input_tokens.notna().all() and (text.total_tokens >= text.input_tokens).all()
    assert usage.images.sum() == 3

    assert r.decisions.empty and list(r.decisions.columns) == list(DECISION_COLUMNS)
    where = open_location(out)
    keys = frame.idempotency_key.tolist()
    record_decision(where, Decision(keys[0], 1, "rejected", "handle missing", "ana"))
    record_decision(where, Decision(keys[1], 1, "approved", reviewer="ana"))
    record_decision(where, Decision(keys[0], 1, "approved", reviewer="bo"))  # the last wins
    decisions = imagebatch.results(out).decisions
    assert decisions.set_index("key").decision.to_dict() == {keys[0]: "approved", keys[1]: "approved"}
    assert decisions.set_index("key").reviewer[keys[0]] == "bo"
    assert str(decisions["at"].dt.tz) == "UTC"
    merged = frame.merge(
        decisions, left_on=["idempotency_key", "variant"], right_on=["key", "variant"], how="left"
    )
    assert merged.decision.value_counts().to_dict() == {"approved": 2}
    assert merged.variant.tolist() == [1, 1, 1, 1]


def test_results_of_a_bucket(
    s3: Any, service_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", JOBS)
    bucket = s3.bucket()
    url = f"s3://{bucket}/catalog"
    code, _, err = cli(capsys, "run", str(manifest), "--out", url)
    assert code == EXIT_OK, err
    record_decision(open_location(url), Decision("ib1-" + "0" * 32, 1, "rejected", "wrong colour"))
    r = imagebatch.results(url)
    assert len(r.results) == 3 and set(r.results.status) == {"succeeded"}
    assert len(r.usage) == len(service_env.requests()) == 3  # the journal segments' usage lines
    assert r.decisions.decision.tolist() == ["rejected"] and r.decisions.note.tolist() == ["wrong colour"]


def test_a_folder_without_a_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="holds no run of imagebatch"):
        imagebatch.results(tmp_path)
    assert not list(tmp_path.iterdir())


def test_importing_imagebatch_does_not_import_pandas() -> None:
    code = (
        "import sys, imagebatch\n"
        "assert 'pandas' not in sys.modules\n"
        "assert callable(imagebatch.results) and 'pandas' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
