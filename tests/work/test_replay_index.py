"""The replayed state kept on disk past the replay's window (`work.replay.WINDOW`, `work.stateindex`): the
same states as in memory whatever the order of the journal's lines, a mapping that reads like a dict from
several threads at once, no file left under any name, and the variants counted without a walk."""

from __future__ import annotations

import os
import random
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from helpers.records import record

from imagebatch.work import replay as replay_module
from imagebatch.work.replay import KeyState, replay
from imagebatch.work.request_record import RequestRecord
from imagebatch.work.store import OutputStore


def key(n: int) -> str:
    return f"ib1-{n:032x}"


def key_events(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """One key's lines as runs write them: some attempts, and an ending drawn at random (an outcome, an
    answer never settled, an attempt in flight, nothing), some of them of a variant 2 or 3."""
    k = key(n)
    extra = {"variant": 1 + n % 3, "job_id": f"job{n // 7}", "request_index": n % 7, "turn_index": 0}
    out: list[dict[str, Any]] = []
    for attempt in range(1, rng.randint(1, 3) + 1):
        out.append({"event": "attempt_started", "idempotency_key": k, "attempt": attempt, **extra})
        outcome = rng.choice(["ok", "error", "no_answer", "not_sent"])
        out.append({"event": "attempt_finished", "idempotency_key": k, "outcome": outcome, **extra})
    ending = rng.choice(["outcome", "answered", "in flight", "none", "damaged"])
    rec = asdict(record(rng.choice(["succeeded", "failed", "no_image"]), k, paths=[f"images/{n}.png"]))
    if ending == "outcome":
        out.append({"event": "outcome", **rec, **extra})
    elif ending == "answered":
        out.append({"event": "answered", **rec, **extra})
    elif ending == "in flight":
        out.append({"event": "attempt_started", "idempotency_key": k, "attempt": 9, **extra})
    elif ending == "damaged":
        out.append({"event": "outcome", "idempotency_key": k, "status": "succeeded"})
    return out


def interleaved(keys: int, seed: int) -> list[dict[str, Any]]:
    """Every key's lines, the keys' lines mixed as concurrent requests mix them, and some keys named again
    long after (a later run's attempt), so the window must read states back from the file."""
    rng = random.Random(seed)
    pending = [key_events(n, rng) for n in range(keys)]
    out: list[dict[str, Any]] = []
    while pending:
        lines = pending[rng.randrange(min(len(pending), 8))]
        out.append(lines.pop(0))
        pending = [p for p in pending if p]
    for n in rng.sample(range(keys), keys // 5):
        out += key_events(n, rng)
    return out


def files_there(record: RequestRecord, settled: bool) -> bool:
    """Every third image is gone from the folder."""
    return not record.paths or int(record.paths[0].split("/")[1].split(".")[0]) % 3 != 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_on_disk_the_states_are_those_replayed_in_memory(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    events = interleaved(300, seed)
    in_memory = replay(events, files_there)
    assert not in_memory.on_disk
    for window in (0, 1, 7, 64):
        monkeypatch.setattr(replay_module, "WINDOW", window)
        on_disk = replay(events, files_there)
        assert on_disk.on_disk
        assert dict(on_disk.items()) == dict(in_memory.items())
        assert on_disk.newest == in_memory.newest
    statuses = {st.status for st in in_memory.values()}
    assert {"succeeded", "failed", "unknown", None} <= statuses  # the journal exercised every ending


def test_the_newest_variants_are_counted_as_a_walk_of_the_states_finds_them() -> None:
    index = replay(interleaved(100, 4), files_there)
    walked: dict[tuple[str, int, int], int] = {}
    for st in index.values():
        if st.request is not None:
            walked[st.request] = max(walked.get(st.request, 1), st.variant)
    assert walked and dict(index.newest) == walked


def test_the_index_reads_as_a_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_module, "WINDOW", 4)
    events = interleaved(50, 5)
    index = replay(events, files_there)
    named = {ev["idempotency_key"] for ev in events}
    assert index.on_disk and len(index) == len(named) == 50
    assert set(index) == set(index.keys()) == named
    assert key(3) in index and key(99) not in index and 3 not in index
    assert index[key(3)] == index.get(key(3)) and isinstance(index[key(3)], KeyState)
    assert index.get(key(99)) is None
    sentinel = KeyState(attempts=42)
    assert index.get(key(99), sentinel) is sentinel
    with pytest.raises(KeyError):
        index[key(99)]
    assert [k for k, _ in index.items()] == list(index)
    assert len(list(index.values())) == 50


def test_several_threads_read_the_index_while_one_walks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_module, "WINDOW", 8)
    index = replay(interleaved(400, 6), files_there)
    expected = {k: st.status for k, st in index.items()}
    wrong: list[str] = []

    def look(offset: int) -> None:
        for n in range(offset, 400, 4):
            st = index.get(key(n))
            if st is None or st.status != expected[key(n)]:
                wrong.append(key(n))

    threads = [threading.Thread(target=look, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    walked = {k: st.status for k, st in index.items()}
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert wrong == [] and walked == expected


def test_the_file_is_made_in_the_spool_folder_and_leaves_no_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_module, "WINDOW", 0)
    store = OutputStore(tmp_path / "out")
    store.backend.prepare()
    for n in range(20):
        store.journal("attempt_started", idempotency_key=key(n), attempt=1)
    before = sorted(p.name for p in (tmp_path / "out").rglob("*"))
    made: list[Path] = []
    real_unlink = os.unlink

    def unlink(path: str) -> None:
        made.append(Path(path))
        real_unlink(path)

    monkeypatch.setattr(os, "unlink", unlink)
    states = store.load_state(spool=store.backend.spool_folder)  # a run's: it holds the folder
    assert states.on_disk and len(states) == 20 and states[key(7)].status == "unknown"
    assert [p.parent for p in made] == [tmp_path / "out"]
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == before


def test_a_reader_makes_the_file_in_the_temporary_folder_and_leaves_the_folder_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_module, "WINDOW", 0)
    out = tmp_path / "out"
    store = OutputStore(out)
    store.backend.prepare()
    for n in range(20):
        store.journal("attempt_started", idempotency_key=key(n), attempt=1)
    (tmp_path / "temporary").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temporary"))
    made: list[Path] = []
    real_unlink = os.unlink

    def unlink(path: str) -> None:
        made.append(Path(path))
        real_unlink(path)

    monkeypatch.setattr(os, "unlink", unlink)
    before = {p: p.stat().st_mtime_ns for p in [out, *out.rglob("*")]}
    states = OutputStore(out).load_state()  # export's, the report's, the review's, validate --out's
    assert states.on_disk and len(states) == 20 and states[key(3)].status == "unknown"
    assert [p.parent for p in made] == [tmp_path / "temporary"]
    assert {p: p.stat().st_mtime_ns for p in [out, *out.rglob("*")]} == before


def test_a_folder_that_refuses_the_file_has_it_made_in_the_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_module, "WINDOW", 0)
    store = OutputStore(tmp_path / "out")
    store.backend.prepare()
    store.journal("attempt_started", idempotency_key=key(1), attempt=1)
    real_mkstemp = tempfile.mkstemp
    asked: list[str | None] = []

    def mkstemp(prefix: str, suffix: str, dir: str | Path | None = None) -> tuple[int, str]:
        asked.append(None if dir is None else str(dir))
        if dir is not None:
            raise PermissionError(13, "Permission denied", str(dir))  # a location this user may only read
        return real_mkstemp(prefix=prefix, suffix=suffix, dir=tmp_path / "temporary")

    (tmp_path / "temporary").mkdir()
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    states = store.load_state(spool=store.backend.spool_folder)
    assert states.on_disk and states[key(1)].status == "unknown"
    assert asked == [str(tmp_path / "out"), None]
    assert list((tmp_path / "temporary").iterdir()) == []
