"""A rerun with nothing to send is settled without Prefect (issue 23): the same records as the flow writes,
nothing sent, and Prefect not started; anything to send, or a held folder, goes to the flow as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers.runs import write_jsonl

from imagebatch.options import RunOptions
from imagebatch.run.nothing_to_send import settle_without_prefect
from imagebatch.run.preflight import preflight
from imagebatch.work.store import OutputStore

JOBS = [{"id": f"row-{i}", "prompt": f"a red cup, angle {i}", "model": "compat-image-2"} for i in range(5)]
CHAIN = {"id": "chain", "prompt": "a cup", "model": "native-image-2.1", "turns": ["make it blue"]}


def _run(env: dict[str, str], manifest: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--out", str(out), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _env(service_env: Any, home: Path, api: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"IMAGEBATCH_BASE_URL": service_env.url, "IMAGEBATCH_API_KEY": service_env.api_key}
    env["PREFECT_HOME"] = str(home)
    if api:
        env["PREFECT_API_URL"] = api
    return env


def _run_json(out: Path) -> dict[str, Any]:
    info = json.loads((out / "run.json").read_text())
    for moving in ("started_at", "ended_at", "prefect", "report"):
        info.pop(moving, None)
    return info


def test_a_rerun_with_nothing_to_send_writes_what_the_flow_writes_without_prefect(
    service_env: Any, prefect_harness: str, tmp_path: Path
) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [*JOBS, CHAIN])
    out = tmp_path / "out"
    first = _run(_env(service_env, tmp_path / "home", prefect_harness), manifest, out)
    assert first.returncode == 0, first.stderr
    sent = len(service_env.requests())
    assert sent == 7

    # No PREFECT_API_URL: Prefect's temporary server would be needed, and is not started.
    settled = _run(_env(service_env, tmp_path / "home", None), manifest, out)
    assert settled.returncode == 0, settled.stderr
    assert "Prefect was not started" in settled.stderr
    assert len(service_env.requests()) == sent
    info = json.loads((out / "run.json").read_text())
    assert info["prefect"] == {"flow_run_id": None, "task_runs": 0, "started": False}
    assert info["state"] == "finished" and info["counts"]["skipped"] == 7
    files = {name: (out / name).read_bytes() for name in ("results.csv", "usage-summary.csv")}
    settled_info = _run_json(out)

    # The flow's own rerun (a running Prefect server) writes the same records.
    flowed = _run(_env(service_env, tmp_path / "home", prefect_harness), manifest, out)
    assert flowed.returncode == 0, flowed.stderr
    assert "Prefect was not started" not in flowed.stderr
    assert json.loads((out / "run.json").read_text())["prefect"]["flow_run_id"]
    assert {name: (out / name).read_bytes() for name in files} == files
    assert _run_json(out) == settled_info
    assert len(service_env.requests()) == sent

    # One row more: something to send, so the flow runs (on the temporary server) and sends only it.
    write_jsonl(manifest, [*JOBS, CHAIN, {"id": "new", "prompt": "a green cup", "model": "compat-image-2"}])
    grown = _run(_env(service_env, tmp_path / "home", None), manifest, out)
    assert grown.returncode == 0, grown.stderr
    assert "Prefect was not started" not in grown.stderr
    assert len(service_env.requests()) == sent + 1
    assert json.loads((out / "run.json").read_text())["prefect"]["flow_run_id"]


def test_only_a_folder_with_nothing_to_send_is_settled(service_env: Any, tmp_path: Path) -> None:
    from imagebatch.flows.batch import generate_from_manifest

    manifest = write_jsonl(tmp_path / "m.jsonl", JOBS)
    out = tmp_path / "out"
    options = RunOptions.from_flat(report=False, base_url=service_env.url)
    checked = preflight(manifest, out, options)
    assert settle_without_prefect(checked, options) is None  # a first run: no journal yet
    generate_from_manifest(str(manifest), str(out), options)
    assert settle_without_prefect(checked, options.with_flat(force=True)) is None
    with OutputStore(out).backend.hold():  # another run holds the folder: the flow says so, not us
        assert settle_without_prefect(checked, options) is None
    (out / "results.csv").unlink()
    info = settle_without_prefect(checked, options)
    assert info is not None and info["counts"]["skipped"] == 5 and (out / "results.csv").is_file()
    grown = write_jsonl(
        tmp_path / "m2.jsonl", [*JOBS, {"id": "x", "prompt": "more", "model": "compat-image-2"}]
    )
    assert settle_without_prefect(preflight(grown, out, options), options) is None
    assert len(service_env.requests()) == 5


def test_every_option_reaches_the_settled_reruns_record(service_env: Any, tmp_path: Path) -> None:
    """Driven by the model's fields: each option at a value other than its default reaches run.json's
    options of a rerun settled without Prefect, as the flow records them. Only `force` never settles
    (it sends everything), and `base_url` is recorded as the run resolved it."""
    from helpers.options import every_other

    from imagebatch.flows.batch import generate_from_manifest

    manifest = write_jsonl(tmp_path / "m.jsonl", JOBS)
    out = tmp_path / "out"
    generate_from_manifest(str(manifest), str(out), RunOptions.from_flat(base_url=service_env.url))
    values = every_other() | {"force": False, "base_url": service_env.url, "report": False}
    options = RunOptions.from_flat(**values)
    checked = preflight(manifest, out, RunOptions.from_flat(base_url=service_env.url))
    info = settle_without_prefect(checked, options)
    assert info is not None and info["sent"] == 0
    recorded = json.loads((out / "run.json").read_text())["options"]
    assert {name: recorded[name] for name in values} == values
    assert recorded["shard"] is None
