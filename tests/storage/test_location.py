"""Atomic writes of the storage seam (`storage.location.write_atomic`): a reader sees the old file or the
whole new one, and no temporary file is left behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from helpers.records import leftovers

from imagebatch.storage.location import write_atomic


def test_write_atomic_replaces_the_whole_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.bin"
    write_atomic(path, b"a much longer first version of the file")
    write_atomic(path, b"short")
    assert path.read_bytes() == b"short"
    assert leftovers(path.parent) == []
    assert [p.name for p in path.parent.iterdir()] == ["a.bin"]


def test_write_atomic_failure_keeps_the_old_file_and_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")

    def broken_replace(src: Any, dst: Any) -> None:
        assert Path(src).exists()  # the temporary file was written, next to the target
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert leftovers(tmp_path) == []
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_write_atomic_interrupted_mid_write_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.bin"

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, b"new")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_shard_takes_its_lock_once_a_look_at_it_has_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent looks at a shard's lock by taking it for a moment (`shard_held`); a shard starting at
    that moment tries again (`SHARD_LOCK_PATIENCE`) instead of being refused. Here the look lets go at
    the shard's first wait, so the second try must succeed; one held for longer than the patience is
    refused."""
    import fcntl

    from imagebatch.storage import folder, layout
    from imagebatch.work.store import OutputLockedError, OutputStore

    look = (tmp_path / layout.shard_lock("0-of-2")).open("a")
    fcntl.flock(look.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # the parent's look, at that very moment
    waits: list[float] = []

    def waited(seconds: float) -> None:
        waits.append(seconds)
        fcntl.flock(look.fileno(), fcntl.LOCK_UN)  # the look is over

    monkeypatch.setattr(folder.time, "sleep", waited)
    with OutputStore(tmp_path, "0-of-2").backend.shard_hold():
        assert waits == [folder.LOOKED_AT]
    fcntl.flock(look.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # held for good now: a live shard
    now = [0.0]

    def later() -> float:  # each look at the clock a little later: the patience runs out
        now[0] += folder.SHARD_LOCK_PATIENCE / 3
        return now[0]

    monkeypatch.setattr(folder.time, "monotonic", later)
    monkeypatch.setattr(folder.time, "sleep", lambda _s: None)
    with pytest.raises(OutputLockedError, match="shard 0-of-2 is using"):
        with OutputStore(tmp_path, "0-of-2").backend.shard_hold():
            pass
    look.close()
