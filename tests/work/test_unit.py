"""One unit of work against a fake service: files, records, the crash-safe journal order, resume, chains.

No Prefect and no network: the service is the shared fake (`helpers.fake_gateway.FakeService`), which
records every request and plays scripted replies, then a success whose every field depends on the
request's number; the client's `sleep` only records its delays; every "crash" is an exception raised by a
monkeypatched function, after which a new store and context are built from the same output folder (what
a rerun does); a full disk is the journal and usage files pointed at /dev/full.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.fake_gateway import FakeService
from helpers.images import b64, png

from imagebatch.gateway import GatewayClient
from imagebatch.manifest import load_manifest, plan
from imagebatch.manifest.files import READ_LIMIT
from imagebatch.storage import appendlog
from imagebatch.work import records
from imagebatch.work import unit as unit_module
from imagebatch.work.context import RunContext, Unit, group_units
from imagebatch.work.records import UNKNOWN_HINT
from imagebatch.work.store import OutputStore, RequestRecord, read_jsonl
from imagebatch.work.unit import run_unit, run_unit_safely

API_KEY = "secret-key"


def answer_png(width: int) -> bytes:
    """The fake service's n-th image: a different width each time, so files can be told apart."""
    return png(width, 8, (10, 200, 30))


def native_ok(n: int) -> dict[str, Any]:
    """A native success whose every field depends on `n`, so one answer cannot pass for another."""
    return {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": f"thinking {n}", "thought": True, "thoughtSignature": f"thought-sig-{n}"},
                        {"text": f"ok {n}"},
                        {
                            "inlineData": {
                                "mimeType": "image/png",
                                "data": b64(answer_png(8 + n)),
                            },
                            "thoughtSignature": f"sig-{n}",
                        },
                    ],
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {"candidatesTokenCount": n},
    }


def native_no_image(finish: str = "SAFETY") -> dict[str, Any]:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "I can't draw that."}]}, "finishReason": finish}
        ],
        "usageMetadata": {},
    }


def error(status: int, code: str | None = None) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": f"simulated {status}", "code": code or f"code_{status}"}}


def success(request: httpx.Request, n: int) -> dict[str, Any]:
    """The fake service's answer to its n-th request once its script is played: a success of the route."""
    path = request.url.path
    if path.startswith("/v1beta/"):
        return native_ok(n)
    if path.startswith("/v1/images/"):
        return {"created": 1, "data": [{"b64_json": b64(answer_png(8 + n))}]}
    if path == "/v1/messages":
        return {"content": [{"type": "text", "text": f"hello {n}"}], "usage": {"output_tokens": n}}
    raise AssertionError(f"unexpected path {path}")


class Harness:
    """A manifest folder, an output folder and the fake service; `context()` is a fresh run on them."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.out = tmp_path / "out"
        self.service = FakeService(default=success)
        self.delays: list[float] = []
        self.clients: list[GatewayClient] = []
        self.while_waiting: Callable[[], None] | None = None
        """Called in the client's wait before a retry (a test fills the disk there)."""

    def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        if self.while_waiting is not None:
            self.while_waiting()

    def units(self, *rows: dict[str, Any]) -> list[Unit]:
        """Write `rows` as a JSONL manifest and group its plan as the flow does."""
        path = self.tmp / "manifest.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return group_units(list(plan(load_manifest(path))))

    def unit(self, row: dict[str, Any]) -> Unit:
        (unit,) = self.units(row)
        return unit

    def context(
        self, slot: Callable[[], AbstractContextManager[object]] = nullcontext, **options: Any
    ) -> RunContext:
        client = GatewayClient(
            "http://svc",
            API_KEY,
            transport=httpx.MockTransport(self.service.handle),
            sleep=self.sleep,
            slot=slot,
        )
        self.clients.append(client)
        store = OutputStore(self.out)
        store.prepare()
        return RunContext(client, store, store.load_state(), **options)

    def events(self, key: str | None = None) -> list[dict[str, Any]]:
        events = read_jsonl(self.out / "journal.jsonl")
        return [e for e in events if key is None or e.get("idempotency_key") == key]

    def close(self) -> None:
        for client in self.clients:
            client.close()


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.close()


class Crash(Exception):
    """Stands for the process dying at this point."""


def crash(*_args: Any, **_kwargs: Any) -> None:
    raise Crash("killed")


CAT = {"id": "a", "prompt": "cat"}
CHAIN = {"id": "c", "prompt": "p", "turns": ["t1", "t2"]}
IMAGES = {"id": "g", "model": "compat-image-2", "prompt": "x"}
TEXT = {"id": "m", "route": "messages", "model": "text-model", "prompt": "hi"}


def key12(rec: RequestRecord) -> str:
    return rec.idempotency_key.removeprefix("ib1-")[:12]


# --- success ---------------------------------------------------------------------------------------------


def test_success_writes_files_and_journals_in_the_crash_safe_order(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CAT)
    ctx = h.context()
    key = unit.requests[0].idempotency_key
    seen: list[str] = []

    real_write, real_outcome = ctx.store.write_file, ctx.store.record_outcome

    def write_file(name: str, data: bytes) -> str:
        assert [e["event"] for e in h.events(key)][-1] == "answered"  # named before any file is written
        seen.append("file")
        return real_write(name, data)

    def record_outcome(record: RequestRecord) -> None:
        assert all((h.out / p).is_file() for p in record.paths)  # files before the outcome
        seen.append("outcome")
        real_outcome(record)

    monkeypatch.setattr(ctx.store, "write_file", write_file)
    monkeypatch.setattr(ctx.store, "record_outcome", record_outcome)

    (rec,) = run_unit(ctx, unit)

    assert h.service.count == 1
    assert rec.status == "succeeded"
    assert rec.paths == [f"images/a/0-{key12(rec)}.png"]
    assert (h.out / rec.paths[0]).read_bytes() == answer_png(9)
    assert (rec.images, rec.width, rec.height, rec.mime_type) == (1, 9, 8, "image/png")
    assert (rec.attempts, rec.finish_reason, rec.job_id, rec.route) == (1, "STOP", "a", "native")
    assert seen == ["file", "outcome"]
    assert [e["event"] for e in h.events(key)] == [
        "attempt_started",
        "attempt_finished",
        "answered",
        "outcome",
    ]
    answered, outcome = h.events(key)[2:]
    assert answered["paths"] == outcome["paths"] == rec.paths
    usage = list(read_jsonl(h.out / "usage.jsonl"))
    assert len(usage) == 1
    assert (usage[0]["idempotency_key"], usage[0]["http_status"], usage[0]["outcome"]) == (key, 200, "ok")
    assert usage[0]["usage"] == {"candidatesTokenCount": 1}
    # No image bytes travel in a record (Prefect would keep them): only small scalars and paths.
    values = asdict(rec).values()
    assert not any(isinstance(v, bytes | bytearray) for v in values)
    assert b64(answer_png(9))[:40] not in json.dumps(asdict(rec))
    assert ctx.results == {} and not ctx.halt.is_set()


def test_an_image_gets_its_report_thumbnail_as_it_arrives(h: Harness) -> None:
    from PIL import Image

    (rec,) = run_unit(h.context(), h.unit(CAT))
    assert rec.status == "succeeded"
    (image,) = rec.paths
    thumb = h.out / "thumbs" / (image.removeprefix("images/").replace("/", "__") + ".jpg")
    with Image.open(thumb) as im, Image.open(h.out / image) as full:
        assert im.format == "JPEG" and im.size == full.size  # small images keep their size


def test_text_route_saves_text_and_the_raw_answer(h: Harness) -> None:
    (rec,) = run_unit(h.context(), h.unit(TEXT))
    assert rec.status == "succeeded"
    stem = f"images/m/0-{key12(rec)}"
    assert rec.paths == [f"{stem}.txt", f"{stem}.json"]
    assert (h.out / rec.paths[0]).read_text() == "hello 1"
    assert json.loads((h.out / rec.paths[1]).read_text())["usage"] == {"output_tokens": 1}


def test_a_no_image_answer_is_saved_and_never_resent(h: Harness) -> None:
    unit = h.unit(CAT)
    h.service.reply(native_no_image())
    (rec,) = run_unit(h.context(), unit)
    assert rec.status == "no_image" and rec.finish_reason == "SAFETY"
    assert rec.paths == [f"images/a/0-{key12(rec)}.no_image.json"]
    assert json.loads((h.out / rec.paths[0]).read_text())["text"] == "I can't draw that."
    assert run_unit(h.context(), unit) == [rec]
    assert h.service.count == 1


# --- crashes and resume ----------------------------------------------------------------------------------


def test_crash_after_the_files_before_the_outcome_counts_as_done(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CAT)
    key = unit.requests[0].idempotency_key
    ctx = h.context()
    monkeypatch.setattr(ctx.store, "record_outcome", crash)
    with pytest.raises(Crash):
        run_unit(ctx, unit)
    assert [e["event"] for e in h.events(key)] == ["attempt_started", "attempt_finished", "answered"]
    paths = h.events(key)[-1]["paths"]
    assert all((h.out / p).is_file() for p in paths)

    rerun = h.context()
    assert rerun.states[key].status == "succeeded"
    (rec,) = run_unit(rerun, unit)
    assert h.service.count == 1  # nothing sent again
    assert rec.status == "skipped" and rec.paths == paths


def test_a_power_cut_keeps_what_the_journal_fsyncs_covered_and_a_rerun_resends_nothing_done(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A success syncs the journal twice (before sending, and `answered` before its files); its
    `attempt_finished` and `outcome` ride on those fsyncs. A power cut loses what no fsync covered: cut
    the journal at its last fsync and the rerun still finds the success done and the failure failed."""
    import os

    from imagebatch.storage import appendlog

    ok, bad = h.units(CAT, {"id": "b", "prompt": "dog"})
    synced: list[int] = []  # the journal's size at each of its fsyncs
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("journal.jsonl"):
            synced.append(os.fstat(fd).st_size)
        real_fsync(fd)

    monkeypatch.setattr(appendlog.os, "fsync", fsync)
    ctx = h.context()
    (done,) = run_unit(ctx, ok)
    assert done.status == "succeeded" and len(synced) == 2  # attempt_started, answered
    journal = h.out / "journal.jsonl"
    whole = journal.read_bytes()
    cut = whole[: synced[-1]]  # a power cut now: what no fsync covered is gone (the success's outcome)
    assert len(cut) < len(whole)
    assert [json.loads(line)["event"] for line in cut.splitlines()] == [
        "attempt_started",
        "attempt_finished",
        "answered",
    ]
    h.service.reply(error(503, "service_unavailable"))
    (failed,) = run_unit(ctx, bad)
    assert failed.status == "failed" and len(synced) == 5  # attempt_started, attempt_finished, outcome
    assert synced[-1] == journal.stat().st_size  # a failure's lines are all synced
    journal.write_bytes(cut)
    rerun = h.context()
    assert rerun.states[done.idempotency_key].status == "succeeded"
    assert [r.status for r in run_unit(rerun, ok)] == ["skipped"] and h.service.count == 2


def test_the_end_of_a_run_syncs_the_lines_that_rode_on_later_fsyncs(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from imagebatch.storage import appendlog

    store = h.context().store
    store.journal("outcome", sync=False, idempotency_key="k")
    calls: list[str] = []
    monkeypatch.setattr(appendlog.os, "fsync", lambda fd: calls.append(os.readlink(f"/proc/self/fd/{fd}")))
    store.sync()
    assert calls == [str(store.journal_path)]
    store.sync()
    assert len(calls) == 1  # nothing new to sync


def test_crash_after_the_files_with_the_files_gone_is_unknown_and_not_resent(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CAT)
    key = unit.requests[0].idempotency_key
    ctx = h.context()
    monkeypatch.setattr(ctx.store, "record_outcome", crash)
    with pytest.raises(Crash):
        run_unit(ctx, unit)
    for path in h.events(key)[-1]["paths"]:
        (h.out / path).unlink()

    rerun = h.context()
    assert rerun.states[key].status == "unknown"  # sent, answered (billed), but not saved
    (rec,) = run_unit(rerun, unit)
    assert rec.status == "unknown" and UNKNOWN_HINT in (rec.error or "")
    assert h.service.count == 1

    (again,) = run_unit(h.context(retry_unknown=True), unit)
    assert h.service.count == 2 and again.status == "succeeded"
    assert (h.out / again.paths[0]).is_file()


def test_crash_between_answered_and_the_files_is_unknown(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    unit = h.unit(CAT)
    key = unit.requests[0].idempotency_key
    ctx = h.context()
    monkeypatch.setattr(ctx.store, "write_file", crash)
    with pytest.raises(Crash):
        run_unit(ctx, unit)
    assert [e["event"] for e in h.events(key)][-1] == "answered"

    rerun = h.context()
    assert rerun.states[key].status == "unknown"
    assert run_unit(rerun, unit)[0].status == "unknown"
    assert h.service.count == 1


def test_disk_full_while_saving_is_unknown_and_not_resent(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CAT)
    key = unit.requests[0].idempotency_key
    ctx = h.context()

    def disk_full(name: str, data: bytes) -> str:
        raise OSError("disk full")

    monkeypatch.setattr(ctx.store, "write_file", disk_full)
    (rec,) = run_unit(ctx, unit)
    assert rec.status == "unknown"
    assert "could not be saved" in (rec.error or "") and "disk full" in (rec.error or "")
    assert rec.paths == [] and rec.attempts == 1
    assert h.events(key)[-1]["event"] == "outcome" and h.events(key)[-1]["status"] == "unknown"

    rerun = h.context()
    assert rerun.states[key].status == "unknown"
    assert run_unit(rerun, unit)[0].status == "unknown"
    assert h.service.count == 1


# --- may_have_been_billed -> unknown or failed -----------------------------------------------------------


def test_native_500_is_unknown_and_not_resent(h: Harness) -> None:
    unit = h.unit(CAT)
    h.service.reply(error(500, "generation_error"))
    ctx = h.context()
    (rec,) = run_unit(ctx, unit)
    assert rec.status == "unknown" and UNKNOWN_HINT in (rec.error or "")
    assert not ctx.halt.is_set()
    assert run_unit(h.context(), unit)[0].status == "unknown"
    assert h.service.count == 1


def test_native_503_is_failed_and_resent_next_run(h: Harness) -> None:
    unit = h.unit(CAT)
    h.service.reply(error(503, "service_unavailable"))
    ctx = h.context()
    (rec,) = run_unit(ctx, unit)
    assert rec.status == "failed" and "HTTP 503" in (rec.error or "")
    assert not ctx.halt.is_set()
    (again,) = run_unit(h.context(), unit)
    assert h.service.count == 2 and again.status == "succeeded"
    # Attempts are counted across runs, in results and in the usage ledger alike.
    assert (rec.attempts, again.attempts) == (1, 2)
    assert [u["attempt"] for u in read_jsonl(h.out / "usage.jsonl")] == [1, 2]


def test_a_rate_limited_failure_is_counted_by_its_status_not_by_its_message(h: Harness) -> None:
    """run.json's `rate_limited` counts records whose last answer was a 429 (a typed field the journal
    keeps for a rerun or a sharded run's parent), not messages that happen to say "HTTP 429"."""
    from imagebatch.run.outputs import rate_limited

    units = h.units(CAT, {"id": "dog", "prompt": "a dog"})
    h.service.reply(
        (429, {"error": {"message": "slow down", "code": "rate_limit_exceeded"}}),
        (503, {"error": {"message": "upstream answered HTTP 429", "code": "service_unavailable"}}),
    )
    ctx = h.context()
    limited, other = (run_unit(ctx, unit)[0] for unit in units)
    assert (limited.status, limited.http_status) == ("failed", 429)
    assert (other.status, other.http_status) == ("failed", 503) and "HTTP 429" in (other.error or "")
    assert rate_limited([limited, other]) == 1
    replayed = h.context().states[limited.idempotency_key].outcome
    assert replayed is not None and replayed.http_status == 429


def test_a_200_with_a_body_that_is_not_json_is_unknown(h: Harness) -> None:
    unit = h.unit(CAT)
    h.service.reply(b"<html>oops</html>")
    (rec,) = run_unit(h.context(), unit)
    assert rec.status == "unknown"
    assert run_unit(h.context(), unit)[0].status == "unknown"
    assert h.service.count == 1


def test_images_route_no_answer_then_503s_is_unknown(h: Harness) -> None:
    unit = h.unit(IMAGES)
    h.service.reply(httpx.ReadTimeout, error(503), error(503), error(503))
    (rec,) = run_unit(h.context(), unit)
    assert h.service.count == 4 and h.delays == [3, 8, 15]
    assert rec.status == "unknown" and rec.attempts == 4
    assert run_unit(h.context(), unit)[0].status == "unknown"
    assert h.service.count == 4


def test_images_route_four_503s_is_failed(h: Harness) -> None:
    unit = h.unit(IMAGES)
    h.service.reply(*[error(503)] * 4)
    (rec,) = run_unit(h.context(), unit)
    assert h.service.count == 4 and h.delays == [3, 8, 15]
    assert rec.status == "failed" and rec.attempts == 4


# --- errors that stop the run ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (error(401, "invalid_api_key"), "IMAGEBATCH_API_KEY"),
        (error(402, "insufficient_funds"), "insufficient funds"),
        (error(404, "not_found"), "base URL"),
        (httpx.ConnectError, "base URL"),
    ],
    ids=["401", "402", "404", "connect-error"],
)
def test_account_and_address_errors_stop_the_run(h: Harness, reply: Any, reason: str) -> None:
    first, second, chain = h.units(CAT, {"id": "b", "prompt": "dog"}, CHAIN)
    h.service.reply(reply)
    ctx = h.context()
    (rec,) = run_unit(ctx, first)
    assert rec.status == "failed"
    assert ctx.halt.is_set() and reason in (ctx.halt_reason or "")
    assert h.service.count == 1

    (other,) = run_unit(ctx, second)
    assert other.status == "not_attempted" and other.error == ctx.halt_reason
    assert [r.status for r in run_unit(ctx, chain)] == ["not_attempted"] * 3
    assert h.service.count == 1  # nothing sent after the halt


def test_a_request_that_waited_for_its_slot_while_the_run_stopped_is_not_sent(h: Harness) -> None:
    """Ctrl-C (or a 401/402 elsewhere) while a request waits for a slot of the account-wide limit: once it
    has the slot, it is not sent and not journaled, and is `not_attempted`. A retry of a request already
    sent is still sent: the requests in flight finish."""
    first, retried = h.units(CAT, IMAGES)  # the images route retries a 503; the native route does not

    def stopping_at(wait: int) -> Callable[[], AbstractContextManager[object]]:
        """A slot whose `wait`-th wait sees the run stop (as Ctrl-C would)."""
        waits = iter(range(1, 100))

        @contextlib.contextmanager
        def slot() -> Iterator[None]:
            if next(waits) == wait:
                ctx.stop_dispatch("stopped by Ctrl-C")
            yield

        return slot

    ctx = h.context(slot=stopping_at(1))
    (rec,) = run_unit(ctx, first)
    assert rec.status == "not_attempted" and rec.error == "stopped by Ctrl-C"
    assert h.service.count == 0 and h.events() == []  # neither sent nor journaled

    h.service.reply(error(503, "service_unavailable"))
    ctx = h.context(slot=stopping_at(2))  # the run stops while the retry waits for its slot
    (rec,) = run_unit(ctx, retried)
    assert ctx.halt.is_set() and rec.status == "succeeded" and rec.attempts == 2 and h.service.count == 2


def test_a_404_for_an_unknown_model_does_not_stop_the_run(h: Harness) -> None:
    first, second = h.units(CAT, {"id": "b", "prompt": "dog"})
    h.service.reply(error(404, "model_not_found"))
    ctx = h.context()
    assert run_unit(ctx, first)[0].status == "failed"
    assert not ctx.halt.is_set()
    assert run_unit(ctx, second)[0].status == "succeeded"
    assert h.service.count == 2


def test_a_401_after_an_unanswered_attempt_still_stops_the_run(h: Harness) -> None:
    first, second = h.units(IMAGES, {"id": "g2", "model": "compat-image-2", "prompt": "y"})
    h.service.reply(httpx.ReadTimeout, error(401, "invalid_api_key"))
    ctx = h.context()
    (rec,) = run_unit(ctx, first)
    assert rec.status == "unknown"  # right: the first attempt may have been billed
    assert ctx.halt.is_set() and "IMAGEBATCH_API_KEY" in (ctx.halt_reason or "")
    assert run_unit(ctx, second)[0].status == "not_attempted"


# --- chains ----------------------------------------------------------------------------------------------


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def model_turn(h: Harness, i: int) -> dict[str, Any]:
    """The model content the service answered to request `i`, exactly as sent."""
    return h.service.answers[i].json["candidates"][0]["content"]


def test_chain_sends_every_earlier_turn_exactly_as_returned(h: Harness) -> None:
    unit = h.unit(CHAIN)
    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["succeeded"] * 3
    assert [r.turn_index for r in records] == [0, 1, 2]
    assert h.service.count == 3
    assert h.service.body(0)["contents"] == [user("p")]
    assert h.service.body(1)["contents"] == [user("p"), model_turn(h, 0), user("t1")]
    assert h.service.body(2)["contents"] == [
        user("p"),
        model_turn(h, 0),
        user("t1"),
        model_turn(h, 1),
        user("t2"),
    ]
    # Byte-level: part order, thought parts and signatures untouched.
    sent_back = h.service.body(2)["contents"][3]
    assert [p.get("thoughtSignature") for p in sent_back["parts"]] == ["thought-sig-2", None, "sig-2"]
    assert json.dumps(sent_back, sort_keys=True) == json.dumps(model_turn(h, 1), sort_keys=True)

    for rec in records:
        assert rec.paths == [f"images/c/0-t{rec.turn_index}-{key12(rec)}.png"]
        assert (h.out / rec.paths[0]).is_file()
    saved = json.loads((h.out / "chains" / "c" / "0.json").read_text())
    assert saved["job_id"] == "c"
    assert [t["key"] for t in saved["turns"]] == [r.idempotency_key for r in records]
    assert saved["turns"][1]["contents"] == [user("t1"), model_turn(h, 1)]


def test_chain_resumes_at_the_failed_turn_with_the_full_history(h: Harness) -> None:
    unit = h.unit(CHAIN)
    h.service.reply(native_ok(1), native_ok(2), error(503))
    assert [r.status for r in run_unit(h.context(), unit)] == ["succeeded", "succeeded", "failed"]

    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["skipped", "skipped", "succeeded"]
    assert h.service.count == 4  # only turn 2 again
    assert h.service.body(3)["contents"] == [
        user("p"),
        model_turn(h, 0),
        user("t1"),
        model_turn(h, 1),
        user("t2"),
    ]


def test_chain_without_its_history_file_sends_nothing(h: Harness) -> None:
    unit = h.unit(CHAIN)
    h.service.reply(native_ok(1), native_ok(2), error(503))
    run_unit(h.context(), unit)
    (h.out / "chains" / "c" / "0.json").unlink()

    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["skipped", "skipped", "failed"]
    assert "--force" in (records[2].error or "") and "chains/c/0.json" in (records[2].error or "")
    assert h.service.count == 3  # turns 0-1 are not billed again to rebuild the history


def test_chain_stops_at_a_turn_without_an_image(h: Harness) -> None:
    unit = h.unit(CHAIN)
    h.service.reply(native_ok(1), native_no_image())
    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["succeeded", "no_image", "not_attempted"]
    assert h.service.count == 2

    again = run_unit(h.context(), unit)
    assert [r.status for r in again] == ["skipped", "no_image", "not_attempted"]
    assert again[1] == records[1]
    assert h.service.count == 2


def test_chain_with_an_edited_last_turn_keeps_the_earlier_history(h: Harness) -> None:
    run_unit(h.context(), h.unit(CHAIN))
    edited = h.unit({**CHAIN, "turns": ["t1", "t2 but blue"]})
    records = run_unit(h.context(), edited)
    assert [r.status for r in records] == ["skipped", "skipped", "succeeded"]
    assert h.service.count == 4
    assert h.service.body(3)["contents"] == [
        user("p"),
        model_turn(h, 0),
        user("t1"),
        model_turn(h, 1),
        user("t2 but blue"),
    ]


def test_chain_turn_whose_image_was_deleted_is_made_again_on_the_same_history(h: Harness) -> None:
    unit = h.unit(CHAIN)
    first = run_unit(h.context(), unit)
    (h.out / first[1].paths[0]).unlink()

    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["skipped", "succeeded", "skipped"]
    assert h.service.count == 4
    assert h.service.body(3)["contents"] == [user("p"), model_turn(h, 0), user("t1")]
    saved = json.loads((h.out / "chains" / "c" / "0.json").read_text())
    assert [t["key"] for t in saved["turns"][:2]] == [r.idempotency_key for r in records[:2]]
    assert saved["turns"][1]["contents"] == [user("t1"), model_turn(h, 3)]  # the new answer replaced it


def test_chain_crash_after_a_turns_files_can_continue_without_force(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CHAIN)
    ctx = h.context()
    monkeypatch.setattr(ctx.store, "record_outcome", crash)
    with pytest.raises(Crash):
        run_unit(ctx, unit)  # killed after turn 0's files, before its outcome
    assert h.service.count == 1

    records = run_unit(h.context(), unit)
    assert [r.status for r in records] == ["skipped", "succeeded", "succeeded"]
    assert h.service.count == 3
    assert h.service.body(1)["contents"] == [user("p"), model_turn(h, 0), user("t1")]


def test_chain_sends_back_a_model_turn_whose_image_type_was_mislabelled(h: Harness) -> None:
    unit = h.unit(CHAIN)
    mislabelled = native_ok(1)
    mislabelled["candidates"][0]["content"]["parts"][2]["inlineData"]["mimeType"] = "image/jpeg"  # PNG bytes
    h.service.reply(mislabelled)
    records = run_unit(h.context(), unit)
    assert records[0].status == "succeeded" and records[0].mime_type == "image/png"
    assert h.service.count == 3
    assert h.service.body(1)["contents"] == [user("p"), model_turn(h, 0), user("t1")]


# --- force and retry_unknown -----------------------------------------------------------------------------


def test_force_resends_a_succeeded_request(h: Harness) -> None:
    unit = h.unit(CAT)
    (first,) = run_unit(h.context(), unit)
    assert run_unit(h.context(), unit)[0].status == "skipped"
    assert h.service.count == 1
    (forced,) = run_unit(h.context(force=True), unit)
    assert h.service.count == 2 and forced.status == "succeeded"
    assert forced.paths == first.paths
    assert (h.out / forced.paths[0]).read_bytes() == png(
        10, 8, (10, 200, 30)
    )  # the new answer replaced the old file


def test_force_remakes_a_whole_chain(h: Harness) -> None:
    unit = h.unit(CHAIN)
    run_unit(h.context(), unit)
    records = run_unit(h.context(force=True), unit)
    assert [r.status for r in records] == ["succeeded"] * 3
    assert h.service.count == 6
    assert h.service.body(4)["contents"] == [user("p"), model_turn(h, 3), user("t1")]


def test_retry_unknown_resends_an_unknown_request(h: Harness) -> None:
    unit = h.unit(CAT)
    h.service.reply(httpx.ReadTimeout)
    assert run_unit(h.context(), unit)[0].status == "unknown"
    assert run_unit(h.context(), unit)[0].status == "unknown"
    assert h.service.count == 1
    (rec,) = run_unit(h.context(retry_unknown=True), unit)
    assert h.service.count == 2 and rec.status == "succeeded"
    assert run_unit(h.context(), unit)[0].status == "skipped"


# --- file names ------------------------------------------------------------------------------------------


def test_similar_job_ids_and_copies_never_share_a_file(h: Harness) -> None:
    units = h.units({"id": "a", "prompt": "cat", "count": 2}, {"id": "a_1", "prompt": "cat"})
    ctx = h.context()
    records = [rec for unit in units for rec in run_unit(ctx, unit)]
    assert [r.status for r in records] == ["succeeded"] * 3
    paths = [p for r in records for p in r.paths]
    assert len(paths) == len(set(paths)) == 3
    written = sorted(p.relative_to(h.out).as_posix() for p in (h.out / "images").rglob("*") if p.is_file())
    assert written == sorted(paths)
    assert [(h.out / p).read_bytes() for p in paths] == [
        answer_png(9),
        answer_png(10),
        answer_png(11),
    ]


def test_an_edited_row_writes_a_new_file_and_keeps_the_old_one(h: Harness) -> None:
    (old,) = run_unit(h.context(), h.unit(CAT))
    old_bytes = (h.out / old.paths[0]).read_bytes()
    (new,) = run_unit(h.context(), h.unit({"id": "a", "prompt": "dog"}))
    assert h.service.count == 2 and new.status == "succeeded"
    assert new.idempotency_key != old.idempotency_key
    assert new.paths != old.paths
    assert (h.out / old.paths[0]).read_bytes() == old_bytes
    assert (h.out / new.paths[0]).read_bytes() == answer_png(10)


# --- input files that changed after the check ---------------------------------------------------------


def with_reference(h: Harness) -> Path:
    """A PNG reference image, ref.png, next to the manifest."""
    ref = h.tmp / "ref.png"
    ref.write_bytes(png(16, 16, (1, 2, 3)))
    return ref


def settle_in_thread(ctx: RunContext, unit: Unit) -> list[RequestRecord]:
    """`run_unit`, failing (not hanging) if it does not return within a minute."""
    out: list[list[RequestRecord]] = []
    thread = threading.Thread(target=lambda: out.append(run_unit(ctx, unit)), daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "run_unit hangs on the input file"
    return out[0]


def replace_with(ref: Path, kind: str) -> None:
    ref.unlink()
    if kind == "folder":
        ref.mkdir()
    elif kind == "fifo":
        os.mkfifo(ref)
    else:  # grown past the most any route takes (sparse: no disk space)
        with open(ref, "wb") as fh:
            fh.truncate(READ_LIMIT)


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("folder", "is a folder"),
        ("fifo", "is a FIFO (named pipe), not a regular file"),
        ("grown", f"the file is {READ_LIMIT:,} bytes"),
    ],
)
def test_an_input_that_is_no_longer_a_regular_file_fails_that_request_and_sends_nothing(
    h: Harness, kind: str, why: str
) -> None:
    ref = with_reference(h)
    unit = h.unit({"id": "a", "prompt": "edit", "reference_images": ["ref.png"]})
    replace_with(ref, kind)
    try:
        (rec,) = settle_in_thread(h.context(), unit)
    finally:
        if kind == "fifo":  # release a reader stuck on it (the bug), if any
            with contextlib.suppress(OSError):
                os.close(os.open(ref, os.O_WRONLY | os.O_NONBLOCK))
    assert rec.status == "failed"
    assert f"{ref.resolve()} changed after the manifest was checked ({why}" in (rec.error or "")
    assert h.service.count == 0 and h.events() == []


def test_a_turns_input_that_changed_fails_that_turn_and_stops_the_chain(h: Harness) -> None:
    ref = with_reference(h)
    unit = h.unit(
        {"id": "c", "prompt": "p", "turns": ["t1", {"prompt": "t2", "reference_images": ["ref.png"]}]}
    )
    replace_with(ref, "folder")
    out = run_unit(h.context(), unit)
    assert [r.status for r in out] == ["succeeded", "succeeded", "failed"]
    assert "is a folder" in (out[2].error or "")
    assert h.service.count == 2


# --- run_unit_safely -------------------------------------------------------------------------------------


def test_an_internal_error_after_the_attempt_started_is_unknown(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CAT)

    def broken(*_args: Any) -> Any:
        raise RuntimeError("bug in plan_files")

    monkeypatch.setattr(records, "plan_files", broken)
    (rec,) = run_unit_safely(h.context(), unit)
    assert h.service.count == 1
    assert rec.status == "unknown"
    assert "internal error: RuntimeError: bug in plan_files" in (rec.error or "")
    assert UNKNOWN_HINT in (rec.error or "")

    monkeypatch.undo()
    rerun = h.context()
    assert rerun.states[unit.requests[0].idempotency_key].status == "unknown"  # answered, never saved
    assert run_unit(rerun, unit)[0].status == "unknown"
    assert h.service.count == 1


def test_an_internal_error_before_any_attempt_is_not_attempted(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CAT)

    def broken(*_args: Any) -> Any:
        raise RuntimeError("bug before sending")

    monkeypatch.setattr(unit_module, "build_request", broken)
    (rec,) = run_unit_safely(h.context(), unit)
    assert h.service.count == 0
    assert rec.status == "not_attempted" and "bug before sending" in (rec.error or "")


def test_an_internal_error_in_a_later_turn_keeps_the_earlier_turns_records(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = h.unit(CHAIN)
    real = records.plan_files

    def broken_on_turn_1(req: Any, result: Any, chain: bool) -> Any:
        if req.turn_index == 1:
            raise RuntimeError("bug in plan_files")
        return real(req, result, chain)

    monkeypatch.setattr(records, "plan_files", broken_on_turn_1)
    out = run_unit_safely(h.context(), unit)
    assert h.service.count == 2
    assert [r.status for r in out] == ["succeeded", "unknown", "not_attempted"]


class FullDisk:
    """The output folder's journal and usage files on a full disk: `fill` points them at /dev/full, where
    every write fails with ENOSPC (the store opens them for each line, so its next line meets it, through
    its own error path); `free` puts the files back as they were."""

    NAMES = ("journal.jsonl", "usage.jsonl")

    def __init__(self, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full on this system")
        self.out = out
        self.monkeypatch = monkeypatch

    def fill(self) -> None:
        # The device stands in for a full disk through a link out of OUT, which every write refuses (tests/
        # storage/test_confined.py): here the journal's appends may follow it, so that ENOSPC is real.
        self.monkeypatch.setattr(appendlog, "confined", lambda root, name: Path(root) / name)
        for name in self.NAMES:
            path = self.out / name
            if path.exists():
                path.rename(self.out / f"{name}.kept")
            path.symlink_to("/dev/full")

    def free(self) -> None:
        for name in self.NAMES:
            (self.out / name).unlink()
            if (kept := self.out / f"{name}.kept").exists():
                kept.rename(self.out / name)


def test_a_journal_that_cannot_be_written_sends_nothing_and_stops_the_run(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write-ahead: an attempt that could not be journaled is not sent; the first failed write stops the run
    with one message that says what to do."""
    units = h.units(CAT, {"id": "b", "prompt": "dog"})
    ctx = h.context()
    FullDisk(h.out, monkeypatch).fill()
    (rec,) = run_unit(ctx, units[0])
    assert h.service.requests == []  # nothing sent: nothing can have been billed
    assert rec.status == "not_attempted" and "disk full at" in (rec.error or "")
    assert ctx.halt.is_set() and ctx.halt_reason == f"disk full at {h.out}: free space, then rerun"
    (second,) = run_unit(ctx, units[1])
    assert second.status == "not_attempted" and h.service.requests == []


def test_an_answer_whose_journal_line_fails_is_unknown_and_not_resent(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills while a request is on the wire: its answer (billed) cannot be recorded or saved, so
    it is `unknown`; the rerun does not send it again on its own."""
    unit = h.unit(CAT)
    key = unit.requests[0].idempotency_key
    ctx = h.context()
    disk = FullDisk(h.out, monkeypatch)

    def answer_as_the_disk_fills(request: httpx.Request, n: int) -> dict[str, Any]:
        disk.fill()  # attempt_started is written; nothing after it
        return success(request, n)

    h.service.default = answer_as_the_disk_fills
    (rec,) = run_unit(ctx, unit)
    assert len(h.service.requests) == 1
    assert rec.status == "unknown" and "could not be saved" in (rec.error or "")
    assert ctx.halt_reason and ctx.halt_reason.startswith("disk full at")
    assert not list((h.out / "images").rglob("*.png"))

    disk.free()
    h.service.default = success
    rerun = h.context()  # space freed
    assert rerun.states[key].status == "unknown"
    assert run_unit(rerun, unit)[0].status == "unknown" and len(h.service.requests) == 1


def test_a_retry_that_cannot_be_journaled_is_unknown(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempt was sent (and got a 503); the second cannot be journaled, so it is not sent, and
    the request is `unknown` rather than `not_attempted` (a 503 is not billed, but the record says what we
    know: it was sent)."""
    unit = h.unit({**CAT, "route": "images"})
    h.service.reply((503, {"error": {"code": "overloaded", "message": "busy"}}))
    ctx = h.context()
    h.while_waiting = FullDisk(
        h.out, monkeypatch
    ).fill  # attempt 1: started, finished, usage; attempt 2: refused
    (rec,) = run_unit(ctx, unit)
    assert len(h.service.requests) == 1 and h.delays == [3.0]
    assert rec.status == "unknown" and rec.attempts == 1


def test_a_401_names_where_the_key_came_from(h: Harness) -> None:
    """A key read from a Secret block is fixed there, not in IMAGEBATCH_API_KEY."""
    unit = h.unit(CAT)
    h.service.reply(error(401, "invalid_api_key"))
    ctx = h.context(key_source="the Prefect Secret block 'team-key'")
    run_unit(ctx, unit)
    assert ctx.halt_reason == (
        "the service refused the API key (HTTP 401): set the Prefect Secret block 'team-key' to a valid key"
    )
