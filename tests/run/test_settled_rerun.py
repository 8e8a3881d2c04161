"""A rerun that sends nothing settles from the seal the last one left (`run.settled`) only while nothing it
settled on changed: then results.csv and usage-summary.csv are not written again and run.json says what a
rerun settled in full says; a deleted image, an edited row, a changed metadata cell, a record written or
removed since, each makes the rerun do the full work (and send what is to be sent), in a folder and in a
bucket alike."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import write_csv

from imagebatch.options import RunOptions
from imagebatch.run.nothing_to_send import settle_without_prefect
from imagebatch.run.preflight import preflight
from imagebatch.storage import layout
from imagebatch.storage.csvcells import read_csv
from imagebatch.work.store import OutputStore

ROWS = [{"id": f"row-{i}", "prompt": f"a red cup, angle {i}", "model": "compat-image-2", "sku": f"S{i}"}
        for i in range(4)]  # fmt: skip
MOVING = ("started_at", "ended_at")
"""What differs between two settled reruns' summaries whichever way they were settled."""


def _first_run(service_env: Any, tmp_path: Path, out: str) -> tuple[Path, RunOptions]:
    from imagebatch.flows.batch import generate_from_manifest

    manifest = write_csv(tmp_path / "m.csv", ROWS)
    options = RunOptions.from_flat(report=False, base_url=service_env.url)
    generate_from_manifest(str(manifest), out, options)
    return manifest, options


def _settle(manifest: Path, out: str | Path, options: RunOptions) -> dict[str, Any] | None:
    return settle_without_prefect(preflight(manifest, out, options), options)


def _steady(info: dict[str, Any] | None) -> dict[str, Any]:
    assert info is not None
    return {name: value for name, value in info.items() if name not in MOVING}


def _stamps(out: Path) -> dict[str, tuple[int, int]]:
    """results.csv's and usage-summary.csv's inode and modification time: an atomic rewrite changes both."""
    stats = {name: (out / name).stat() for name in layout.STAMPED}
    return {name: (st.st_ino, st.st_mtime_ns) for name, st in stats.items()}


def test_an_unchanged_rerun_is_settled_from_the_seal_and_writes_only_run_json(
    service_env: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    manifest, options = _first_run(service_env, tmp_path, str(out))
    full = _settle(manifest, out, options)  # settled in full: leaves the seal
    assert full is not None and full["counts"]["skipped"] == 4 and (out / layout.SETTLED).is_file()
    written, results = _stamps(out), (out / "results.csv").read_bytes()
    run_json = (out / "run.json").read_bytes()

    again = _settle(manifest, out, options)
    assert _steady(again) == _steady(full)
    assert _stamps(out) == written and (out / "results.csv").read_bytes() == results  # not written again
    assert (out / "run.json").read_bytes() != run_json  # this rerun's times
    recorded = json.loads((out / "run.json").read_text())
    assert recorded["counts"] == full["counts"] and recorded["usage"] == full["usage"]
    assert recorded["prefect"] == {"flow_run_id": None, "task_runs": 0, "started": False}
    assert len(service_env.requests()) == 4


def _delete_image(out: Path) -> None:
    (out / next(r["paths"] for r in read_csv(out / "results.csv") if r["job_id"] == "row-2")).unlink()


def _append_attempt(out: Path) -> None:
    key = next(r["idempotency_key"] for r in read_csv(out / "results.csv") if r["job_id"] == "row-1")
    store = OutputStore(out)
    with store.backend.hold():
        store.journal("attempt_started", idempotency_key=key, attempt=2)  # sent again, never answered


@pytest.mark.parametrize(
    ("change", "sends", "check"),
    [
        (_delete_image, 1, lambda rows: rows["row-2"]["status"] == "succeeded"),
        (lambda out: (out / "results.csv").unlink(), 0, lambda rows: len(rows) == 4),
        (_append_attempt, 0, lambda rows: rows["row-1"]["status"] == "unknown"),
    ],
    ids=["an image deleted", "results.csv deleted", "the journal written since"],
)
def test_a_change_in_the_folder_is_settled_in_full(
    service_env: Any,
    tmp_path: Path,
    change: Callable[[Path], None],
    sends: int,
    check: Callable[[dict[str, dict[str, str]]], bool],
) -> None:
    from imagebatch.flows.batch import generate_from_manifest

    out = tmp_path / "out"
    manifest, options = _first_run(service_env, tmp_path, str(out))
    assert _settle(manifest, out, options) is not None and (out / layout.SETTLED).is_file()
    change(out)
    info = _settle(manifest, out, options)
    if sends:  # something to send: the flow's to run, and it sends only that
        assert info is None
        generate_from_manifest(str(manifest), str(out), options)
    else:
        assert info is not None
    assert len(service_env.requests()) == 4 + sends
    assert check({row["job_id"]: row for row in read_csv(out / "results.csv")})


@pytest.mark.parametrize(
    ("row", "sends"),
    [({"prompt": "a blue cup"}, True), ({"sku": "NEW-SKU"}, False)],
    ids=["a prompt edited", "a metadata cell edited"],
)
def test_an_edited_row_is_settled_in_full(
    service_env: Any, tmp_path: Path, row: dict[str, str], sends: bool
) -> None:
    out = tmp_path / "out"
    manifest, options = _first_run(service_env, tmp_path, str(out))
    assert _settle(manifest, out, options) is not None
    write_csv(manifest, [ROWS[0] | row, *ROWS[1:]])
    info = _settle(manifest, out, options)
    if sends:
        assert info is None and len(service_env.requests()) == 4  # the flow's to send it
        return
    assert info is not None and info["counts"]["skipped"] == 4
    assert [r["sku"] for r in read_csv(out / "results.csv")] == ["NEW-SKU", "S1", "S2", "S3"]


def test_a_bucket_settles_from_the_seal_as_a_folder_does(
    s3: Any, service_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers.s3 import FaultProxy

    bucket = s3.bucket()
    out = f"s3://{bucket}/out"
    manifest, options = _first_run(service_env, tmp_path, out)
    full = _settle(manifest, out, options)
    assert full is not None and layout.SETTLED in s3.objects(bucket, "out")
    proxy = FaultProxy(s3.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        again = _settle(manifest, out, options)
        puts = [path for method, path, _ in proxy.log if method in ("PUT", "POST")]
        proxy.log.clear()
        write_csv(manifest, [ROWS[0] | {"prompt": "a blue cup"}, *ROWS[1:]])
        edited = _settle(manifest, out, options)
    finally:
        proxy.stop()
    assert _steady(again) == _steady(full)
    assert [p for p in puts if "results.csv" in p or "usage-summary.csv" in p] == []
    assert any(p.split("?")[0].endswith("/out/run.json") for p in puts)
    assert edited is None and len(service_env.requests()) == 4
