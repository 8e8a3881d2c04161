"""End-to-end runs of `generate_from_manifest` over real HTTP against the emulator, in a Prefect harness."""

from __future__ import annotations

import csv
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import read_jsonl, read_results, run_flow, write_jsonl
from PIL import Image

from imagebatch.gateway.constants import RETRY_DELAYS
from imagebatch.run.hooks import RunHooks, run_hooks


def run(manifest: Path, out: Path, **kw: Any) -> tuple[dict[str, Any], list[float]]:
    """Run the flow with a recording sleep; return its summary and the waits it asked for."""
    delays: list[float] = []
    with run_hooks(RunHooks(sleep=delays.append)):
        info = run_flow(manifest=str(manifest), out=str(out), **kw)
    return info, delays


def billed_keys(emulator: Any) -> Counter[str]:
    return Counter(entry["idempotency_key"] for entry in emulator.ledger())


def test_every_route_of_a_mixed_manifest(
    service_env: Any, examples: Path, tmp_path: Path, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "out"
    info, delays = run(examples / "mixed.json", out)

    rows = read_results(out)
    assert {r["status"] for r in rows} == {"succeeded"}, rows
    assert info["counts"]["succeeded"] == len(rows) == 9
    assert {r["route"] for r in rows} == {
        "native", "chat", "images_generations", "images_edits", "messages", "responses",
    }  # fmt: skip
    assert delays == []
    for row in rows:
        paths = row["paths"].split(";")
        assert all((out / p).is_file() for p in paths)
        if row["route"] in ("messages", "responses"):
            assert row["images"] == "0" and (out / paths[0]).read_text()
            continue
        with Image.open(out / paths[0]) as img:
            assert (img.width, img.height) == (int(row["width"]), int(row["height"]))
            assert {"PNG": "image/png", "JPEG": "image/jpeg"}[img.format] == row["mime_type"]
        assert row["campaign"] == "spring-launch"  # metadata from the manifest's defaults
    # One usage line per HTTP attempt, each naming its key; one billed generation per request.
    usage = read_jsonl(out / "usage.jsonl")
    assert sorted(u["idempotency_key"] for u in usage) == sorted(r["idempotency_key"] for r in rows)
    assert all(u["http_status"] == 200 and u["usage"] for u in usage)
    assert billed_keys(service_env) == Counter(r["idempotency_key"] for r in rows)
    # The chain's later turns were sent with the earlier model turns (the emulator verified their signatures).
    chain = [r for r in rows if r["job_id"] == "mug-desk-chain"]
    assert [r["turn_index"] for r in chain] == ["0", "1", "2"]
    history = json.loads((out / "chains" / "mug-desk-chain" / "0.json").read_text())
    assert [t["contents"][1]["role"] for t in history["turns"]] == ["model"] * 3

    run_info = json.loads((out / "run.json").read_text())
    assert run_info["manifest_sha256"] and run_info["counts"]["succeeded"] == 9
    assert run_info["versions"]["prefect"]

    # The key is in the environment only: no file in the output folder and no log record holds it.
    key = service_env.api_key
    for path in out.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    assert key not in caplog.text
    assert not [k for k in run_info["options"] if k in ("api_key", "key")]


def test_rerun_sends_nothing_and_edited_row_only_regenerates(
    service_env: Any, examples: Path, tmp_path: Path
) -> None:
    manifest = examples / "catalog.csv"
    out = tmp_path / "out"
    run(manifest, out)
    first = read_results(out)
    sent_before = len(service_env.requests())
    assert sent_before == len(first)

    info, _ = run(manifest, out)
    assert len(service_env.requests()) == sent_before  # zero requests for a finished manifest
    assert info["counts"]["skipped"] == len(first)
    assert [r["paths"] for r in read_results(out)] == [r["paths"] for r in first]

    # Edit one row: only that row is generated again.
    with manifest.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows[2]["colour"] = "charcoal"
    with manifest.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    run(manifest, out)
    new_requests = service_env.requests()[sent_before:]
    assert len(new_requests) == 1
    after = read_results(out)
    assert [r["status"] for r in after].count("succeeded") == 1
    assert after[2]["status"] == "succeeded" and after[2]["job_id"] == rows[2]["id"]
    assert after[2]["idempotency_key"] != first[2]["idempotency_key"]
    assert max(billed_keys(service_env).values()) == 1


def test_images_route_retries_on_the_spec_schedule(service_env: Any, tmp_path: Path) -> None:
    manifest = write_jsonl(
        tmp_path / "m.jsonl", [{"id": "poster", "model": "compat-image-2", "prompt": "a retry poster"}]
    )
    service_env.set_faults(scripts=[{"outcomes": [503, 429, 500], "match": "retry poster"}])
    out = tmp_path / "out"
    _, delays = run(manifest, out)
    assert delays == list(RETRY_DELAYS) == [3, 8, 15]
    (row,) = read_results(out)
    assert row["status"] == "succeeded" and row["attempts"] == "4"
    usage = read_jsonl(out / "usage.jsonl")
    assert [u["http_status"] for u in usage] == [503, 429, 500, 200]
    assert [u["retry_in"] for u in usage] == [3, 8, 15, None]
    assert len({u["idempotency_key"] for u in usage}) == 1


def test_images_route_gives_up_after_four_attempts_and_rerun_resends(
    service_env: Any, tmp_path: Path
) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "p", "model": "compat-image-2", "prompt": "busy"}])
    service_env.set_faults(scripts=[{"outcomes": [503, 503, 503, 503], "match": "busy"}])
    out = tmp_path / "out"
    _, delays = run(manifest, out)
    assert delays == [3, 8, 15]
    (row,) = read_results(out)
    assert row["status"] == "failed" and "503" in row["error"]
    # A failed request is sent again by the next run (the script is spent: attempt 5 succeeds).
    run(manifest, out)
    assert read_results(out)[0]["status"] == "succeeded"


def test_native_makes_a_single_attempt(service_env: Any, tmp_path: Path) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "n", "prompt": "a single attempt"}])
    service_env.set_faults(scripts=[{"outcomes": [503], "match": "single attempt"}])
    out = tmp_path / "out"
    _, delays = run(manifest, out)
    assert delays == []
    (row,) = read_results(out)
    assert row["status"] == "failed" and row["attempts"] == "1"
    assert len(service_env.requests()) == 1


def test_dropped_native_answer_is_unknown_and_not_resent_unless_asked(
    service_env: Any, tmp_path: Path
) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "d", "prompt": "a dropped answer"}])
    service_env.set_faults(scripts=[{"outcomes": ["drop"], "match": "dropped answer"}])
    out = tmp_path / "out"
    run(manifest, out)
    (row,) = read_results(out)
    assert row["status"] == "unknown" and "--retry-unknown" in row["error"]
    assert len(service_env.ledger()) == 1  # the service generated (and billed) it

    run(manifest, out)
    assert len(service_env.requests()) == 1  # not resent
    assert read_results(out)[0]["status"] == "unknown"

    run(manifest, out, retry_unknown=True)
    assert len(service_env.requests()) == 2
    assert read_results(out)[0]["status"] == "succeeded"


def test_no_image_answer_is_recorded_with_its_reason(service_env: Any, tmp_path: Path) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "s", "prompt": "a refused prompt"}])
    service_env.set_faults(scripts=[{"outcomes": ["no_image"], "match": "refused prompt"}])
    out = tmp_path / "out"
    run(manifest, out)
    (row,) = read_results(out)
    assert row["status"] == "no_image" and row["finish_reason"] == "SAFETY" and row["images"] == "0"
    detail = json.loads((out / row["paths"]).read_text())
    assert detail["finish_reason"] == "SAFETY" and detail["text"]
    assert not list((out / "images").glob("s_0.png"))


def test_402_stops_dispatch_and_a_rerun_picks_up(service_env: Any, tmp_path: Path) -> None:
    jobs = [{"id": f"j{i}", "prompt": f"catalog item {i}"} for i in range(6)]
    manifest = write_jsonl(tmp_path / "m.jsonl", jobs)
    service_env.set_faults(scripts=[{"outcomes": [402], "match": "catalog item 1"}])
    out = tmp_path / "out"
    info, _ = run(manifest, out, concurrency=1)
    statuses = [r["status"] for r in read_results(out)]
    assert statuses == ["succeeded", "failed", *["not_attempted"] * 4]
    assert "402" in info["stopped"] and "funds" in info["stopped"]
    assert len(service_env.requests()) == 2

    service_env.set_faults(scripts=[])
    run(manifest, out, concurrency=1)
    assert [r["status"] for r in read_results(out)] == ["skipped", *["succeeded"] * 5]
    assert max(billed_keys(service_env).values()) == 1


def test_chain_resumes_from_saved_history(service_env: Any, examples: Path, tmp_path: Path) -> None:
    manifest = write_jsonl(
        examples / "chain.jsonl",
        [
            {
                "id": "chain",
                "prompt": "Put this mug on a desk",
                "reference_images": ["images/product.png"],
                "turns": ["Make the light warmer", "Add a plant in the background"],
            }
        ],
    )
    service_env.set_faults(scripts=[{"outcomes": [503], "match": "plant in the background"}])
    out = tmp_path / "out"
    run(manifest, out)
    assert [r["status"] for r in read_results(out)] == ["succeeded", "succeeded", "failed"]
    assert len(service_env.ledger()) == 2

    service_env.set_faults(scripts=[])
    run(manifest, out)
    assert [r["status"] for r in read_results(out)] == ["skipped", "skipped", "succeeded"]
    # Only the last turn was generated again; the emulator accepted the saved model turns' signatures.
    assert len(service_env.ledger()) == 3
    assert max(billed_keys(service_env).values()) == 1


def test_embedded_emulator_is_the_default(
    examples: Path, tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    monkeypatch.delenv("IMAGEBATCH_BASE_URL", raising=False)
    monkeypatch.delenv("IMAGEBATCH_API_KEY", raising=False)
    caplog.set_level(logging.INFO)
    out = tmp_path / "out"
    info, _ = run(examples / "catalog.csv", out)
    assert info["service"] == "embedded emulator"
    assert info["counts"]["succeeded"] == len(read_results(out))
    assert "embedded emulator" in caplog.text and "placeholders" in caplog.text


@pytest.mark.parametrize("concurrency", [0, 257])
def test_concurrency_is_bounded(service_env: Any, examples: Path, tmp_path: Path, concurrency: int) -> None:
    """The model's bounds: the options refuse it, and so does the flow given it as a deployment gives it
    (a dict), before anything is sent."""
    from pydantic import ValidationError

    from imagebatch.flows.batch import generate_from_manifest
    from imagebatch.options import problem

    with pytest.raises(ValidationError) as refused:
        run(examples / "catalog.csv", tmp_path / "out", concurrency=concurrency)
    assert problem(refused.value) == f"--concurrency must be from 1 to 256, not {concurrency}"
    state = generate_from_manifest(
        manifest=str(examples / "catalog.csv"), out=str(tmp_path / "out"),
        options={"pacing": {"concurrency": concurrency}}, return_state=True,  # type: ignore[arg-type]
    )  # fmt: skip
    assert state.is_failed() and "concurrency" in str(state.message)
    assert service_env.requests() == [] and not (tmp_path / "out").exists()


def test_native_500_is_unknown_not_resent(service_env: Any, tmp_path: Path) -> None:
    # The spec: a 500 is a generation error; "check the outcome before resending".
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "g", "prompt": "a generation error"}])
    service_env.set_faults(scripts=[{"outcomes": [500], "match": "generation error"}])
    out = tmp_path / "out"
    run(manifest, out)
    assert read_results(out)[0]["status"] == "unknown"
    run(manifest, out)
    assert len(service_env.requests()) == 1


def test_no_image_stays_no_image_on_rerun(service_env: Any, tmp_path: Path) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "s", "prompt": "blocked again"}])
    service_env.set_faults(scripts=[{"outcomes": ["no_image"], "match": "blocked again"}])
    out = tmp_path / "out"
    first, _ = run(manifest, out)
    second, _ = run(manifest, out)
    assert first["counts"]["no_image"] == second["counts"]["no_image"] == 1
    assert len(service_env.requests()) == 1


def test_halt_keeps_the_status_of_what_was_done(service_env: Any, examples: Path, tmp_path: Path) -> None:
    jobs = [
        {"id": "chain", "prompt": "Put this mug on a desk", "reference_images": ["images/product.png"],
         "turns": ["Make the light warmer"]},
        {"id": "a", "prompt": "first item"},
        {"id": "b", "prompt": "second item"},
    ]  # fmt: skip
    manifest = write_jsonl(examples / "halt.jsonl", jobs)
    out = tmp_path / "out"
    service_env.set_faults(scripts=[{"outcomes": [402], "match": "first item"}])
    run(manifest, out, concurrency=1)
    assert [r["status"] for r in read_results(out)] == ["succeeded", "succeeded", "failed", "not_attempted"]
    # Still out of funds on the rerun: the finished chain is reported as done, not as "not attempted".
    service_env.set_faults(scripts=[{"outcomes": [402, 402], "match": "first item"}])
    run(manifest, out, concurrency=1)
    assert [r["status"] for r in read_results(out)] == ["skipped", "skipped", "failed", "not_attempted"]


def test_an_output_folder_in_use_is_refused(service_env: Any, examples: Path, tmp_path: Path) -> None:
    from imagebatch.errors import UsageError
    from imagebatch.work.store import OutputStore

    out = tmp_path / "out"
    with OutputStore(out).backend.hold(), pytest.raises(UsageError, match="another imagebatch run"):
        run(examples / "catalog.csv", out)
    assert service_env.requests() == []


def test_a_deleted_image_is_made_again(service_env: Any, examples: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(examples / "catalog.csv", out)
    first = read_results(out)
    (out / first[0]["paths"]).unlink()
    run(examples / "catalog.csv", out)
    after = read_results(out)
    assert [r["status"] for r in after] == ["succeeded"] + ["skipped"] * (len(first) - 1)
    assert (out / after[0]["paths"]).is_file()


def test_the_run_summary_is_a_prefect_artifact(service_env: Any, examples: Path, tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client

    info, _ = run(examples / "catalog.csv", tmp_path / "out")
    run_id = info["prefect"]["flow_run_id"]
    body = {
        "artifacts": {"key": {"any_": ["imagebatch-run-summary"]}},
        "flow_runs": {"id": {"any_": [run_id]}},
    }
    with get_client(sync_client=True) as client:
        (artifact,) = client.request("POST", "/artifacts/filter", json=body).json()
    assert artifact["type"] == "markdown"
    assert info["out"] in artifact["data"]
    assert f"| succeeded | {info['counts']['succeeded']} |" in artifact["data"]


def test_progress_and_usage_are_prefect_artifacts_keyed_for_a_history(
    service_env: Any, examples: Path, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client

    info, _ = run(examples / "mixed.json", tmp_path / "out")
    run_id = info["prefect"]["flow_run_id"]
    with get_client(sync_client=True) as client:
        found = client.request("POST", "/artifacts/filter", json={"flow_runs": {"id": {"any_": [run_id]}}})
    artifacts = {a["key"]: a for a in found.json()}
    assert {
        "imagebatch-progress",
        "imagebatch-usage",
        "imagebatch-run-summary",
        "imagebatch-report",
    } <= artifacts.keys()
    report = artifacts["imagebatch-report"]
    assert report["type"] == "markdown"  # the UI shows it; it cannot open a file:// link
    assert info["run_report"] in report["data"] and Path(info["run_report"]).is_file()
    assert f"| succeeded | {info['counts']['succeeded']} |" in report["data"]
    assert (
        "**Review:** " in report["data"] and " open (" in report["data"] and "· 0 approved" in report["data"]
    )
    assert f"`imagebatch review {info['out']}`" in report["data"]
    progress = artifacts["imagebatch-progress"]
    assert progress["type"] == "progress"
    done = info["counts"]["succeeded"] + info["counts"]["skipped"]
    assert progress["data"] == pytest.approx(100.0 * done / info["requests"])  # done, not merely settled
    assert progress["description"].startswith(f"done {done} of {info['requests']}")
    table = artifacts["imagebatch-usage"]
    assert table["type"] == "table"
    rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
    assert sum(row["succeeded"] for row in rows) == info["counts"]["succeeded"]
    assert {row["route"] for row in rows} >= {"native", "messages"}


def test_the_flows_files_root_parameter_reaches_its_preflight(service_env: Any, tmp_path: Path) -> None:
    """A deployment's run checks the manifest itself: its `files_root` parameter is the operator's choice."""
    from imagebatch.manifest import ManifestError

    (tmp_path / "m").mkdir()
    (tmp_path / "shared").mkdir()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp_path / "shared" / "x.png")
    manifest = tmp_path / "m" / "m.csv"
    manifest.write_text("id,prompt,reference_images\na,edit it,../shared/x.png\n")
    with pytest.raises(ManifestError, match="outside the files root"):
        run(manifest, tmp_path / "out")
    assert service_env.requests() == []
    info, _ = run(manifest, tmp_path / "out", files_root=[str(tmp_path / "shared")])
    assert info["counts"]["succeeded"] == 1 and len(service_env.requests()) == 1


def test_a_flow_run_with_the_earlier_flat_parameters_runs_as_a_worker_runs_it(
    service_env: Any, examples: Path, tmp_path: Path
) -> None:
    """A deployment whose runs give each option alone (`concurrency`, `max_images`, `report`): its flow
    run, made on the server with those parameters and run as a worker's flow process runs it (Prefect's
    engine given the flow run alone, which binds the stored parameters to the flow's signature), reads
    them as the options model's fields; the stored run keeps only what it was given."""
    from prefect import get_client
    from prefect.flow_engine import run_flow as run_flow_run

    from imagebatch.flows.batch import generate_from_manifest
    from imagebatch.run.final_state import summary_of

    out = tmp_path / "out"
    flat = {
        "manifest": str(examples / "catalog.csv"), "out": str(out),
        "concurrency": 2, "max_images": 3, "report": False,
    }  # fmt: skip
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run(generate_from_manifest, parameters=flat)
        assert client.read_flow_run(flow_run.id).parameters == flat
    with run_hooks(RunHooks(sleep=lambda _seconds: None)):
        state = run_flow_run(generate_from_manifest, flow_run=flow_run, return_type="state")
    summary = summary_of(state)  # type: ignore[arg-type]  # return_type="state": a State
    assert summary["options"]["concurrency"] == 2 and summary["options"]["max_images"] == 3
    assert summary["options"]["report"] is False and not (out / "report.html").exists()
    assert [r["status"] for r in read_results(out)].count("succeeded") == 3
    assert len(billed_keys(service_env)) == 3
