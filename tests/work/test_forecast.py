"""`imagebatch validate MANIFEST --out OUT`: what a run into OUT would send, and a run then sends exactly that
(counted by the emulator's request log); nothing is written to OUT and no lock is held."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from helpers.runs import cli, kill_mid_run, write_jsonl

from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE
from imagebatch.storage.csvcells import read_csv
from imagebatch.storage.kinds import open_location
from imagebatch.work.decisions import Decision, record_decision
from imagebatch.work.store import OutputStore

pytestmark = pytest.mark.usefixtures("prefect_harness", "restore_logging")  # flow runs

JOBS = [{"id": f"row-{i}", "prompt": f"a red cup, angle {i}", "model": "compat-image-2"} for i in range(6)]
CHAIN = {"id": "chain", "prompt": "a cup", "model": "native-image-2.1", "turns": ["make it blue"]}


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by relative path, with its bytes (the folder's whole state)."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def validate(capsys: pytest.CaptureFixture[str], manifest: Path, out: Path | str, *extra: str) -> Any:
    """`validate --out --keys`: the printed table's counts {state: (requests, sent)}, and each key's row."""
    code, text, err = cli(capsys, "validate", str(manifest), "--out", str(out), "--keys", *extra)
    assert code == EXIT_OK, err
    table: dict[str, tuple[int, int]] = {}
    keys: dict[str, dict[str, str]] = {}
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("a run into "))
    head = lines.index(
        "job_id\trequest_index\tturn_index\troute\tmodel\tidempotency_key\tstate\tsent\tprevious_key"
    )
    for line in lines[start:head]:
        cells = line.split()
        if len(cells) >= 3 and cells[1].replace(",", "").isdigit() and cells[2].replace(",", "").isdigit():
            table[cells[0]] = (int(cells[1].replace(",", "")), int(cells[2].replace(",", "")))
    names = lines[head].split("\t")
    for line in lines[head + 1 :]:
        row = dict(zip(names, line.split("\t"), strict=True))
        keys[row["idempotency_key"]] = row
    return table, keys, text


def sent_by(service_env: Any, before: int) -> list[str]:
    """The idempotency keys of the requests the service received since the log held `before`."""
    return [r["idempotency_key"] for r in service_env.requests()[before:]]


def test_validate_out_says_what_the_run_then_sends(
    service_env: Any, tmp_path: Path, out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [*JOBS, CHAIN])

    # Nothing there yet: everything is new, and the folder is not even made.
    table, keys, text = validate(capsys, manifest, out)
    assert table["new"] == (8, 8) and table["total"] == (8, 8)
    assert "it holds no run yet" in text and not out.exists()

    # A run stopped by its budget after 3 images.
    code, _, err = cli(
        capsys, "run", str(manifest), "--out", str(out), "--max-images", "3", "--concurrency", "1"
    )
    assert code != EXIT_OK, err
    first = sent_by(service_env, 0)
    assert len(first) == 3

    before = snapshot(out)
    table, keys, _ = validate(capsys, manifest, out)
    assert snapshot(out) == before  # byte for byte: nothing written, no lock file made or touched
    assert table["done"] == (3, 0) and table["new"] == (5, 5) and table["total"] == (8, 5)
    to_send = {k for k, row in keys.items() if row["sent"] == "yes"}
    assert {k for k, row in keys.items() if row["state"] == "done"} == set(first)

    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out))
    assert code == EXIT_OK, err
    second = sent_by(service_env, 3)
    assert sorted(second) == sorted(to_send)  # exactly what validate said, each once

    table, _, _ = validate(capsys, manifest, out)
    assert table == {"done": (8, 0), "total": (8, 0)}

    # A row edited, a row added: one changed (named), one new; the old image stays.
    old = next(r for r in OutputStore(out).read_results() or [] if r["job_id"] == "row-1")
    write_jsonl(
        manifest, [JOBS[0], {**JOBS[1], "prompt": "a blue cup"}, *JOBS[2:], CHAIN, {**JOBS[0], "id": "new"}]
    )
    table, keys, text = validate(capsys, manifest, out)
    assert table["changed"] == (1, 1) and table["new"] == (1, 1) and table["done"] == (7, 0)
    assert "  changed: line 2 (id=row-1)" in text
    (changed,) = [row for row in keys.values() if row["state"] == "changed"]
    assert changed["previous_key"] == old["idempotency_key"]
    to_send = {k for k, row in keys.items() if row["sent"] == "yes"}
    count = len(service_env.requests())
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out))
    assert code == EXIT_OK, err
    assert sorted(sent_by(service_env, count)) == sorted(to_send)
    assert (out / old["paths"]).is_file()  # the image of the row as it was


def test_validate_out_after_a_kill_counts_the_unknown_and_the_run_leaves_them(
    service_env: Any, prefect_harness: str, tmp_path: Path, out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = write_jsonl(
        tmp_path / "m.jsonl", [{"id": f"job{i:02d}", "prompt": f"kill {i}"} for i in range(12)]
    )
    kill_mid_run(service_env, prefect_harness, manifest, out, let_through=3, concurrency=2)
    states = OutputStore(out).load_state()
    in_doubt = {k for k, s in states.items() if s.status == "unknown"}
    done = {k for k, s in states.items() if s.status == "succeeded"}
    assert in_doubt and done

    before = snapshot(out)
    table, keys, _ = validate(capsys, manifest, out)
    assert snapshot(out) == before
    assert table["unknown"] == (len(in_doubt), 0) and table["done"] == (len(done), 0)
    assert table["new"][0] == 12 - len(in_doubt) - len(done)
    assert {k for k, r in keys.items() if r["state"] == "unknown"} == in_doubt
    table, _, text = validate(capsys, manifest, out, "--retry-unknown")
    assert table["unknown"] == (len(in_doubt), len(in_doubt))
    assert "sent only with --retry-unknown" in text

    to_send = {k for k, r in keys.items() if r["sent"] == "yes"}
    count = len(service_env.requests())
    code, _, _ = cli(capsys, "run", str(manifest), "--out", str(out))
    assert code != EXIT_OK  # the unknown ones are left alone
    assert sorted(sent_by(service_env, count)) == sorted(to_send)


def test_rejected_images_wait_for_a_redo_by_their_newest_variant(
    service_env: Any, tmp_path: Path, out: Path, capsys: pytest.CaptureFixture[str], prefect_harness: str
) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", JOBS[:3])
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out))
    assert code == EXIT_OK, err
    rows = OutputStore(out).read_results() or []
    where = open_location(out)
    record_decision(where, Decision(rows[0]["idempotency_key"], 1, "rejected", "handle missing", "ana"))
    record_decision(where, Decision(rows[1]["idempotency_key"], 1, "approved"))
    record_decision(where, Decision(rows[2]["idempotency_key"], 1, "rejected"))
    record_decision(where, Decision(rows[2]["idempotency_key"], 1, "cleared"))  # undone: not rejected
    before = snapshot(out)
    table, keys, text = validate(capsys, manifest, out)
    assert snapshot(out) == before
    assert table == {"rejected": (1, 0), "done": (2, 0), "total": (3, 0)}
    assert keys[rows[0]["idempotency_key"]]["state"] == "rejected"
    assert "  rejected: line 1 (id=row-0)" in text and "only with --redo rejected" in text

    # `--redo rejected` makes variant 2 of the rejected image: waiting no more, then by v2's own decision.
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out), "--redo", "rejected")
    assert code == EXIT_OK, err
    variant2 = next(r for r in OutputStore(out).read_results() or [] if r.get("variant") == "2")
    table, _, _ = validate(capsys, manifest, out)
    assert table == {"done": (3, 0), "total": (3, 0)}
    record_decision(where, Decision(variant2["idempotency_key"], 2, "approved"))
    table, _, _ = validate(capsys, manifest, out)
    assert table == {"done": (3, 0), "total": (3, 0)}
    record_decision(where, Decision(variant2["idempotency_key"], 2, "rejected", "still wrong"))
    table, _, _ = validate(capsys, manifest, out)
    assert table == {"rejected": (1, 0), "done": (2, 0), "total": (3, 0)}
    sent = len(service_env.ledger())
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out), "--redo", "rejected")
    assert code == EXIT_OK, err
    assert len(service_env.ledger()) == sent + 1  # what validate said: one rejected request, its variant 3


def test_validate_out_names_a_live_run_and_holds_no_lock(
    service_env: Any, tmp_path: Path, out: Path, capsys: pytest.CaptureFixture[str], prefect_harness: str
) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", JOBS[:2])
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out))
    assert code == EXIT_OK, err
    store = OutputStore(out)
    assert store.backend.in_use() is None
    with store.backend.hold():  # a live run
        _, _, text = validate(capsys, manifest, out)
        assert "another imagebatch run is sending into it now: these counts are a snapshot" in text
    shard = OutputStore(out, "0-of-2")
    with shard.backend.shard_hold():
        assert store.backend.in_use() == "a shard of a sharded run"
    with store.backend.hold():  # validate took nothing: a run can hold the folder at once
        pass

    (tmp_path / "file").write_text("x")
    code, _, err = cli(capsys, "validate", str(manifest), "--out", str(tmp_path / "file"))
    assert code == EXIT_USAGE and "is a file, not a folder" in err


def test_validate_out_on_a_bucket(
    s3: Any, service_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], prefect_harness: str
) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", JOBS[:4])
    prices = tmp_path / "prices.toml"
    prices.write_text('currency = "USD"\n[images]\n"compat-image-2" = 0.25\n')
    bucket = s3.bucket()
    url = f"s3://{bucket}/catalog"
    code, _, err = cli(capsys, "run", str(manifest), "--out", url, "--max-images", "1", "--concurrency", "1")
    assert code != EXIT_OK, err
    assert len(service_env.requests()) == 1

    before = s3.objects(bucket)
    table, keys, text = validate(capsys, manifest, url, "--prices", str(prices))
    assert s3.objects(bucket) == before  # nothing written, the lease not taken
    assert table == {"new": (3, 3), "done": (1, 0), "total": (4, 3)}
    assert "most this run can cost (images at most x price):" in text
    assert f"  {'total':<24} 0.75 USD" in text
    to_send = {k for k, r in keys.items() if r["sent"] == "yes"}

    with OutputStore(url).backend.hold():  # a live run holds the lease
        _, _, text = validate(capsys, manifest, url)
        assert "is sending into it now" in text

    code, _, err = cli(capsys, "run", str(manifest), "--out", url)
    assert code == EXIT_OK, err
    assert sorted(sent_by(service_env, 1)) == sorted(to_send)


def test_a_run_from_a_workbook_s_sheet_and_its_plan(
    service_env: Any, tmp_path: Path, out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    book = openpyxl.Workbook()
    book.active.title = "Draft"
    book.active.append(["id", "prompt"])
    final = book.create_sheet("Final")
    for row in (["id", "prompt", "sku", "model"], ["mug", "a mug {sku}", 123, "compat-image-2"]):
        final.append(row)
    final["C2"].number_format = "00000"
    path = tmp_path / "catalog.xlsx"
    book.save(path)
    table, _, _ = validate(capsys, path, out, "--sheet", "Final")
    assert table == {"new": (1, 1), "total": (1, 1)}
    code, _, err = cli(capsys, "run", str(path), "--sheet", "Final", "--out", str(out))
    assert code == EXIT_OK, err
    assert (
        json.loads((out / "run.json").read_text())["manifest"] == f"{path}#Final"
    )  # a reload reads it again
    (row,) = OutputStore(out).read_results() or []
    assert row["sku"] == "00123" and len(service_env.requests()) == 1
    table, _, _ = validate(capsys, Path(f"{path}#Final"), out)
    assert table == {"done": (1, 0), "total": (1, 0)}
    (out / "report.html").unlink()
    code, _, err = cli(capsys, "report", str(out))  # rebuilt from run.json's manifest, its sheet named
    assert code == EXIT_OK, err
    assert "a mug 00123" in (out / "report.html").read_text()


def test_edit_chains_blocked_and_without_history_are_not_sent(
    service_env: Any, tmp_path: Path, out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A chain whose first turn came back without an image holds its later turn back; a chain whose saved
    history is gone cannot send its later turn: validate says neither is sent, and the run sends nothing."""
    chains = [
        {"id": "zebra", "prompt": "a zebra cup", "model": "native-image-2.1", "turns": ["make it blue"]},
        {"id": "plain", "prompt": "a plain cup", "model": "native-image-2.1", "turns": ["make it red"]},
    ]
    manifest = write_jsonl(tmp_path / "m.jsonl", chains)
    service_env.set_faults(scripts=[{"outcomes": ["no_image"], "match": "zebra"}])
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out))
    assert code != EXIT_OK, err
    assert len(service_env.requests()) == 3  # zebra's first turn, plain's two
    rows = {(r["job_id"], r["turn_index"]): r for r in OutputStore(out).read_results() or []}
    (out / rows[("plain", "1")]["paths"]).unlink()  # its image gone: to be made again ...
    (out / "chains" / "plain" / "0.json").unlink()  # ... but the history it must send back is gone too

    before = snapshot(out)
    table, keys, _ = validate(capsys, manifest, out)
    assert snapshot(out) == before
    states = {(r["job_id"], r["turn_index"]): (r["state"], r["sent"]) for r in keys.values()}
    assert states == {
        ("zebra", "0"): ("no_image", "no"),
        ("zebra", "1"): ("blocked", "no"),
        ("plain", "0"): ("done", "no"),
        ("plain", "1"): ("no_history", "no"),
    }
    assert table["total"] == (4, 0)
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out))
    assert code != EXIT_OK, err
    assert len(service_env.requests()) == 3  # the run agreed: nothing sent
    assert {
        r["job_id"]: r["status"] for r in OutputStore(out).read_results() or [] if r["turn_index"] == "1"
    } == {
        "zebra": "not_attempted",
        "plain": "failed",
    }


def test_validate_plans_and_prices_a_redo_and_sends_nothing(
    service_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    native = [{"id": f"n{i}", "prompt": f"a teapot, angle {i}", "model": "native-image-2"} for i in range(3)]
    manifest = write_jsonl(tmp_path / "m.jsonl", [*native, *JOBS[:2]])
    prices = tmp_path / "prices.toml"
    prices.write_text('currency = "EUR"\n[images]\n"native-image-2" = 0.04\n"compat-image-2" = 0.25\n')
    out = tmp_path / "out"
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out), "--concurrency", "2", "--no-report")
    assert code == EXIT_OK, err
    keys_of = {row["job_id"]: row["idempotency_key"] for row in read_csv(out / "results.csv")}
    for job, decision, note in [
        ("n0", "rejected", "a darker glaze"),  # an edit of the rejected image, with the note
        ("n1", "rejected", ""),  # no note: a new sample
        ("n2", "approved", ""),
        ("row-0", "rejected", "too red"),  # not the native route: a new sample
    ]:
        record_decision(open_location(out), Decision(keys_of[job], 1, decision, note, "ana"))  # type: ignore[arg-type]
    before, sent = snapshot(out), len(service_env.requests())

    table, keys, text = validate(
        capsys, manifest, out, "--redo", "rejected", "--edit", "--prices", str(prices)
    )
    assert len(service_env.requests()) == sent and snapshot(out) == before  # nothing sent, nothing written
    assert table == {"redo": (3, 3), "rejected": (3, 0), "done": (2, 0), "total": (8, 3)}
    assert (
        "redo: 3 variants to send (3 rejected), 1 as edits with the reviewer's note; 2 made as new samples "
        "instead of edits (1 no note, 1 not the native route)"
    ) in text
    assert f"  {'native-image-2':<24} 0.08 EUR" in text and f"  {'total':<24} 0.33 EUR" in text
    to_send = sorted(k for k, r in keys.items() if r["sent"] == "yes")
    assert {keys[k]["job_id"] for k in to_send} == {"n0", "n1", "row-0"}

    code, _, err = cli(capsys, "validate", str(manifest), "--out", str(out), "--redo", "rejected,soon")
    assert (
        code == EXIT_USAGE and "--redo takes rejected, no_image, failed (comma separated), not 'soon'" in err
    )
    code, _, err = cli(capsys, "validate", str(manifest), "--redo", "rejected")
    assert code == EXIT_USAGE and "--redo needs --out OUT" in err

    # the redo then sends exactly what validate said, and validate says so afterwards
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out), "--redo", "rejected", "--edit")
    assert code == EXIT_OK, err
    assert sorted(sent_by(service_env, sent)) == to_send
    table, _, _ = validate(capsys, manifest, out, "--redo", "rejected")
    assert table["total"] == (8, 0) and "redo" not in table
