"""Review from a bucket (issue 19 item 6): `imagebatch report s3://... --to DIR` copies a run's report
with everything its links name, and the run's Prefect artifact points at the bucket's report. Against a
real S3-compatible server (moto on 127.0.0.1), the emulator over HTTP, and Chromium for the page."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers.browser import dom
from helpers.runs import cli

from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE
from imagebatch.run.report_artifact import console_url

LINK = re.compile(r'(?:href|src)="([^"]+)"')


def relative_links(folder: Path) -> set[str]:
    """Every relative link (href, src) of every report page in `folder`."""
    links: set[str] = set()
    for page in folder.glob("report*.html"):
        links |= {link for link in LINK.findall(page.read_text()) if not re.match(r"^(#|[a-z]+:|/)", link)}
    return links


def test_report_to_a_folder_copies_what_every_link_names_and_the_artifact_points_at_the_bucket(
    s3: Any, examples: Path, capsys: Any, service_env: Any, tmp_path: Path
) -> None:
    bucket = s3.bucket()
    url = f"s3://{bucket}/catalog"
    code, _, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", url, "--concurrency", "4")
    assert code == EXIT_OK, err
    objects = s3.objects(bucket, "catalog")

    review = tmp_path / "review"
    code, out, err = cli(capsys, "report", url, "--to", str(review))
    assert code == EXIT_OK, err
    assert out.strip() == str((review / "report.html").resolve())
    assert (review / "report.html").read_bytes() == objects["report.html"]  # the run's own, with its prompts
    links = relative_links(review)
    rows = (review / "results.csv").read_text()
    images = {link for link in links if link.startswith("images/")}
    assert images and all(link in rows for link in images)
    assert any(link.startswith("thumbs/") for link in links)
    for link in links:
        assert (review / link).is_file() and (review / link).read_bytes() == objects[link], link
    shown = dom(review / "report.html", tmp_path / "chromium")
    body = re.search(r'<body data-images="(\d+)" data-loaded="(\d+)"', shown)
    assert body and int(body[1]) > 0 and body[1] == body[2], "every thumbnail loads"
    assert s3.objects(bucket, "catalog") == objects  # nothing was written to the bucket

    # The run's artifact names the bucket's report and the command that opens it.
    from prefect.client.orchestration import get_client

    run_id = json.loads(objects["run.json"])["prefect"]["flow_run_id"]
    body_filter = {
        "flow_runs": {"id": {"any_": [run_id]}},
        "artifacts": {"key": {"any_": ["imagebatch-report"]}},
    }
    with get_client(sync_client=True) as client:
        (artifact,) = client.request("POST", "/artifacts/filter", json=body_filter).json()
    assert f"`{url}/report.html`" in artifact["data"]
    assert f"`imagebatch report {url} --to DIR`" in artifact["data"]
    assert "s3:/" + bucket not in artifact["data"]  # not a local path made of the URL

    # A rerun with --no-report leaves the bucket's report older than its results: built here instead.
    code, _, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", url, "--no-report")
    assert code == EXIT_OK, err
    code, out, err = cli(capsys, "report", url, "--to", str(review))
    assert code == EXIT_OK, err
    page = (review / "report.html").read_text()
    assert "skipped" in page and (review / "report.html").read_bytes() != objects["report.html"]
    assert all((review / link).is_file() for link in relative_links(review))
    assert s3.objects(bucket, "catalog")["report.html"] == objects["report.html"]


def test_report_to_a_folder_is_for_a_bucket(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "out").mkdir()
    code, _, err = cli(capsys, "report", str(tmp_path / "out"), "--to", str(tmp_path / "copy"))
    assert code == EXIT_USAGE
    assert err.strip() == (
        "imagebatch report: --to copies a report out of a bucket; "
        f"{tmp_path / 'out'}/report.html opens where it is"
    )
    assert not (tmp_path / "copy").exists()


def test_the_console_url_of_a_report_where_it_can_be_derived(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    assert (
        console_url("s3://b/p/report.html")
        == "https://s3.console.aws.amazon.com/s3/object/b?prefix=p/report.html"
    )
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert console_url("s3://b/p/report.html") == (
        "https://s3.console.aws.amazon.com/s3/object/b?region=eu-west-1&prefix=p/report.html"
    )
    assert console_url("gs://b/p/report.html") == (
        "https://console.cloud.google.com/storage/browser/_details/b/p/report.html"
    )
    assert console_url("az://c/p/report.html") is None
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")  # MinIO, R2, a local server: no console
    assert console_url("s3://b/p/report.html") is None
