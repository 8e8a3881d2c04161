"""Sharded deployments on real Prefect components (`helpers.prefect_stack`): where the shards run when
workers have one slot (`--limit 1`): the parent runs a shard in its own slot on one worker, one shard per
machine on two, and two machines that share nothing write into a bucket; and a shard's run is made once
when its creation is asked twice, and asked again when its creation's answer is lost. What a sharded run
keeps across its shards: test_deploy_shards.py.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import pytest
from helpers.lossy_proxy import LossyProxy
from helpers.prefect_server import create_process_pool, prefect_api, running_worker, submitted_by
from helpers.prefect_stack import (  # the fixtures: stacks and prefect_harness (none here)
    Stack,
    no_session_harness,  # noqa: F401
    started_stacks,  # noqa: F401
)

from imagebatch.emulator import EmulatorServer, EmulatorSettings

pytestmark = pytest.mark.slow  # Prefect servers (helpers.shared_servers) and workers

STACK_BACKENDS = ("sqlite",)
"""Every test here runs on SQLite: the module's `stacks` start no PostgreSQL server."""


def _sharded_deploy(stack: Stack, tmp_path: Path, pool: str, emulator: EmulatorServer, timeout: float) -> str:
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,prompt\n" + "".join(f"p{i:03d},thing {i}\n" for i in range(16)))
    code = stack.deploy(
        f"{manifest} --out {tmp_path / 'out'} --name {pool} --work-pool {pool} --shards 2 --concurrency 4 "
        f"--base-url {emulator.url} --shard-start-timeout {timeout:g}"
    )
    assert code == 0
    return str(stack.deployment(pool)["id"])


def _unpolled_sharded_deploy(stack: Stack, tmp_path: Path, pool: str) -> str:
    """A sharded deployment on a new pool that no worker polls: the shard runs made stay Scheduled."""
    create_process_pool(stack.api, pool)
    with EmulatorServer(EmulatorSettings(api_key=stack.emulator.api_key, seed=0)) as emulator:
        return _sharded_deploy(stack, tmp_path, pool, emulator, 3)


@contextlib.contextmanager
def _shard_children() -> Iterator[dict[int, bytes]]:
    """The environment (`/proc/PID/environ`) of every `imagebatch.run.shard_child` process seen while
    the block runs (polled; a shard child lives for seconds)."""
    seen: dict[int, bytes] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit() or int(proc.name) in seen:
                    continue
                with contextlib.suppress(OSError):
                    if b"imagebatch.run.shard_child" in (proc / "cmdline").read_bytes():
                        seen[int(proc.name)] = (proc / "environ").read_bytes()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(timeout=30)


def test_shards_on_one_worker_with_limit_1_do_not_deadlock(
    stacks: dict[str, Stack | None], tmp_path: Path
) -> None:
    """Issue 20, item 5: one worker started with `--limit 1`: the parent holds its only slot, so it runs
    shard 0 itself at once and shard 1 once no worker has started it within the start timeout. The rerun
    has nothing to send: it starts no shard run at all (issue 30: it used to start both, and wait the start
    timeout for the second)."""
    from collections import Counter

    stack = stacks["sqlite"]
    assert stack is not None
    pool = "imagebatch-one-slot"
    create_process_pool(stack.api, pool)
    key = stack.emulator.api_key
    env = {"IMAGEBATCH_API_KEY": key, "PREFECT_HOME": str(tmp_path / "w")}
    with (
        EmulatorServer(EmulatorSettings(api_key=key, seed=0, jpeg_rate=0.0, latency=0.2)) as emulator,
        running_worker(stack.api, pool, env, tmp_path / "w.log", extra_args=("--limit", "1"), stop_grace=3),
        _shard_children() as children,
    ):
        deployment_id = _sharded_deploy(stack, tmp_path, pool, emulator, 3)
        parent = stack.wait(stack.run(deployment_id), timeout=240)
        assert parent["state_type"] == "COMPLETED", parent["state"]
        run = json.loads((tmp_path / "out" / "run.json").read_text())
        rerun = stack.wait(stack.run(deployment_id), timeout=240)
    # The shards the parent ran got the key on stdin (they sent with it), never in their environment.
    assert children and not [pid for pid, environ in children.items() if key.encode() in environ]
    assert [(s["state"], s["here"]) for s in run["shard_runs"]] == [("COMPLETED", True), ("COMPLETED", True)]
    sent = Counter(r["idempotency_key"] for r in emulator.requests())
    assert len(sent) == 16 and set(sent.values()) == {1}
    assert rerun["state_type"] == "COMPLETED", rerun["state"]
    again = json.loads((tmp_path / "out" / "run.json").read_text())
    assert again["shard_runs"] == [] and again["counts"]["skipped"] == sum(again["counts"].values()) == 16
    assert submitted_by(tmp_path / "w.log") == {parent["id"], rerun["id"]}
    shard_runs = stack.post("/flow_runs/filter", {"deployments": {"name": {"any_": [f"{pool}-shards"]}}})
    assert len(shard_runs) == 2  # the first run's two; the rerun made none


def test_two_shards_on_two_workers_with_limit_1_run_one_per_worker(
    stacks: dict[str, Stack | None], tmp_path: Path
) -> None:
    """Issue 20, item 5: two workers, each `--limit 1`, two shards: the parent (on one worker) runs one
    shard, the other worker takes the other; no deadlock, one shard per machine."""
    from collections import Counter

    stack = stacks["sqlite"]
    assert stack is not None
    pool = "imagebatch-two-slots"
    create_process_pool(stack.api, pool)
    key = stack.emulator.api_key
    logs = [tmp_path / "w1.log", tmp_path / "w2.log"]
    with ExitStack() as workers:
        emulator = workers.enter_context(
            EmulatorServer(EmulatorSettings(api_key=key, seed=0, jpeg_rate=0.0, latency=0.2))
        )
        for i, log in enumerate(logs):
            env = {"IMAGEBATCH_API_KEY": key, "PREFECT_HOME": str(tmp_path / f"w{i}")}
            workers.enter_context(
                running_worker(stack.api, pool, env, log, extra_args=("--limit", "1"), stop_grace=3)
            )
        parent = stack.wait(stack.run(_sharded_deploy(stack, tmp_path, pool, emulator, 120)), timeout=240)
    assert parent["state_type"] == "COMPLETED", parent["state"]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    shard_runs = run["shard_runs"]
    assert {s["state"] for s in shard_runs} == {"COMPLETED"}
    # The parent claims the first shard no worker has (shard 0, or shard 1 when a worker was quicker).
    [in_parent] = [s["flow_run_id"] for s in shard_runs if s["here"]]
    [on_worker] = [s["flow_run_id"] for s in shard_runs if not s["here"]]
    by_worker = [submitted_by(log) for log in logs]
    parents_worker = next(i for i, ran in enumerate(by_worker) if parent["id"] in ran)
    assert by_worker[1 - parents_worker] == {on_worker}  # the other machine
    assert by_worker[parents_worker] == {parent["id"]}  # the other shard ran in the parent's slot
    assert in_parent not in by_worker[0] | by_worker[1]
    sent = Counter(r["idempotency_key"] for r in emulator.requests())
    assert len(sent) == 16 and set(sent.values()) == {1}


def test_a_sharded_deployment_into_a_bucket_on_two_machines_that_share_nothing_writes_everything_once(
    stacks: dict[str, Stack | None], s3: Any, tmp_path: Path
) -> None:
    """Issue 19, item 4: `deploy --shards 2 --out s3://...`, two real workers (`--limit 1`) whose working
    folder, HOME, PREFECT_HOME and TMPDIR are their own empty folders, each with the store's address and
    credentials in its environment: the parent runs one shard, the other machine the other; each request
    is sent once (the emulator's request log), results.csv is whole in the bucket, the journal is one
    compacted object, and neither the key nor the store's secret is in an object, the deployment, or a
    shard child's environment."""
    stack = stacks["sqlite"]
    assert stack is not None
    pool = "imagebatch-bucket"
    create_process_pool(stack.api, pool)
    key = stack.emulator.api_key
    bucket = s3.bucket()
    url = f"s3://{bucket}/nightly"
    manifest = tmp_path / "deployer" / "m.csv"
    manifest.parent.mkdir()
    manifest.write_text("id,prompt\n" + "".join(f"b{i:03d},thing {i}\n" for i in range(16)))
    machines = [tmp_path / f"machine-{i}" for i in range(2)]
    with ExitStack() as workers:
        emulator = workers.enter_context(
            EmulatorServer(EmulatorSettings(api_key=key, seed=0, jpeg_rate=0.0, latency=0.2))
        )
        for i, home in enumerate(machines):
            workers.enter_context(_machine(stack, pool, home, {"IMAGEBATCH_API_KEY": key, **s3.env()}, i))
        code = stack.deploy(
            f"{manifest} --out {url} --name {pool} --work-pool {pool} --shards 2 --concurrency 4 "
            f"--base-url {emulator.url} --shard-start-timeout 120"
        )
        assert code == 0
        deployment = stack.deployment(pool)
        with _shard_children() as children:
            parent = stack.wait(stack.run(str(deployment["id"])), timeout=240)
    assert parent["state_type"] == "COMPLETED", parent["state"]
    assert deployment["parameters"]["out"] == url

    objects = s3.objects(bucket, "nightly")
    _written_once_into_the_bucket(objects, emulator.requests(), tmp_path, 16)
    [journal] = [n for n in objects if n.startswith("journal/")]  # the shards' segments, compacted
    assert journal.endswith("-compact.jsonl")
    assert {".imagebatch.lease", ".imagebatch.shard-0-of-2.lease", ".imagebatch.shard-1-of-2.lease"} <= set(
        objects
    )
    assert not [p for home in machines for p in home.rglob("*") if p.suffix in (".png", ".csv", ".jsonl")]
    secrets_ = (key.encode(), s3.secret_key.encode())
    assert not [name for name, data in objects.items() if any(s in data for s in secrets_)]
    assert s3.secret_key not in json.dumps(deployment) and key not in json.dumps(deployment)
    assert children and not [pid for pid, env in children.items() if any(s in env for s in secrets_)]


def _machine(stack: Stack, pool: str, home: Path, env: dict[str, str], i: int) -> AbstractContextManager[Any]:
    """A worker (`--limit 1`) on a machine of its own: its working folder, HOME, PREFECT_HOME and TMPDIR
    are its own empty folders; `env` adds the key and the store's address and credentials."""
    (home / "tmp").mkdir(parents=True)
    env = {**env, "HOME": str(home), "PREFECT_HOME": str(home / ".prefect"), "TMPDIR": str(home / "tmp")}
    log = home.parent / f"w{i}.log"
    return running_worker(stack.api, pool, env, log, extra_args=("--limit", "1"), stop_grace=3, cwd=home)


def _written_once_into_the_bucket(
    objects: dict[str, bytes], requests: list[dict[str, Any]], scratch: Path, total: int
) -> None:
    """One shard on each machine, both Completed; results.csv whole, every image a PNG, the report and its
    thumbnails there; each key sent exactly once over both machines (the emulator's request log)."""
    from collections import Counter

    from helpers.runs import read_results

    run = json.loads(objects["run.json"])
    assert [s["state"] for s in run["shard_runs"]] == ["COMPLETED", "COMPLETED"]
    assert sorted(s["here"] for s in run["shard_runs"]) == [False, True]
    (scratch / "results.csv").write_bytes(objects["results.csv"])
    rows = read_results(scratch)
    assert len(rows) == total and {r["status"] for r in rows} == {"succeeded"}
    assert all(objects[p].startswith(b"\x89PNG") for r in rows for p in r["paths"].split(";"))
    assert "report.html" in objects and len([n for n in objects if n.startswith("thumbs/")]) == total
    sent = Counter(r["idempotency_key"] for r in requests)
    assert len(sent) == total and set(sent.values()) == {1}


def test_a_shard_run_asked_for_twice_is_made_once(stacks: dict[str, Stack | None], tmp_path: Path) -> None:
    """A shard's flow run is created under an idempotency key of the parent run and the shard: when the
    client asks again after an answer it did not get (the SQLite server stalled), the server gives back
    the same run. Before, the second ask made a second 'shard 0-of-2' run that nobody tracked, and the
    worker started it once the sharded run had ended (it refused itself, but ran)."""
    import time

    from prefect import flow

    from imagebatch.run.shard_creation import create_shard_runs

    stack = stacks["sqlite"]
    assert stack is not None
    pool = "imagebatch-shard-once"
    deployment_id = _unpolled_sharded_deploy(stack, tmp_path, pool)

    @flow(name="parent-asking-twice")
    def parent() -> tuple[list[str], list[str]]:
        ask = {0: {}, 1: {}}
        first = create_shard_runs(f"generate_from_manifest/{pool}", ask, 2, time.monotonic)
        again = create_shard_runs(f"generate_from_manifest/{pool}", ask, 2, time.monotonic)
        return [str(r) for r in first.values()], [str(r) for r in again.values()]

    with prefect_api(stack.api):
        first, again = parent()
    assert first == again and len(set(first)) == 2
    runs = stack.post("/flow_runs/filter", {"deployments": {"id": {"any_": [deployment_id]}}})
    assert sorted(r["name"] for r in runs) == ["shard 0-of-2", "shard 1-of-2"]


def test_a_shard_runs_creation_whose_answer_is_lost_is_asked_again_and_made_once(
    stacks: dict[str, Stack | None], tmp_path: Path
) -> None:
    """The server makes the first shard's run, twice asked, and each time its answer is lost (503 from a
    proxy, as Prefect's SQLite server answers while its database is locked), and Prefect's client does not
    retry (none left: it retries for about a minute first): the parent asks again 5 s and then 10 s later
    (its sleep, recorded here, not slept), and gets the run made the first time; one run per shard.
    Prefect's server also answers 503 of its own at times (without retries, SQLite's lock shows): the
    parent asks again after those too."""
    import time

    from prefect import flow

    from imagebatch.run.shard_creation import create_shard_runs

    stack = stacks["sqlite"]
    assert stack is not None
    pool = "imagebatch-shard-lost-answer"
    deployment_id = _unpolled_sharded_deploy(stack, tmp_path, pool)
    waits: list[float] = []

    @flow(name="parent-whose-answer-is-lost")
    def parent() -> list[str]:
        made = create_shard_runs(
            f"generate_from_manifest/{pool}", {0: {}, 1: {}}, 2, time.monotonic, waits.append
        )
        return [str(r) for r in made.values()]

    def creation(method: str, path: str) -> bool:
        return method == "POST" and path.endswith("/create_flow_run")

    with (
        LossyProxy(stack.api, creation, lose=2) as proxy,
        prefect_api(proxy.url, PREFECT_CLIENT_MAX_RETRIES=0),
    ):
        made = parent()
    # Asked again after each lost answer, and after a 503 of the server's own (SQLite's busy snapshot).
    assert len(proxy.lost) == 2 and waits[:2] == [5.0, 10.0]
    assert len(waits) <= 2 + len(proxy.failed), (waits, proxy.failed)
    runs = stack.post("/flow_runs/filter", {"deployments": {"id": {"any_": [deployment_id]}}})
    assert sorted(r["name"] for r in runs) == ["shard 0-of-2", "shard 1-of-2"]
    assert sorted(made) == sorted(r["id"] for r in runs)
