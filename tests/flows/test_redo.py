"""`imagebatch run --redo rejected [--edit]` (issue 24, item 2): a new variant of each request whose newest
image a reviewer rejected, and nothing else; as an edit of the rejected image with the reviewer's note,
its whole conversation sent back exactly as the service returned it (the emulator checks the signatures).
Counted by the emulator's request log, over real HTTP, in the session's Prefect harness."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.images import png
from helpers.runs import cli, read_results, run_flow, write_jsonl

from imagebatch.cli.deploy import request_of
from imagebatch.cli.main import build_parser
from imagebatch.flows.batch import generate_from_manifest
from imagebatch.manifest import PlannedRequest, load_manifest, plan, variant_of
from imagebatch.options import RunOptions
from imagebatch.platform.deploy import check as deploy_check
from imagebatch.run.dispatch import RunControl
from imagebatch.run.hooks import RunHooks, run_hooks
from imagebatch.run.nothing_to_send import settle_without_prefect
from imagebatch.run.preflight import preflight
from imagebatch.storage import layout
from imagebatch.storage.kinds import open_location
from imagebatch.work.decisions import Decision, record_decision
from imagebatch.work.store import OutputStore, file_stem


def planned(manifest: Path) -> dict[tuple[str, int], PlannedRequest]:
    """The manifest's requests (variant 1) by (job id, turn index)."""
    return {(r.job_id, r.turn_index): r for r in plan(load_manifest(manifest))}


def decide(out: Path, req: PlannedRequest, decision: str = "rejected", note: str = "") -> None:
    record_decision(open_location(out), Decision(req.idempotency_key, req.variant, decision, note, "tester"))  # type: ignore[arg-type]


def sent_keys(emulator: Any, since: int = 0) -> Counter[str]:
    return Counter(r["idempotency_key"] for r in emulator.requests()[since:])


def log_of(emulator: Any, key: str) -> dict[str, Any]:
    """The one request the emulator received under `key`."""
    (entry,) = [r for r in emulator.requests() if r["idempotency_key"] == key]
    return entry


def rows_of(out: Path, job_id: str) -> list[tuple[str, str, str]]:
    """(turn, variant, status) of a job's rows in results.csv, in their order."""
    return [(r["turn_index"], r["variant"], r["status"]) for r in read_results(out) if r["job_id"] == job_id]


def _every_variant_listed_and_the_first_image_kept(out: Path, p0_v2: Any, first: dict[str, Path]) -> None:
    """Every variant of a request in results.csv, newest first; the first sample's image is where it was."""
    assert rows_of(out, "p0") == [("0", "2", "succeeded"), ("0", "1", "skipped")]
    assert rows_of(out, "p2") == [("0", "1", "skipped")]
    rows = {(r["job_id"], r["variant"]): r for r in read_results(out)}
    assert rows["p0", "2"]["idempotency_key"] == p0_v2.idempotency_key
    assert "/0-v2-" in rows["p0", "2"]["paths"] and (out / rows["p0", "2"]["paths"]).is_file()
    assert all(path.is_file() for path in first.values())
    assert rows["p0", "1"]["paths"] == str(first["p0"].relative_to(out))


def test_redo_sends_each_rejected_request_once_and_a_rerun_sends_nothing(
    service_env: Any, tmp_path: Path, out: Path
) -> None:
    service_env.configure(log_contents=True)
    manifest = write_jsonl(
        tmp_path / "m.jsonl",
        [
            *({"id": f"p{i}", "prompt": f"a redo mug {i}", "model": "native-image-2"} for i in range(4)),
            {"id": "ch", "prompt": "a redo cup", "turns": ["make it blue"]},
        ],
    )
    run_flow(manifest=str(manifest), out=str(out))
    reqs = planned(manifest)
    first = {job: Path(out, read_results(out)[i]["paths"]) for i, job in enumerate(["p0", "p1", "p2", "p3"])}
    decide(out, reqs["ch", 1])  # a chain's turn 1: sent again after the chain's turn 0 as it was returned
    decide(out, reqs["p0", 0], note="the handle is missing")
    decide(out, reqs["p1", 0])  # no note: a new sample all the same
    decide(out, reqs["p2", 0], "approved")
    decide(out, reqs["p3", 0], "rejected", "wrong colour")
    decide(out, reqs["p3", 0], "cleared")  # undone: not rejected any more
    before = len(service_env.requests())

    info = run_flow(manifest=str(manifest), out=str(out), redo="rejected")
    v2 = {job: variant_of(reqs[job, 0], 2) for job in ("p0", "p1")}
    ch2 = variant_of(reqs["ch", 1], 2)
    assert sent_keys(service_env, before) == Counter(
        [*(v.idempotency_key for v in v2.values()), ch2.idempotency_key]
    )
    assert all(v.idempotency_key != reqs[job, 0].idempotency_key for job, v in v2.items())
    assert variant_of(reqs["p0", 0], 2) == v2["p0"]  # the same key every time it is planned
    assert info["redo"] == {
        "variants": 3,
        "kinds": {"rejected": 3},
        "edits": 0,
        "new_samples": 3,
        "fallback": 0,
        "fallback_reasons": {},
    }
    assert info["counts"]["succeeded"] == 3 and info["counts"]["skipped"] == 6
    assert rows_of(out, "ch") == [("1", "2", "succeeded"), ("0", "1", "skipped"), ("1", "1", "skipped")]
    ch1_sent = log_of(service_env, reqs["ch", 1].idempotency_key)["contents"]
    assert len(ch1_sent) == 3 and canonical(
        log_of(service_env, ch2.idempotency_key)["contents"]
    ) == canonical(ch1_sent)
    _every_variant_listed_and_the_first_image_kept(out, v2["p0"], first)

    # The same command again: variant 2 exists and is not rejected, so nothing is sent.
    sent = len(service_env.requests())
    again = run_flow(manifest=str(manifest), out=str(out), redo="rejected")
    assert len(service_env.requests()) == sent
    assert again["counts"]["skipped"] == 9 and again["redo"]["variants"] == 0
    assert rows_of(out, "p1") == [("0", "2", "skipped"), ("0", "1", "skipped")]

    _settled_alike_until_the_newest_is_rejected(service_env, manifest, out, v2["p0"], sent)


def _settled_alike_until_the_newest_is_rejected(
    service_env: Any, manifest: Path, out: Path, newest: Any, sent: int
) -> None:
    """Settled without Prefect (a rerun with nothing to send), the variants are listed as the flow lists
    them; a new rejection of the newest variant is something to send, for the flow: its variant 3."""
    options = RunOptions.from_flat(base_url=service_env.url, report=False, redo="rejected")
    checked = preflight(manifest, out, options)
    settled = settle_without_prefect(checked, options)
    assert settled is not None and settled["requests"] == 9 and settled["redo"]["variants"] == 0
    assert rows_of(out, "p0") == [("0", "2", "skipped"), ("0", "1", "skipped")]
    decide(out, newest, note="still no handle")
    assert settle_without_prefect(checked, options) is None
    run_flow(manifest=str(manifest), out=str(out), redo="rejected")
    assert sent_keys(service_env, sent) == Counter([variant_of(newest, 3).idempotency_key])
    assert [v for _, v, _ in rows_of(out, "p0")] == ["3", "2", "1"]


def test_redo_edit_sends_the_rejected_answer_back_byte_for_byte_with_the_note(
    service_env: Any, tmp_path: Path, out: Path
) -> None:
    service_env.configure(log_contents=True, thought_image_rate=1.0)  # a thought image in every answer
    (tmp_path / "ref.png").write_bytes(png(48, 48, (10, 120, 200)))
    manifest = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {"id": "a", "prompt": "a mug on a desk", "reference_images": ["ref.png"]},
            {"id": "b", "prompt": "a chat mug", "route": "chat", "model": "native-image-2"},
            {"id": "c", "prompt": "a mug, no note", "model": "native-image-2"},
            {"id": "d", "prompt": "a mug, history lost", "model": "native-image-2"},
            {"id": "e", "prompt": "a cup", "model": "native-image-2.1", "turns": ["make it blue"]},
        ],
    )  # fmt: skip
    run_flow(manifest=str(manifest), out=str(out))
    reqs = planned(manifest)
    a1, e1 = reqs["a", 0], reqs["e", 1]
    a1_log = log_of(service_env, a1.idempotency_key)
    _the_answer_is_kept_with_its_images_as_files(out, tmp_path / "ref.png", a1, a1_log["answer"])
    decide(out, a1, note="make the handle blue")
    decide(out, reqs["b", 0], note="brighter")  # the chat route keeps no signed history
    decide(out, reqs["c", 0])  # no note
    decide(out, reqs["d", 0], note="smaller")
    lines = (out / "conversations.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 3  # a, c, d: one line per native answer not of a chain (the chat route has none)
    gone = reqs["d", 0].idempotency_key
    (out / "conversations.jsonl").write_bytes(b"".join(x for x in lines if gone.encode() not in x))
    decide(out, e1, note="a darker blue")  # the chain's turn 1
    before = len(service_env.requests())

    info = run_flow(manifest=str(manifest), out=str(out), redo="rejected", edit=True)
    assert info["redo"] == {
        "variants": 5, "kinds": {"rejected": 5}, "edits": 2, "new_samples": 3, "fallback": 3,
        "fallback_reasons": {"not the native route": 1, "no note": 1, "no kept history": 1},
    }  # fmt: skip
    assert info["counts"]["succeeded"] == 5
    a2, e2 = variant_of(a1, 2), variant_of(e1, 2)
    assert len(sent_keys(service_env, before)) == 5 and max(sent_keys(service_env, before).values()) == 1

    _sent_back_as_returned_with_the_note(
        service_env, [(a1, a2, "make the handle blue"), (e1, e2, "a darker blue")]
    )
    # The fallbacks were sent as the first request was.
    for job in ("c", "d"):
        assert canonical(
            log_of(service_env, variant_of(reqs[job, 0], 2).idempotency_key)["contents"]
        ) == canonical(log_of(service_env, reqs[job, 0].idempotency_key)["contents"])
    assert rows_of(out, "e") == [("1", "2", "succeeded"), ("0", "1", "skipped"), ("1", "1", "skipped")]

    # An edit of the edit: its whole conversation, then the new note.
    decide(out, a2, note="and a thinner rim")
    since = len(service_env.requests())
    info = run_flow(manifest=str(manifest), out=str(out), redo="rejected", edit=True)
    a3 = variant_of(a1, 3)
    assert sent_keys(service_env, since) == Counter([a3.idempotency_key]) and info["redo"]["edits"] == 1
    _sent_back_as_returned_with_the_note(service_env, [(a2, a3, "and a thinner rim")])


def _the_answer_is_kept_with_its_images_as_files(out: Path, ref: Path, first: Any, answer: Any) -> None:
    """A native answer's conversation is kept, its images as references to the files written (a thought
    image, which has no file, inline) and its reference images by input path and digest."""
    kept = OutputStore(out).load_conversation(first)
    assert kept is not None and kept["key"] == first.idempotency_key
    user, model = kept["contents"]
    assert user["parts"][1]["inlineData"]["data"] == {
        "input": str(ref.resolve()), "sha256": first.reference_sha256[0]
    }  # fmt: skip
    final = [p for p in model["parts"] if "inlineData" in p and not p.get("thought")]
    assert [p["inlineData"]["data"]["file"] for p in final] == read_results(out)[0]["paths"].split(";")

    def thought_image(content: dict[str, Any]) -> Any:
        return next(
            p["inlineData"]["data"] for p in content["parts"] if p.get("thought") and "inlineData" in p
        )

    assert thought_image(model) == thought_image(answer)  # no file of its own: kept inline
    assert len(json.dumps(kept)) < len(json.dumps(answer)) / 2


def _sent_back_as_returned_with_the_note(service_env: Any, edits: list[tuple[Any, Any, str]]) -> None:
    """Each (rejected, its edit, the note): the edit sent the rejected request's conversation as sent, its
    answer exactly as returned, then the note; the emulator verified the signatures sent back (200)."""
    for rejected, edit, text in edits:
        before, after = (
            log_of(service_env, rejected.idempotency_key),
            log_of(service_env, edit.idempotency_key),
        )
        note = {"role": "user", "parts": [{"text": text}]}
        assert after["status"] == 200
        assert canonical(after["contents"]) == canonical([*before["contents"], before["answer"], note])


def canonical(contents: Any) -> str:
    """A value's JSON with its keys sorted: equal exactly when every value, string and order is equal."""
    return json.dumps(contents, sort_keys=True)


def made_and_rejected(tmp_path: Path, prompt: str, jobs: int) -> tuple[Path, Path, list[str]]:
    """A manifest of `jobs` native rows, run once, every image rejected; its path, the output folder and
    the keys of the variants 2 a redo will send."""
    rows = [{"id": f"j{i}", "prompt": f"{prompt} {i}", "model": "native-image-2"} for i in range(jobs)]
    manifest, out = write_jsonl(tmp_path / "m.jsonl", rows), tmp_path / "out"
    run_flow(manifest=str(manifest), out=str(out))
    reqs = planned(manifest)
    for i in range(jobs):
        decide(out, reqs[f"j{i}", 0], note="no")
    return manifest, out, [variant_of(reqs[f"j{i}", 0], 2).idempotency_key for i in range(jobs)]


def test_budgets_apply_to_variants_and_a_failed_variant_waits_for_a_redo(
    service_env: Any, tmp_path: Path
) -> None:
    manifest, out, v2 = made_and_rejected(tmp_path, "a budget mug", 3)
    before = len(service_env.requests())

    info = run_flow(manifest=str(manifest), out=str(out), redo="rejected", max_images=1)
    assert len(sent_keys(service_env, before)) == 1
    assert info["counts"]["succeeded"] == 1 and info["counts"]["not_attempted"] == 2
    assert info["stopped"].startswith("--max-images 1 reached")
    # The rest, with one of them failing (the native route makes a single attempt).
    failing = next(k for k in v2 if k not in sent_keys(service_env, before))
    service_env.set_faults(scripts=[{"outcomes": [503], "match": failing}])
    info = run_flow(manifest=str(manifest), out=str(out), redo="rejected")
    assert sent_keys(service_env, before) == Counter(v2)
    assert info["counts"]["failed"] == 1
    service_env.set_faults()
    # A run without --redo never sends a variant: the failed one is carried as it stands.
    since = len(service_env.requests())
    plain = run_flow(manifest=str(manifest), out=str(out))
    assert len(service_env.requests()) == since and plain["counts"]["failed"] == 1
    # A redo run sends it again (every resume rule applies to variants), and makes no variant 3.
    info = run_flow(manifest=str(manifest), out=str(out), redo="rejected")
    assert sent_keys(service_env, since) == Counter([failing])
    assert info["counts"]["succeeded"] == 1 and info["counts"]["failed"] == 0


class StopAfter:
    """The emulator's latency sleep: stops the run (as Ctrl-C does) during its `n`-th generation."""

    def __init__(self, control: RunControl, n: int) -> None:
        self.control, self.n, self.calls = control, n, 0

    async def __call__(self, _seconds: float) -> None:
        self.calls += 1
        if self.calls == self.n:
            self.control.stop("stopped by the test")


def test_an_interrupted_redo_resumes_like_any_run(service_env: Any, tmp_path: Path) -> None:
    manifest, out, v2 = made_and_rejected(tmp_path, "a resumed mug", 5)
    before = len(service_env.requests())

    control = RunControl()
    service_env.configure(latency=0.001, sleep=StopAfter(control, 2))
    with run_hooks(RunHooks(control=control)):
        stopped = run_flow(manifest=str(manifest), out=str(out), redo="rejected", concurrency=1)
    first = sent_keys(service_env, before)
    assert stopped["stopped"] == "stopped by the test" and 1 <= len(first) < 5
    assert stopped["counts"]["not_attempted"] == 5 - len(first)
    service_env.configure(latency=0.0)

    done = run_flow(manifest=str(manifest), out=str(out), redo="rejected")
    assert sent_keys(service_env, before) == Counter(v2)  # each variant sent once, over both runs
    assert done["counts"]["succeeded"] == 5 - len(first) and done["redo"]["variants"] == 5 - len(first)


def test_redo_options_are_checked_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "x", "prompt": "a mug"}])
    out = str(tmp_path / "out")
    code, _, err = cli(capsys, "run", str(manifest), "--out", out, "--edit")
    assert code == 2 and "--edit" in err and "--redo rejected" in err
    code, _, err = cli(capsys, "run", str(manifest), "--out", out, "--redo", "rejected", "--force")
    assert code == 2 and "--force" in err
    assert not (tmp_path / "out" / "journal.jsonl").exists()
    # A deployment carries them, so a team can schedule the redo.
    args = build_parser().parse_args(
        ["deploy", str(manifest), "--out", out, "--name", "redo", "--base-url", "embedded",
         "--redo", "rejected", "--edit"]
    )  # fmt: skip
    resend = deploy_check(request_of(args))["options"]["resend"]
    assert {k: v for k, v in resend.items() if k in ("redo", "edit")} == {"redo": "rejected", "edit": True}
    form = generate_from_manifest.parameters.definitions["Resend"]["properties"]
    assert {"redo", "edit"} <= set(form)  # the flow's own options


def test_an_edit_redo_into_a_bucket_from_the_command_line(
    s3: Any, service_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    service_env.configure(log_contents=True)
    manifest = write_jsonl(
        tmp_path / "m.jsonl", [{"id": f"s{i}", "prompt": f"a bucket mug {i}"} for i in range(2)]
    )
    url = f"s3://{s3.bucket()}/redo"
    code, _, err = cli(capsys, "run", str(manifest), "--out", url)
    assert code == 0, err
    reqs = planned(manifest)
    record_decision(open_location(url), Decision(reqs["s0", 0].idempotency_key, 1, "rejected", "add a lid"))
    before = len(service_env.requests())

    code, out, err = cli(capsys, "run", str(manifest), "--out", url, "--redo", "rejected", "--edit")
    assert code == 0, err
    assert "redo: 1 variant to send (1 rejected), 1 as edits with the reviewer's note" in out
    v2 = variant_of(reqs["s0", 0], 2)
    assert sent_keys(service_env, before) == Counter([v2.idempotency_key])
    sent = log_of(service_env, v2.idempotency_key)
    assert sent["status"] == 200 and len(sent["contents"]) == 3 and sent["contents"][1]["role"] == "model"
    objects = s3.objects(url.split("/")[2], "redo")
    assert layout.conversation(file_stem(v2, False)) in objects  # kept for an edit of the edit
    rows = [(r["job_id"], r["variant"], r["status"]) for r in csv_rows(objects["results.csv"])]
    assert rows == [("s0", "2", "succeeded"), ("s0", "1", "skipped"), ("s1", "1", "skipped")]


def test_redo_no_image_sends_exactly_those_requests(
    service_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = write_jsonl(
        tmp_path / "m.jsonl",
        [{"id": f"n{i}", "prompt": f"a blank poster {i}", "model": "native-image-2"} for i in range(4)],
    )
    reqs = planned(manifest)
    blank = [reqs["n0", 0], reqs["n2", 0]]  # the service answers these (and only these keys) without an image
    service_env.set_faults(scripts=[{"outcomes": ["no_image"], "match": r.idempotency_key} for r in blank])
    out = str(tmp_path / "out")
    argv = ["run", str(manifest), "--out", out, "--concurrency", "2", "--no-report"]
    code, _, err = cli(capsys, *argv)
    assert code == 1, err
    assert [r["status"] for r in read_results(tmp_path / "out")] == [
        "no_image",
        "succeeded",
        "no_image",
        "succeeded",
    ]
    before = len(service_env.requests())
    code, _, _ = cli(capsys, *argv)  # a plain rerun carries them: nothing sent
    assert code == 1 and len(service_env.requests()) == before

    code, text, err = cli(capsys, *argv, "--redo", "no_image")
    assert code == 0, err  # each request is what its newest variant is: done (issue 32 #5)
    assert sent_keys(service_env, before) == Counter(variant_of(r, 2).idempotency_key for r in blank)
    assert "redo: 2 variants to send (2 no_image)" in text, text + err
    assert rows_of(tmp_path / "out", "n0") == [("0", "2", "succeeded"), ("0", "1", "no_image")]
    assert rows_of(tmp_path / "out", "n1") == [("0", "1", "skipped")]

    sent = len(service_env.requests())
    code, text, _ = cli(capsys, *argv, "--redo", "no_image,rejected")  # their newest variant succeeded
    assert len(service_env.requests()) == sent and "redo: 0 variants to send" in text
    code, _, err = cli(capsys, *argv)  # the nightly rerun: nothing sent, and no longer failed by n0, n2
    assert code == 0 and len(service_env.requests()) == sent, err
    assert json.loads((tmp_path / "out" / "run.json").read_text())["superseded"] == 2
    code, _, err = cli(capsys, *argv, "--redo", "no_image,later")
    assert code == 2 and "--redo takes rejected, no_image, failed (comma separated), not 'later'" in err


def csv_rows(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode())))
