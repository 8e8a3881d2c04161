"""Attacks on a deployment through Prefect's REST API, on a real `prefect server start`, an emulator and
`imagebatch worker` with its allow-lists (`--allow-out ROOT --allow-base-url EMULATOR`): each run is
started as anyone who can reach the API would start it (`create_flow_run` with parameters of their
choosing), and each must end Failed with one line, with nothing sent and nothing written. The decisions
themselves, without Prefect, are tested in tests/run/test_trust.py."""

from __future__ import annotations

import copy
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from helpers.emulator import run_emulator_settings
from helpers.prefect_server import (
    PrefectServer,
    base_environment,
    call,
    prefect_api,
    stop_process_group,
    wait_for,
)
from helpers.shared_servers import PrefectServers

from imagebatch.cli.main import main
from imagebatch.emulator import EmulatorServer

pytestmark = pytest.mark.slow  # a Prefect server (helpers.shared_servers) and a worker

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "manifests" / "examples" / "catalog.csv"
FLOW = "generate_from_manifest"
POOL = "trust-pool"
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
KEY = f"sk-trust-{secrets.token_hex(8)}"  # what the worker holds


@pytest.fixture(scope="module", autouse=True)
def prefect_harness() -> None:
    """Overrides the session's harness: everything here talks to the server below."""


class Catcher(BaseHTTPRequestHandler):
    """A host that would collect whatever is sent to it: it records each request's headers."""

    seen: ClassVar[list[dict[str, str]]] = []

    def _any(self) -> None:
        Catcher.seen.append(dict(self.headers))
        self.send_response(500)
        self.end_headers()

    do_GET = do_POST = _any

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class Scene:
    server: PrefectServer
    emulator: EmulatorServer
    catcher: str
    root: Path
    worker_log: Path
    deployment: dict[str, Any]

    def attack(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """A REST run of the deployment with these parameters, waited for to its end (bounded)."""
        path = f"/deployments/{self.deployment['id']}/create_flow_run"
        run_id = call(self.server, "POST", path, {"parameters": parameters})["id"]
        return dict(wait_for(
            f"flow run {run_id} final",
            lambda: (r := call(self.server, "GET", f"/flow_runs/{run_id}"))["state_type"] in FINAL and r,
            180, self.worker_log,
        ))  # fmt: skip

    def refused(self, run: dict[str, Any], reason: str) -> None:
        """Failed with one line that starts with `reason`, nothing sent, its log without a traceback."""
        assert run["state_type"] == "FAILED", run["state"]
        message = run["state"]["message"]
        assert message.startswith("imagebatch refused: " + reason), message
        assert "\n" not in message
        assert self.emulator.requests() == [] and self.emulator.ledger() == []

        def logs() -> list[dict[str, Any]] | None:
            body = {"logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200}
            found = list(call(self.server, "POST", "/logs/filter", body))
            return found if any(log["message"].startswith("Refused: ") for log in found) else None

        text = "\n".join(
            log["message"] for log in wait_for("the refusal's log line", logs, 180, self.worker_log)
        )
        assert "Traceback" not in text and "unexpected exception" not in text, text


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory, prefect_servers: PrefectServers) -> Iterator[Scene]:
    """One server, one emulator, a catcher, the catalog deployed into ROOT/nightly, and `imagebatch worker`
    allowed ROOT and the emulator only."""
    home = tmp_path_factory.mktemp("trust")
    root = home / "root"
    root.mkdir()
    catcher = ThreadingHTTPServer(("127.0.0.1", 0), Catcher)
    threading.Thread(target=catcher.serve_forever, daemon=True).start()
    server = prefect_servers.sqlite(POOL)
    with EmulatorServer(run_emulator_settings(KEY)) as emulator:
        _deploy(server, f"{CATALOG} --out {root / 'nightly'} --name nightly --work-pool {POOL} "
                f"--base-url {emulator.url}")  # fmt: skip
        env = {"IMAGEBATCH_API_KEY": KEY, "PREFECT_HOME": str(home / "worker-home"),
               "PREFECT_API_URL": server.api_url, "PREFECT_WORKER_QUERY_SECONDS": "1"}  # fmt: skip
        command = [sys.executable, "-m", "imagebatch.cli.main", "worker", "--pool", POOL,
                   "--allow-out", str(root), "--allow-base-url", emulator.url]  # fmt: skip
        worker_log = home / "worker.log"
        with open(worker_log, "ab") as log:
            worker = subprocess.Popen(
                command, env=base_environment(env), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        deployment = call(server, "GET", f"/deployments/name/{FLOW}/nightly")
        try:
            yield Scene(
                server, emulator, f"http://127.0.0.1:{catcher.server_port}", root, worker_log, deployment
            )
        finally:
            stop_process_group(worker, grace=3)
            catcher.shutdown()
            catcher.server_close()


def _deploy(server: PrefectServer, arguments: str) -> None:
    import shlex

    with prefect_api(server.api_url):
        assert main(["deploy", *shlex.split(arguments)]) == 0


def _options(scene: Scene, **group_changes: dict[str, Any]) -> dict[str, Any]:
    """The deployment's own options, with some groups' fields changed."""
    options = copy.deepcopy(scene.deployment["parameters"]["options"])
    for group, changes in group_changes.items():
        options[group].update(changes)
    return options


def test_a_run_with_force_is_refused(scene: Scene) -> None:
    scene.emulator.reset()
    run = scene.attack({"options": _options(scene, resend={"force": True})})
    scene.refused(run, "options force=true but deployment generate_from_manifest/nightly was made with")
    run = scene.attack({"options": _options(scene, resend={"retry_unknown": True})})
    scene.refused(run, "options retry_unknown=true")


def test_an_out_outside_the_workers_roots_is_refused(scene: Scene, tmp_path: Path) -> None:
    scene.emulator.reset()
    elsewhere = tmp_path / "elsewhere"
    (scene.root / "link").symlink_to(tmp_path)
    for out in (elsewhere, scene.root / ".." / "elsewhere", scene.root / "link" / "elsewhere"):
        scene.refused(scene.attack({"out": str(out)}), f"out {out} is outside this worker's output roots")
    assert not elsewhere.exists()  # nothing written, not even the folder


def test_a_base_url_to_another_host_gets_no_key(scene: Scene) -> None:
    scene.emulator.reset()
    run = scene.attack({"options": _options(scene, service={"base_url": scene.catcher})})
    scene.refused(run, f"base_url {scene.catcher} is not one of this worker's services")
    assert Catcher.seen == []


def test_a_hand_set_role_is_refused(scene: Scene) -> None:
    scene.emulator.reset()
    run = scene.attack({"role": {"shard": 0}})
    scene.refused(run, "role {'shard': 0} is set by imagebatch for a sharded run's parts, never by hand")
    assert not (scene.root / "nightly" / "results.csv").exists()


def test_a_run_into_another_folder_inside_the_roots_is_sent(scene: Scene) -> None:
    """What the worker allows still runs: the allow-list is a bound, not a block."""
    scene.emulator.reset()
    run = scene.attack({"out": str(scene.root / "other")})
    assert run["state_type"] == "COMPLETED", run["state"]
    assert len(scene.emulator.ledger()) == 6
    assert (scene.root / "other" / "results.csv").exists()


def test_an_unknown_parameter_is_refused_by_the_server_and_no_run_starts(scene: Scene) -> None:
    """The deployment's schema is closed (`platform.deploy.closed_schema`): the server answers 409 naming
    the parameter, so no run exists to crash in Prefect's engine."""
    scene.emulator.reset()
    runs = {"flow_runs": {"deployment_id": {"any_": [scene.deployment["id"]]}}}
    before = len(call(scene.server, "POST", "/flow_runs/filter", runs))
    path = f"/deployments/{scene.deployment['id']}/create_flow_run"
    with pytest.raises(httpx.HTTPStatusError) as refused:
        call(scene.server, "POST", path, {"parameters": {"bogus": 1}})
    assert refused.value.response.status_code == 409
    answer = refused.value.response.json()["detail"]
    assert answer.endswith("'bogus' is not one of ['manifest', 'options', 'out', 'role']"), answer
    assert len(call(scene.server, "POST", "/flow_runs/filter", runs)) == before
    assert scene.emulator.requests() == []
