"""`imagebatch deploy` against real Prefect components started here (`helpers.prefect_stack`: a server per
database, an emulator, a process worker), running deployments against an emulator over HTTP; the sharded
runs are in test_deploy_shards.py and test_deploy_shards_slots.py.

`imagebatch deploy` runs in this process under `helpers.prefect_server.prefect_api` (the stack's server); the
server is read over its REST API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from helpers.prefect_server import prefect_api
from helpers.prefect_stack import (  # the fixtures: stacks, stack, and prefect_harness (none here)
    CATALOG,
    CATALOG_REQUESTS,
    IDLE_POOL,
    POOL,
    REPO,
    SCHEDULER_BROKEN,
    YAML_POOL,
    Stack,
    each_stack,  # noqa: F401
    no_session_harness,  # noqa: F401
    started_stacks,  # noqa: F401
)

from imagebatch.options import RunOptions
from imagebatch.run.preflight import NO_SERVICE

pytestmark = pytest.mark.slow  # Prefect servers (helpers.shared_servers) and workers


@dataclass
class WorkerRuns:
    out: Path
    runs: list[dict[str, Any]]  # two runs of one deployment, started together
    ledger: list[dict[str, Any]]


@pytest.fixture(scope="module")
def worker_runs(
    stacks: dict[str, Stack | None], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, WorkerRuns]:
    """On each stack: deploy the catalog to the worker's pool against the stack's emulator, start two runs
    of it at once, wait for both to end."""
    started: dict[str, tuple[Stack, Path, list[str]]] = {}
    for backend, stack in stacks.items():
        if stack is None:
            continue
        out = tmp_path_factory.mktemp(f"worker-out-{backend}")
        code = stack.deploy(
            f"{CATALOG} --out {out} --name on-pool --work-pool {POOL} --base-url {stack.emulator.url} "
            "--cron '0 2 * * *'"
        )
        assert code == 0
        deployment_id = stack.deployment("on-pool")["id"]
        started[backend] = (stack, out, [stack.run(deployment_id), stack.run(deployment_id)])
    return {
        backend: WorkerRuns(out, [stack.wait(run) for run in runs], stack.emulator.ledger())
        for backend, (stack, out, runs) in started.items()
    }


def test_deploy_with_a_cron_schedule_is_on_the_server(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    out = tmp_path / "cron"
    code = stack.deploy(
        f"manifests/examples/catalog.csv --out {out} --name cron --cron '0 2 * * *' --timezone Europe/Paris "
        f"--work-pool {IDLE_POOL} --concurrency 8 --base-url embedded"
    )
    assert code == 0, capsys.readouterr().err
    assert "deployed generate_from_manifest/cron" in capsys.readouterr().out

    deployment = stack.deployment("cron")
    [schedule] = deployment["schedules"]
    assert schedule["schedule"]["cron"] == "0 2 * * *"
    assert schedule["schedule"]["timezone"] == "Europe/Paris"
    assert schedule["active"] is True
    assert deployment["paused"] is False
    assert deployment["entrypoint"] == "imagebatch.flows.batch.generate_from_manifest"
    assert deployment["work_pool_name"] == IDLE_POOL
    parameters = deployment["parameters"]
    assert parameters["manifest"] == str(CATALOG)  # made absolute
    assert parameters["out"] == str(out.resolve())
    options = parameters["options"]
    assert options["pacing"]["concurrency"] == 8
    assert options["service"]["api_key_secret_block"] is None
    assert options["pacing"]["global_limit"] is None
    names = [name for path, _ in _leaves(parameters) for name in path]
    assert not any("key" in name for name in names if name != "api_key_secret_block")
    assert stack.emulator.api_key not in str(deployment)
    assert deployment["global_concurrency_limit"]["limit"] == 1
    assert deployment["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"

    # Deploying again updates it: the new schedule replaces the old, and no schedule removes it.
    assert (
        stack.deploy(
            f"{CATALOG} --out {out} --name cron --work-pool {IDLE_POOL} --interval 3600 --base-url embedded"
        )
        == 0
    )
    [schedule] = stack.deployment("cron")["schedules"]
    assert schedule["schedule"]["interval"] == 3600
    assert stack.deploy(f"{CATALOG} --out {out} --name cron --work-pool {IDLE_POOL} --base-url embedded") == 0
    assert stack.deployment("cron")["schedules"] == []


def test_the_servers_scheduler_creates_the_runs_of_the_schedule(stack: Stack, tmp_path: Path) -> None:
    code = stack.deploy(
        f"{CATALOG} --out {tmp_path / 'out'} --name scheduled --cron '0 2 * * *' --timezone Europe/Paris "
        f"--work-pool {IDLE_POOL} --base-url embedded"
    )
    assert code == 0
    deployment_id = stack.deployment("scheduled")["id"]
    query = {"deployments": {"id": {"any_": [deployment_id]}}}
    # The scheduler looks at recently changed deployments every 5 s; a loaded machine runs it late.
    deadline = time.monotonic() + 120
    while not (runs := stack.post("/flow_runs/filter", query)):
        assert SCHEDULER_BROKEN not in stack.server.log(), "the server's scheduler failed"
        assert time.monotonic() < deadline, "no scheduled run after 120 s"
        time.sleep(0.25)
    assert {run["state_name"] for run in runs} == {"Scheduled"}
    paris = ZoneInfo("Europe/Paris")
    starts = [datetime.fromisoformat(run["expected_start_time"]).astimezone(paris) for run in runs]
    assert {(start.hour, start.minute) for start in starts} == {(2, 0)}


def test_deploy_refuses_what_run_refuses_before_deploying(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("IMAGEBATCH_BASE_URL", raising=False)
    out = f"{tmp_path / 'out'} --base-url embedded"  # an address: each case below fails for its own reason
    bad = tmp_path / "bad.csv"
    bad.write_text("id,prompt,image_size\nx,a cat,1k\n")
    assert stack.deploy(f"{CATALOG} --out {tmp_path / 'out'} --name bad --work-pool {POOL}") == 2
    assert capsys.readouterr().err.strip() == f"imagebatch deploy: {NO_SERVICE}"  # no address: one line
    assert stack.deploy(f"{bad} --out {out} --name bad --work-pool {POOL}") == 2
    assert "did you mean" in capsys.readouterr().err
    assert stack.deploy(f"{CATALOG} --out {out} --name bad --base-url http://u:Hunter2@127.0.0.1:9") == 2
    assert "must not hold a user name or password" in (err := capsys.readouterr().err)
    assert "Hunter2" not in err
    assert stack.deploy(f"{CATALOG} --out {out} --name bad --cron 'every night' --work-pool {POOL}") == 2
    assert "--cron 'every night' is not a cron expression" in capsys.readouterr().err
    assert stack.deploy(f"{CATALOG} --out {out} --name bad --work-pool no-such-pool") == 2
    assert "prefect work-pool create no-such-pool --type process" in capsys.readouterr().err
    assert stack.deploy(f"{CATALOG} --out {out} --name bad") == 2
    assert "imagebatch serve" in capsys.readouterr().err
    assert stack.deploy(f"{CATALOG} --out {out} --name bad --work-pool {POOL} --global-limit no-such") == 2
    assert "imagebatch limits --name no-such" in capsys.readouterr().err
    with pytest.raises(httpx.HTTPStatusError):
        stack.deployment("bad")


def test_a_worker_runs_the_deployment_and_writes_the_images(
    stack: Stack, worker_runs: dict[str, WorkerRuns]
) -> None:
    done = worker_runs[stack.backend]
    [completed] = [run for run in done.runs if run["state_type"] == "COMPLETED"]
    images = [p for p in (done.out / "images").rglob("*") if p.suffix in (".png", ".jpg")]
    assert len(images) >= CATALOG_REQUESTS
    assert (done.out / "results.csv").read_text().count(",succeeded,") == CATALOG_REQUESTS
    assert len(done.ledger) == CATALOG_REQUESTS
    assert completed["parameters"]["out"] == str(done.out)


def test_two_overlapping_runs_do_not_both_send(stack: Stack, worker_runs: dict[str, WorkerRuns]) -> None:
    done = worker_runs[stack.backend]
    assert sorted(run["state_type"] for run in done.runs) == ["CANCELLED", "COMPLETED"]
    [cancelled] = [run for run in done.runs if run["state_type"] == "CANCELLED"]
    assert cancelled["state"]["message"] == "Deployment concurrency limit reached."
    keys = [entry["idempotency_key"] for entry in done.ledger]
    assert len(keys) == CATALOG_REQUESTS
    assert len(set(keys)) == len(keys)


def test_the_key_is_nowhere_in_the_prefect_database(stack: Stack, worker_runs: dict[str, WorkerRuns]) -> None:
    assert any(run["state_type"] == "COMPLETED" for run in worker_runs[stack.backend].runs)
    key = stack.emulator.api_key.encode()
    if stack.database_url is None:
        files = sorted((stack.server.home).glob("*.db*"))  # the database and its write-ahead log
        assert files, f"no SQLite database in {stack.server.home}"
        dump = b"".join(path.read_bytes() for path in files)
    else:
        dump = subprocess.run(
            ["su", "postgres", "-c", f"pg_dump --data-only {stack.database_url.rsplit('/', 1)[1]}"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    assert b"generate_from_manifest" in dump and b"on-pool" in dump  # it does hold the runs' records
    assert key not in dump
    assert key not in stack.server.log_path.read_bytes()


def test_deploy_refuses_without_a_prefect_server(tmp_path: Path) -> None:
    """No PREFECT_API_URL (and a profile-less PREFECT_HOME): exit 2, one line saying how to start one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "home")
    out = str(tmp_path / "out")
    cmd = [
        sys.executable,
        "-m",
        "imagebatch.cli.main",
        "deploy",
        str(CATALOG),
        "--out",
        out,
        "--base-url",
        "embedded",
        "--name",
        "nightly",
        "--cron",
        "0 2 * * *",
        "--work-pool",
        POOL,
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "PREFECT_API_URL is not set" in lines[0]
    assert "`prefect server start`" in lines[0]
    assert "export PREFECT_API_URL=http://127.0.0.1:4200/api" in lines[0]
    assert done.stdout == ""


def _prefect_deploy(stack: Stack, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`prefect deploy --name nightly-yaml` with the repository's prefect.yaml, against `stack`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "IMAGEBATCH_"))}
    clean |= {"PREFECT_API_URL": stack.api, "PREFECT_HOME": str(home), "PWD": str(REPO), **env}
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--name", "nightly-yaml"]
    return subprocess.run(cmd, cwd=REPO, env=clean, capture_output=True, text=True, timeout=180, check=False)


def test_prefect_yaml_refuses_without_an_address_and_makes_what_imagebatch_deploy_makes(
    stacks: dict[str, Stack | None], tmp_path: Path
) -> None:
    """Issue 20, item 6 (SQLite stack only): without IMAGEBATCH_BASE_URL, prefect.yaml's build step
    (`imagebatch deploy --check`) refuses and nothing is deployed; with it, the deployment is the one
    `imagebatch deploy` makes for the same inputs, under its own name (never replacing `nightly`)."""
    stack = stacks["sqlite"]
    assert stack is not None
    refused = _prefect_deploy(stack, tmp_path / "home")
    assert refused.returncode != 0
    assert NO_SERVICE in refused.stdout + refused.stderr
    with pytest.raises(httpx.HTTPStatusError):
        stack.deployment("nightly-yaml")

    done = _prefect_deploy(stack, tmp_path / "home", IMAGEBATCH_BASE_URL="embedded")
    assert done.returncode == 0, done.stdout + done.stderr
    yaml = stack.deployment("nightly-yaml")
    code = stack.deploy(
        f"{CATALOG} --out {REPO / 'out' / 'nightly'} --name nightly --work-pool {YAML_POOL} --concurrency 4 "
        "--cron '0 2 * * *' --base-url embedded"
    )
    assert code == 0
    command = stack.deployment("nightly")
    assert yaml["entrypoint"] == command["entrypoint"] == "imagebatch.flows.batch.generate_from_manifest"
    assert yaml["pull_steps"] == [] and command["pull_steps"] in ([], None)
    for field in ("work_pool_name", "tags", "job_variables", "concurrency_options"):
        assert yaml[field] == command[field], field
    assert yaml["job_variables"] == {"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}
    assert yaml["global_concurrency_limit"]["limit"] == command["global_concurrency_limit"]["limit"] == 1
    given = {path: v for path, v in _leaves(command["parameters"]) if v is not None}
    in_yaml = dict(_leaves(yaml["parameters"]))
    assert in_yaml == {path: v for path, v in given.items() if path in in_yaml}
    assert in_yaml[("options", "service", "base_url")] == "embedded"
    defaults = dict(_leaves({"options": RunOptions().model_dump(mode="json")}))
    left_out = {path: v for path, v in given.items() if path not in in_yaml}
    assert left_out == {path: defaults[path] for path in left_out}  # what prefect.yaml leaves out: defaults
    [schedule] = yaml["schedules"]
    assert schedule["schedule"]["cron"] == command["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    assert len(stack.post("/automations/filter")) >= 1


def test_a_deployment_of_the_earlier_shape_keeps_working(
    stacks: dict[str, Stack | None], tmp_path: Path
) -> None:
    """A deployment made before the options were one model (every option a parameter of its own, here made
    through Prefect's API as the earlier `imagebatch deploy` made it) runs on today's worker, its flat
    options read as the model's fields."""
    from helpers.runs import read_results

    from imagebatch.platform.deploy import build_deployment

    stack = stacks["sqlite"]
    assert stack is not None
    out = tmp_path / "out"
    flat = {
        "manifest": str(CATALOG), "out": str(out), "concurrency": 2, "base_url": stack.emulator.url,
        "max_images": 3, "report": False, "api_key_secret_block": None, "shards": 1, "shard": None,
    }  # fmt: skip
    with prefect_api(stack.api):
        deployment = build_deployment("earlier-shape", flat, None, POOL)
        deployment.enforce_parameter_schema = False  # the earlier flow's schema took these names
        deployment_id = deployment.apply(work_pool_name=POOL)
    run = stack.wait(stack.run(str(deployment_id)))
    assert "Validation of flow parameters failed" not in str(run["state"]["message"]), run["state"]
    info = json.loads((out / "run.json").read_text())
    assert info["options"]["concurrency"] == 2 and info["options"]["max_images"] == 3
    assert info["options"]["report"] is False and not (out / "report.html").exists()
    assert [r["status"] for r in read_results(out)].count("succeeded") == 3


def test_a_deployment_run_without_an_address_fails_with_one_line(stack: Stack, tmp_path: Path) -> None:
    """Issue 20, item 6: a deployment made without `imagebatch deploy`'s check (here by Prefect's own API,
    as an old one would be) and a worker without IMAGEBATCH_BASE_URL: the run fails, saying so, and the
    embedded emulator is never started."""

    from imagebatch.platform.deploy import build_deployment

    parameters = {"manifest": str(CATALOG), "out": str(tmp_path / "out")}
    with prefect_api(stack.api):
        deployment_id = build_deployment("no-address", parameters, None, POOL).apply(work_pool_name=POOL)
    run = stack.wait(stack.run(str(deployment_id)))
    assert run["state_type"] == "FAILED"
    assert NO_SERVICE in run["state"]["message"]
    assert not (tmp_path / "out" / "images").exists()


def _leaves(tree: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Each value of nested parameters with its path: (("options", "pacing", "concurrency"), 8)."""
    for name, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*path, name))
        else:
            yield (*path, name), value


def _automations(stack: Stack) -> list[dict[str, Any]]:
    from imagebatch.platform.deploy import AUTOMATION_NAME

    return [a for a in stack.post("/automations/filter") if a["name"] == AUTOMATION_NAME]


def test_deploy_sets_up_the_heartbeat_automation_once(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20, item 4: `imagebatch deploy` creates Prefect's zombie-run automation for the runs tagged
    imagebatch and updates it on each deploy (one of it, its window from IMAGEBATCH_HEARTBEAT_WINDOW);
    the deployment's runs get a heartbeat every 30 s through the job variables."""
    args = f"{CATALOG} --out {tmp_path / 'out'} --name beats --work-pool {IDLE_POOL} --base-url embedded"
    monkeypatch.setenv("IMAGEBATCH_HEARTBEAT_WINDOW", "120")
    assert stack.deploy(args) == 0
    monkeypatch.delenv("IMAGEBATCH_HEARTBEAT_WINDOW")
    assert stack.deploy(args) == 0
    [automation] = _automations(stack)
    trigger = automation["trigger"]
    assert trigger["posture"] == "Proactive" and trigger["within"] == 90.0
    assert trigger["after"] == ["prefect.flow-run.heartbeat"]
    assert (
        "prefect.flow-run.heartbeat" in trigger["expect"]
        and "prefect.flow-run.Completed" in trigger["expect"]
    )
    assert trigger["match_related"] == {
        "prefect.resource.role": "tag",
        "prefect.resource.id": "prefect.tag.imagebatch",
    }
    [action] = automation["actions"]
    assert action["type"] == "change-flow-run-state" and action["state"] == "CRASHED"
    deployment = stack.deployment("beats")
    assert deployment["job_variables"] == {"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}
    assert deployment["tags"] == ["imagebatch"]


def test_deploy_into_a_bucket_refuses_a_missing_bucket_and_a_url_with_a_secret_before_deploying(
    stacks: dict[str, Stack | None], s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 19, item 1: the deployer's credentials reach the bucket before anything is deployed (exit 2,
    one line naming the bucket and the cause); a URL that holds a secret is refused without showing it."""
    stack = stacks["sqlite"]
    assert stack is not None
    common = f"--name to-bucket --work-pool {POOL} --base-url embedded"
    assert stack.deploy(f"{CATALOG} --out s3://no-such-bucket-ib/nightly {common}") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("imagebatch deploy: --out s3://no-such-bucket-ib/nightly: ")
    assert "the bucket 'no-such-bucket-ib' does not exist (NoSuchBucket" in lines[0]
    assert stack.deploy(f"{CATALOG} --out s3://AKIAEXAMPLE:Hunter2@{s3.bucket()}/n {common}") == 2
    err = capsys.readouterr().err
    assert "holds a user, password or query" in err and "Hunter2" not in err and "AKIAEXAMPLE" not in err
    with pytest.raises(httpx.HTTPStatusError):
        stack.deployment("to-bucket")


def test_the_emulator_is_used_in_a_deployment_only_when_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20, item 6: outside a deployment no address means the emulator (the quick start); in one,
    only `embedded` (option or IMAGEBATCH_BASE_URL) does, and no address is refused with one line."""
    from imagebatch.errors import UsageError
    from imagebatch.run.preflight import resolve_base_url

    monkeypatch.delenv("IMAGEBATCH_BASE_URL", raising=False)
    assert resolve_base_url(None) is None
    with pytest.raises(UsageError) as refused:
        resolve_base_url(None, deployed=True)
    assert str(refused.value) == NO_SERVICE and "\n" not in NO_SERVICE
    assert resolve_base_url("embedded", deployed=True) is None
    monkeypatch.setenv("IMAGEBATCH_BASE_URL", "embedded")
    assert resolve_base_url(None, deployed=True) is None
    monkeypatch.setenv("IMAGEBATCH_BASE_URL", "https://gateway.example")
    assert resolve_base_url(None, deployed=True) == "https://gateway.example"
