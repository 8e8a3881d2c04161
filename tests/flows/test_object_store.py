"""`--out s3://bucket/prefix`: runs into a real S3-compatible server (moto, on 127.0.0.1) with the same
guarantees as a local folder (issue 19)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import cli, summary_counts

from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE
from imagebatch.work.store import OutputStore


def _results(objects: dict[str, bytes]) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(objects["results.csv"].decode())))


def test_a_run_into_a_bucket_writes_every_record_and_its_rerun_sends_nothing(
    s3: Any, examples: Path, capsys: Any, service_env: Any
) -> None:
    bucket = s3.bucket()
    url = f"s3://{bucket}/catalog"
    code, out, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", url, "--concurrency", "4")
    assert code == EXIT_OK, err
    objects = s3.objects(bucket, "catalog")
    rows = _results(objects)
    assert rows and {r["status"] for r in rows} == {"succeeded"}
    for row in rows:
        for path in row["paths"].split(";"):
            assert objects[path].startswith((b"\x89PNG", b"\xff\xd8\xff")), path
    assert [n for n in objects if n.startswith("journal/")] == ["journal/00000001-compact.jsonl"]
    run = json.loads(objects["run.json"])
    assert run["state"] == "finished" and run["out"] == url
    assert "report.html" in objects and any(n.startswith("thumbs/") for n in objects)
    assert "usage-summary.csv" in objects and ".imagebatch.lease" in objects
    assert f"imagebatch: {len(rows)} requests -> {url}" in out
    # The API key and the store's secret are in no object.
    for name, data in objects.items():
        assert service_env.api_key.encode() not in data, name
        assert s3.secret_key.encode() not in data, name
    sent = len(service_env.requests())
    assert sent == len(rows)

    code, out, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", url)
    assert code == EXIT_OK, err
    assert len(service_env.requests()) == sent  # the rerun sent nothing
    assert summary_counts(out) == {"skipped": len(rows)}
    assert {r["status"] for r in _results(s3.objects(bucket, "catalog"))} == {"skipped"}

    s3.client.delete_object(Bucket=bucket, Key="catalog/report.html")
    code, out, err = cli(capsys, "report", url)
    assert code == EXIT_OK and out.strip() == f"{url}/report.html", err
    page = s3.objects(bucket, "catalog")["report.html"].decode()
    assert page.count('<img loading="lazy" src="thumbs/') == len(rows)  # the thumbnails kept, not remade


def test_a_second_live_run_on_one_prefix_exits_2(
    s3: Any, examples: Path, capsys: Any, service_env: Any
) -> None:
    url = f"s3://{s3.bucket()}/held"
    with OutputStore(url).backend.hold():
        code, _, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", url)
    assert code == EXIT_USAGE, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"is using {url}: wait for it to finish" in lines[0]
    assert "another imagebatch run (" in lines[0] and "Traceback" not in err
    assert service_env.requests() == []


@pytest.mark.parametrize("fault", ["missing bucket", "bad credentials"])
def test_a_missing_bucket_or_refused_credentials_exit_2_before_prefect_starts(
    fault: str, s3: Any, examples: Path, capsys: Any, service_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = "no-such-bucket-ib" if fault == "missing bucket" else s3.bucket()
    if fault == "bad credentials":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "a-wrong-secret-value")
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # Prefect would fail, were it reached
    code, _, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", f"s3://{bucket}/x")
    assert code == EXIT_USAGE, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"--out s3://{bucket}/x: " in lines[0], err
    cause = "does not exist (NoSuchBucket" if fault == "missing bucket" else "refused the credentials"
    assert f"the bucket '{bucket}' " in lines[0]
    assert cause in lines[0] and lines[0].endswith("nothing was sent.")
    assert "a-wrong-secret-value" not in err and s3.secret_key not in err
    assert service_env.requests() == []


@pytest.fixture
def faults(s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fault-injecting proxy in front of the S3 server, the run's store pointed at it, and obstore's
    backoff shortened (the same retries, waits of milliseconds)."""
    from datetime import timedelta

    from helpers.s3 import FaultProxy

    import imagebatch.storage.objectstore as objectstore

    proxy = FaultProxy(s3.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    quick = {"init_backoff": timedelta(milliseconds=5), "max_backoff": timedelta(milliseconds=50), "base": 2}
    monkeypatch.setattr(objectstore, "RETRY", {**objectstore.RETRY, "backoff": quick})
    yield proxy
    proxy.stop()


def test_throttling_errors_and_dropped_connections_are_retried(
    faults: Any, s3: Any, examples: Path, capsys: Any, service_env: Any
) -> None:
    script = {2: 503, 3: 500}  # two early requests (the preflight's)
    image_faults = {2: 503, 4: 500, 6: "drop"}  # the 2nd, 4th and 6th image PUTs
    seen = {"images": 0, "journal": 0}

    def rule(method: str, path: str, n: int) -> Any:
        if n in script:
            return script[n]
        for kind in seen:
            if method == "PUT" and f"/{kind}/" in path:
                seen[kind] += 1
                if kind == "images":
                    return image_faults.get(seen[kind])
                if seen[kind] == 3:
                    return (
                        "drop-after"  # the segment landed, its answer was lost: the retried create finds it
                    )
        return None

    faults.rule = rule
    bucket = s3.bucket()
    url = f"s3://{bucket}/faults"
    code, _, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", url, "--concurrency", "4")
    assert code == EXIT_OK, err
    injected = [f for _, _, f in faults.log if f is not None]
    assert {503, 500, "drop", "drop-after"} <= set(injected), injected
    rows = _results(s3.objects(bucket, "faults"))
    assert {r["status"] for r in rows} == {"succeeded"}
    received = [r["idempotency_key"] for r in service_env.requests()]
    assert len(received) == len(set(received)) == len(rows)  # nothing sent twice


def test_a_store_that_fails_for_good_stops_the_run_as_a_full_disk_does(
    faults: Any, s3: Any, tmp_path: Path, capsys: Any, service_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import imagebatch.storage.objectstore as objectstore

    monkeypatch.setattr(objectstore, "RETRY", {**objectstore.RETRY, "max_retries": 2})
    images = [0]

    def rule(method: str, path: str, n: int) -> Any:
        if method == "PUT" and "/images/" in path:
            images[0] += 1
            return 500 if images[0] > 3 else None  # three images saved, then the store fails for good
        return None

    faults.rule = rule
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(json.dumps({"id": f"j{i:02d}", "prompt": f"vase {i}"}) + "\n" for i in range(30))
    )
    bucket = s3.bucket()
    url = f"s3://{bucket}/broken"
    code, out, err = cli(capsys, "run", str(manifest), "--out", url, "--concurrency", "2")
    assert code == 1, err
    assert f"Stopped early: cannot write to {url}: writing {url}/images/" in err
    assert "InternalError, HTTP 500: fix it, then rerun" in err
    counts = summary_counts(out)
    assert counts["succeeded"] == 3 and counts.get("unknown", 0) >= 1 and counts.get("not_attempted", 0) >= 20
    sent = len(service_env.requests())
    assert sent == counts["succeeded"] + counts["unknown"]  # nothing sent after the failed write

    faults.rule = lambda method, path, n: None
    code, out, err = cli(capsys, "run", str(manifest), "--out", url, "--concurrency", "2")
    assert summary_counts(out) == {
        "skipped": 3,
        "unknown": counts["unknown"],
        "succeeded": 30 - 3 - counts["unknown"],
    }
    received = [r["idempotency_key"] for r in service_env.requests()]
    assert len(received) == len(set(received))


def test_kill_9_mid_run_then_a_rerun_from_another_folder_and_home_sends_nothing_twice(
    s3: Any, service_env: Any, prefect_harness: str, tmp_path: Path
) -> None:
    from collections import Counter

    from helpers.runs import kill_mid_run
    from test_crash import JOBS, PASS_FIRST

    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(json.dumps({"id": f"job{i:02d}", "prompt": f"crash {i}"}) + "\n" for i in range(JOBS))
    )
    bucket = s3.bucket()
    url = f"s3://{bucket}/killed"
    kill_mid_run(service_env, prefect_harness, manifest, url, let_through=PASS_FIRST, concurrency=3)
    states = OutputStore(url).load_state()
    in_doubt = {k for k, s in states.items() if s.status == "unknown"}
    assert in_doubt and any(s.status == "succeeded" for s in states.values())
    before = Counter(r["idempotency_key"] for r in service_env.requests())

    # The dead run's lease is live for LEASE_SECONDS: the next run is refused until then ...
    elsewhere = tmp_path / "machine-b"
    elsewhere.mkdir()
    env = {**os.environ, "HOME": str(elsewhere), "PREFECT_HOME": str(elsewhere / ".prefect")}
    cmd = [
        sys.executable,
        "-m",
        "imagebatch.cli.main",
        "run",
        str(manifest),
        "--out",
        url,
        "--concurrency",
        "3",
    ]
    env |= {"IMAGEBATCH_BASE_URL": service_env.url, "IMAGEBATCH_API_KEY": service_env.api_key}
    env["PREFECT_API_URL"] = prefect_harness
    refused = subprocess.run(cmd, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == EXIT_USAGE and "is using " + url in refused.stderr
    # ... and once it has expired (its expiry moved into the past: the time passed), another machine's
    # run, in another working folder with another HOME, takes the prefix over.
    key = "killed/.imagebatch.lease"
    lease = json.loads(s3.client.get_object(Bucket=bucket, Key=key)["Body"].read())
    s3.client.put_object(Bucket=bucket, Key=key, Body=json.dumps({**lease, "expires_at": 0}).encode())
    rerun = subprocess.run(cmd, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 1, rerun.stderr  # the in-doubt requests stay unknown
    rows = _results(s3.objects(bucket, "killed"))
    statuses = Counter(r["status"] for r in rows)
    assert statuses["unknown"] == len(in_doubt)
    assert statuses["succeeded"] + statuses["skipped"] + statuses["unknown"] == JOBS
    received = Counter(r["idempotency_key"] for r in service_env.requests())
    assert max(received.values()) == 1, received
    assert not set(received - before) & (in_doubt | set(before))


def test_serve_and_deploy_keep_a_buckets_url_as_the_out_parameter(
    s3: Any, examples: Path, service_env: Any
) -> None:
    """Issue 19, item 1: `serve` (its runs run in this process, with this process's key and store
    credentials) and `deploy` check the bucket and keep `--out` as its URL, never a local path."""
    from imagebatch.cli.deploy import request_of
    from imagebatch.cli.main import build_parser
    from imagebatch.errors import UsageError
    from imagebatch.platform.deploy import check, describe

    url = f"s3://{s3.bucket()}/served"
    manifest = str(examples / "catalog.csv")
    args = build_parser().parse_args(["serve", manifest, "--out", url + "/", "--name", "s"])
    parameters = check(request_of(args))
    assert parameters["out"] == url and parameters["manifest"] == manifest
    lines = describe(request_of(args), "http://127.0.0.1:9/api", parameters, None, "pool", "id").splitlines()
    assert f"  out: {url} (a run sends only new and changed rows)" in lines
    assert "  store credentials: each worker's own (environment, profile or role; never a parameter)" in lines
    assert s3.secret_key not in repr(parameters)
    args = build_parser().parse_args(["serve", manifest, "--out", "s3://no-such-bucket-ib/x", "--name", "s"])
    with pytest.raises(UsageError, match="the bucket 'no-such-bucket-ib' does not exist"):
        check(request_of(args))
    assert service_env.requests() == []
