"""Issue 30, the knobs a platform team sets: `imagebatch deploy`'s metadata flags stored as given (tags,
description, version, work queue, job variables, paused, the time zone UTC by default), refusals in one
line, and `--notify BLOCK`: a run of the deployment that fails reaches a webhook block, served here by a
small HTTP server on 127.0.0.1. On a real `prefect server start` (SQLite), whose automations service
sends the notification; every wait is for an event, bounded."""

from __future__ import annotations

import json
import queue
import shlex
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.prefect_server import PrefectServer, call, prefect_api
from helpers.shared_servers import PrefectServers

from imagebatch.cli.main import main

pytestmark = pytest.mark.slow  # Prefect servers (helpers.shared_servers) and workers

POOL = "metadata-pool"


@pytest.fixture(scope="module", autouse=True)
def prefect_harness() -> None:
    """Overrides the session harness: everything here talks to the server below."""


@pytest.fixture(scope="module")
def server(prefect_servers: PrefectServers) -> PrefectServer:
    return prefect_servers.sqlite(POOL, "imagebatch")  # ours, and prefect.yaml's


def deploy(server: PrefectServer, args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    with prefect_api(server.api_url):
        code = main(["deploy", *shlex.split(args)])
    return code, capsys.readouterr().err


@pytest.fixture
def manifest(tmp_path: Path) -> str:
    (tmp_path / "m.csv").write_text("id,prompt\na,one\n")
    return f"{tmp_path / 'm.csv'} --out {tmp_path / 'out'} --work-pool {POOL} --base-url embedded"


@pytest.fixture
def git_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The working directory a clone of a repository: a commit and an `origin` remote, from which Prefect
    infers a deployment's version (CI deploys from such a clone; a repository without a remote does not
    show it). Returns the commit's short hash."""
    repo = tmp_path / "clone"
    repo.mkdir()
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}  # fmt: skip
    for command in (
        ["git", "init", "-q"],
        ["git", "remote", "add", "origin", "https://example.invalid/team/catalog.git"],
        ["git", "commit", "-q", "--allow-empty", "-m", "nightly"],
    ):
        subprocess.run(command, cwd=repo, env=env, check=True)
    monkeypatch.chdir(repo)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True)
    return head.stdout.strip()[:8]


def test_the_metadata_flags_are_stored_as_given_and_the_time_zone_is_utc(
    server: PrefectServer, manifest: str, git_checkout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    call(server, "POST", f"/work_pools/{POOL}/queues", {"name": "night"})
    flags = (
        "--tag catalog --tag nightly --description 'the nightly catalog' --version 2026.11 --paused "
        '--work-queue night --job-variable working_dir=/srv/ib --job-variable \'env={"TZ": "UTC"}\' '
        "--cron '0 2 * * *'"
    )
    code, err = deploy(server, f"{manifest} --name meta {flags}", capsys)
    assert code == 0, err
    stored = call(server, "GET", "/deployments/name/generate_from_manifest/meta")
    assert stored["tags"] == ["imagebatch", "catalog", "nightly"]
    assert stored["description"] == "the nightly catalog" and stored["version"] == "2026.11"
    assert stored["work_queue_name"] == "night" and stored["paused"] is True
    assert stored["job_variables"] == {
        "working_dir": "/srv/ib",
        "env": {"TZ": "UTC", "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"},  # the heartbeat stays
    }
    [schedule] = stored["schedules"]
    assert schedule["schedule"]["cron"] == "0 2 * * *" and schedule["schedule"]["timezone"] == "UTC"

    code, err = deploy(server, f"{manifest} --name meta --cron '0 2 * * *' --timezone Europe/Paris", capsys)
    assert code == 0, err
    again = call(server, "GET", "/deployments/name/generate_from_manifest/meta")
    assert again["schedules"][0]["schedule"]["timezone"] == "Europe/Paris" and again["paused"] is False
    assert again["tags"] == ["imagebatch"] and again["description"] is None  # what the command says
    assert again["version"] == git_checkout  # without --version, the clone's commit (Prefect's inference)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ("--job-variable working_dir", "--job-variable 'working_dir': give KEY=VALUE"),
        ('--job-variable \'env={"IMAGEBATCH_API_KEY": "k"}\'', "IMAGEBATCH_API_KEY would be stored"),
        ("--notify nobody", "--notify 'nobody': name a notification block TYPE/NAME"),
        ("--notify custom-webhook/missing", "--notify custom-webhook/missing: no such block"),
    ],
)
def test_bad_metadata_is_refused_in_one_line_and_nothing_is_deployed(
    server: PrefectServer, manifest: str, capsys: pytest.CaptureFixture[str], flags: str, says: str
) -> None:
    code, err = deploy(server, f"{manifest} --name refused {flags}", capsys)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    response = httpx.get(f"{server.api_url}/deployments/name/generate_from_manifest/refused", timeout=90)
    assert response.status_code == 404


class Hook(BaseHTTPRequestHandler):
    received: queue.Queue[dict[str, Any]] = queue.Queue()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.put(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        """Quiet."""


@pytest.fixture
def webhook() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    httpd.shutdown()
    httpd.server_close()


def test_notify_sends_a_failed_runs_name_state_and_counts_to_the_block(
    server: PrefectServer, manifest: str, capsys: pytest.CaptureFixture[str], webhook: str
) -> None:
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    hook = CustomWebhookNotificationBlock(
        name="team", url=webhook, json_data={"subject": "{{subject}}", "text": "{{body}}"}
    )
    with prefect_api(server.api_url):
        hook.save("ops", overwrite=True)
    code, err = deploy(server, f"{manifest} --name told --notify custom-webhook/ops", capsys)
    assert code == 0, err
    code, err = deploy(server, f"{manifest} --name told --notify custom-webhook/ops", capsys)
    assert code == 0, err  # a second deploy keeps one automation
    told = [
        a for a in call(server, "POST", "/automations/filter", {}) if "notify custom-webhook/ops" in a["name"]
    ]
    assert len(told) == 1

    deployment = call(server, "GET", "/deployments/name/generate_from_manifest/told")
    run = call(server, "POST", f"/deployments/{deployment['id']}/create_flow_run", {"name": "night-42"})
    message = "imagebatch: 1 of 4 requests not done (3 succeeded, 1 no_image)"
    # What a worker's run that ends Failed looks like to the server, without a worker: its state events.
    # One at a time, each seen by the events service first: SQLite, on a busy machine, is locked by the
    # services' concurrent writes (the triggers service retries, then drops the event).
    for state in ({"type": "RUNNING"}, {"type": "FAILED", "message": message}):
        call(server, "POST", f"/flow_runs/{run['id']}/set_state", {"state": state, "force": True})
        seen_event(server, run["id"], f"prefect.flow-run.{state['type'].title()}")
    sent = Hook.received.get(timeout=120)  # the server's automations service sends it
    assert sent["subject"] == "imagebatch: a run of generate_from_manifest/told ended Failed", sent
    assert "night-42" in sent["text"] and "Failed" in sent["text"] and message in sent["text"], sent


def seen_event(server: PrefectServer, flow_run_id: str, name: str, timeout: float = 60) -> None:
    """Wait (bounded) until the server's events hold `name` for the flow run."""
    import time

    body = {"filter": {"event": {"name": [name]}, "resource": {"id": [f"prefect.flow-run.{flow_run_id}"]}}}
    deadline = time.monotonic() + timeout
    while not call(server, "POST", "/events/filter", body)["total"]:
        assert time.monotonic() < deadline, f"no {name} event after {timeout} s"
        time.sleep(0.2)


def test_prefect_deploy_without_an_address_ends_in_its_one_line_refusal(
    server: PrefectServer, tmp_path: Path
) -> None:
    """prefect.yaml's build step runs in `prefect deploy`'s process: its refusal is the one line, the exit
    code 2, and no traceback (a failed `run_shell_script` step printed two around it)."""
    import os
    import subprocess
    import sys

    from imagebatch.run.preflight import NO_SERVICE

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "IMAGEBATCH_"))}
    env |= {"PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(tmp_path / "home"), "PWD": str(repo)}
    command = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--name", "nightly-yaml"]
    done = subprocess.run(
        command, cwd=repo, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert NO_SERVICE in said and "Traceback" not in said, said
    response = httpx.get(f"{server.api_url}/deployments/name/generate_from_manifest/nightly-yaml", timeout=90)
    assert response.status_code == 404
