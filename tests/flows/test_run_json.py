"""run.json as a real run of the flow writes it (the emulator, the session's Prefect harness): versioned,
read back through its model field for field, and what the flow returns says the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import run_flow

from imagebatch.work.runsummary import SCHEMA_VERSION, RunSummary

pytestmark = pytest.mark.usefixtures("prefect_harness", "restore_logging")


def test_a_runs_run_json_is_the_model_written_whole(service_env: Any, examples: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    info = run_flow(manifest=str(examples / "catalog.csv"), out=str(out), report=False)
    raw = (out / "run.json").read_bytes()
    summary = RunSummary.parse(raw, "run.json")
    assert summary.schema_version == SCHEMA_VERSION == json.loads(raw)["schema_version"]
    assert (summary.state, summary.requests, summary.sent) == ("finished", 6, 6)
    assert summary.counts == info["counts"] and summary.counts["succeeded"] == 6
    assert summary.prefect is not None and summary.prefect.flow_run_id == info["prefect"]["flow_run_id"]
    assert summary.options["concurrency"] == 4 and summary.ended_at is not None
    assert summary.record() == raw  # read and written again: the same bytes
