"""`run` and `deploy` of a manifest in a bucket, its reference images in the bucket too (issue 19 item 5),
against a real S3-compatible server (moto on 127.0.0.1) and the emulator over HTTP."""

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
from helpers.images import png
from helpers.runs import cli

from imagebatch.cli.main import build_parser
from imagebatch.emulator.render import Renderer, RenderSpec, images_pixel_size
from imagebatch.run.exit_codes import EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE

REF_A = png(48, 48, (200, 30, 30))
REF_B = png(48, 48, (30, 30, 200))
MANIFEST = (
    "id,prompt,route,model,reference_images\n"
    "a,put the mug on a desk,images,compat-image-2,refs/a.png\n"
    "b,put the mug on a shelf,images,compat-image-2,refs/b.png\n"
)


def _results(objects: dict[str, bytes]) -> dict[str, dict[str, str]]:
    return {r["job_id"]: r for r in csv.DictReader(io.StringIO(objects["results.csv"].decode()))}


def _expected_image(prompt: str, reference: bytes) -> bytes:
    """What the emulator draws for an edit of `reference` on the images route (its default size, seed 0):
    its background is the reference, so other reference bytes give another image."""
    width, height = images_pixel_size("1024x1024")
    spec = RenderSpec(width, height, prompt, 0, label="compat-image-2", references=(reference,))
    return Renderer(cache_size=0).render(spec)


@pytest.fixture
def bucket(s3: Any) -> str:
    """A bucket holding `cat/m.csv` and its two reference images."""
    name = s3.bucket()
    for key, data in {
        "cat/m.csv": MANIFEST.encode(),
        "cat/refs/a.png": REF_A,
        "cat/refs/b.png": REF_B,
    }.items():
        s3.client.put_object(Bucket=name, Key=key, Body=data)
    return name


def test_a_run_of_a_manifest_in_a_bucket_sends_each_references_bytes(
    s3: Any, bucket: str, capsys: Any, service_env: Any
) -> None:
    url, out = f"s3://{bucket}/cat/m.csv", f"s3://{bucket}/out"
    code, _, err = cli(capsys, "run", url, "--out", out, "--concurrency", "2", "--no-report")
    assert code == EXIT_OK, err
    objects = s3.objects(bucket, "out")
    rows = _results(objects)
    assert {r["status"] for r in rows.values()} == {"succeeded"}
    for job, prompt, ref in (("a", "put the mug on a desk", REF_A), ("b", "put the mug on a shelf", REF_B)):
        assert objects[rows[job]["paths"]] == _expected_image(prompt, ref), job
    assert _expected_image("put the mug on a desk", REF_B) != _expected_image("put the mug on a desk", REF_A)
    assert len(service_env.requests()) == 2
    assert json.loads(objects["run.json"])["manifest"] == url


def test_a_reference_changed_between_check_and_send_fails_only_its_request(
    s3: Any, bucket: str, capsys: Any, service_env: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import imagebatch.run.preflight as config

    checked = config.preflight

    def check_then_change(*args: Any, **kwargs: Any) -> Any:
        result = checked(*args, **kwargs)  # the check read and hashed both references ...
        s3.client.put_object(
            Bucket=bucket, Key="cat/refs/b.png", Body=png(48, 48, (0, 0, 0))
        )  # ... then b changed
        return result

    monkeypatch.setattr(config, "preflight", check_then_change)
    url = f"s3://{bucket}/cat/m.csv"
    code, _, err = cli(capsys, "run", url, "--out", str(tmp_path / "out"), "--no-report")
    assert code == EXIT_INCOMPLETE, err
    rows = _results({"results.csv": (tmp_path / "out" / "results.csv").read_bytes()})
    assert rows["a"]["status"] == "succeeded" and rows["b"]["status"] == "failed"
    assert rows["b"]["error"] == (
        f"s3://{bucket}/cat/refs/b.png changed after the manifest was checked: rerun to plan it again"
    )
    assert [r["idempotency_key"] for r in service_env.requests()] == [rows["a"]["idempotency_key"]]


def test_deploy_checks_the_manifest_in_the_bucket_and_its_objects_before_deploying(
    s3: Any, bucket: str, capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from imagebatch.cli.deploy import request_of
    from imagebatch.platform.deploy import check

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # reached only after the checks
    s3.client.put_object(
        Bucket=bucket, Key="cat/bad.csv", Body=b"id,prompt,reference_images\nx,edit,refs/none.png\n"
    )
    argv = ["--out", str(tmp_path / "out"), "--base-url", "embedded", "--name", "nightly", "--work-pool", "p"]
    code, _, err = cli(capsys, "deploy", f"s3://{bucket}/cat/bad.csv", *argv)
    assert code == EXIT_USAGE
    assert err.splitlines() == [
        f"line 2 (id=x), field reference_images: refs/none.png: object not found "
        f"(looked for s3://{bucket}/cat/refs/none.png)",
        f"s3://{bucket}/cat/bad.csv: 1 problem; nothing was deployed.",
    ]
    code, _, err = cli(capsys, "deploy", "s3://no-such-bucket-ib/cat/m.csv", *argv)
    assert code == EXIT_USAGE and "the bucket 'no-such-bucket-ib' does not exist" in err.splitlines()[0]

    # A manifest that checks: the deployment's parameters name it (and a prefix root) by URL, as given.
    args = build_parser().parse_args(
        ["deploy", f"s3://{bucket}/cat/m.csv", *argv, "--files-root", f"s3://{bucket}/shared"]
    )
    parameters = check(request_of(args))
    assert parameters["manifest"] == f"s3://{bucket}/cat/m.csv"
    assert parameters["options"]["inputs"]["files_root"] == [f"s3://{bucket}/shared"]


def test_a_rerun_into_a_bucket_with_nothing_to_send_reads_no_image_and_starts_no_prefect(
    s3: Any, bucket: str, capsys: Any, service_env: Any, tmp_path: Path
) -> None:
    """The rerun of the benchmark's table (bench/README.md, `--no-report` as there), on a small run: a
    few store requests, none of them on images/ or thumbs/, and Prefect not started (as for a folder:
    run/nothing_to_send.py)."""
    from helpers.s3 import FaultProxy

    url, out = f"s3://{bucket}/cat/m.csv", f"s3://{bucket}/out"
    code, _, err = cli(capsys, "run", url, "--out", out)
    assert code == EXIT_OK, err
    sent = len(service_env.requests())
    proxy = FaultProxy(s3.url)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
        env |= {"AWS_ENDPOINT_URL": proxy.url, "PREFECT_HOME": str(tmp_path / "home")}
        cmd = [sys.executable, "-m", "imagebatch.cli.main", "run", url, "--out", out, "--no-report"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    finally:
        proxy.stop()
    assert done.returncode == EXIT_OK, done.stderr
    assert "Prefect was not started" in done.stderr
    assert len(service_env.requests()) == sent
    info = json.loads(s3.objects(bucket, "out")["run.json"])
    assert info["prefect"]["started"] is False and info["counts"]["skipped"] == 2
    paths = [path for _, path, _ in proxy.log]
    assert paths and not [
        p for p in paths if "/images/" in p or "/thumbs/" in p or "prefix=out%2Fimages" in p
    ]
    listings = [p for p in paths if "list-type" in p]
    assert listings and all("prefix=out%2Fjournal%2F" in p for p in listings), listings
