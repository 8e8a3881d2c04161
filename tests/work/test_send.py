"""Sending one request and keeping its answer (`work.send`), against the fake service: files and journal
lines in the crash-safe order, what a crash, a power cut or a full disk at each step leaves, and which
answers are `unknown` (maybe billed: never resent on their own) or `failed` (resent by the next run).

The service is the shared fake (tests/helpers/units.py: the `h` fixture, tests/work/conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import Any

import httpx
import pytest
from helpers.images import b64
from helpers.units import (
    CAT,
    IMAGES,
    TEXT,
    Crash,
    FullDisk,
    Harness,
    answer_png,
    crash,
    error,
    key12,
    native_no_image,
    success,
)

from imagebatch.work.records import UNKNOWN_HINT
from imagebatch.work.store import RequestRecord, read_jsonl
from imagebatch.work.unit import run_unit


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
    assert ctx.state.results == {} and not ctx.state.halt.is_set()


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

    from imagebatch.storage import appendlog

    store = h.context().store
    store.journal("outcome", sync=False, idempotency_key="k")
    calls: list[str] = []
    monkeypatch.setattr(appendlog.os, "fsync", lambda fd: calls.append(os.readlink(f"/proc/self/fd/{fd}")))
    store.backend.sync()
    assert calls == [str(store.backend.path("journal"))]
    store.backend.sync()
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


def test_native_500_is_unknown_and_not_resent(h: Harness) -> None:
    unit = h.unit(CAT)
    h.service.reply(error(500, "generation_error"))
    ctx = h.context()
    (rec,) = run_unit(ctx, unit)
    assert rec.status == "unknown" and UNKNOWN_HINT in (rec.error or "")
    assert not ctx.state.halt.is_set()
    assert run_unit(h.context(), unit)[0].status == "unknown"
    assert h.service.count == 1


def test_native_503_is_failed_and_resent_next_run(h: Harness) -> None:
    unit = h.unit(CAT)
    h.service.reply(error(503, "service_unavailable"))
    ctx = h.context()
    (rec,) = run_unit(ctx, unit)
    assert rec.status == "failed" and "HTTP 503" in (rec.error or "")
    assert not ctx.state.halt.is_set()
    (again,) = run_unit(h.context(), unit)
    assert h.service.count == 2 and again.status == "succeeded"
    # Attempts are counted across runs, in results and in the usage ledger alike.
    assert (rec.attempts, again.attempts) == (1, 2)
    assert [u["attempt"] for u in read_jsonl(h.out / "usage.jsonl")] == [1, 2]


def test_a_200_with_a_body_that_is_not_json_is_unknown(h: Harness) -> None:
    unit = h.unit(CAT)
    h.service.reply(b"<html>oops</html>")
    (rec,) = run_unit(h.context(), unit)
    assert rec.status == "unknown"
    assert run_unit(h.context(), unit)[0].status == "unknown"
    assert h.service.count == 1


@pytest.mark.parametrize("job", [IMAGES, TEXT], ids=["images", "messages"])
@pytest.mark.parametrize("no_answer", [httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.WriteTimeout])
def test_an_unanswered_attempt_is_unknown_and_not_retried(
    h: Harness, job: dict[str, Any], no_answer: type[httpx.TransportError]
) -> None:
    """On the routes with a retry schedule too: the request may have been billed, so neither the schedule
    nor a plain rerun sends it again; the journal says the attempt got no answer and waits for nothing."""
    unit = h.unit(job)
    h.service.reply(no_answer, error(503))
    (rec,) = run_unit(h.context(), unit)
    assert h.service.count == 1 and h.delays == []
    assert rec.status == "unknown" and rec.attempts == 1 and UNKNOWN_HINT in (rec.error or "")
    (finished,) = [e for e in h.events(rec.idempotency_key) if e["event"] == "attempt_finished"]
    assert (finished["outcome"], finished["retry_in"]) == ("no_answer", None)
    assert run_unit(h.context(), unit)[0].status == "unknown"
    assert h.service.count == 1


def test_images_route_four_503s_is_failed(h: Harness) -> None:
    unit = h.unit(IMAGES)
    h.service.reply(*[error(503)] * 4)
    (rec,) = run_unit(h.context(), unit)
    assert h.service.count == 4 and h.delays == [3, 8, 15]
    assert rec.status == "failed" and rec.attempts == 4


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
                ctx.state.stop("stopped by Ctrl-C")
            yield

        return slot

    ctx = h.context(slot=stopping_at(1))
    (rec,) = run_unit(ctx, first)
    assert rec.status == "not_attempted" and rec.error == "stopped by Ctrl-C"
    assert h.service.count == 0 and h.events() == []  # neither sent nor journaled

    h.service.reply(error(503, "service_unavailable"))
    ctx = h.context(slot=stopping_at(2))  # the run stops while the retry waits for its slot
    (rec,) = run_unit(ctx, retried)
    assert (
        ctx.state.halt.is_set() and rec.status == "succeeded" and rec.attempts == 2 and h.service.count == 2
    )


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
    assert (
        ctx.state.halt.is_set() and ctx.state.halt_reason == f"disk full at {h.out}: free space, then rerun"
    )
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
    assert ctx.state.halt_reason and ctx.state.halt_reason.startswith("disk full at")
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
