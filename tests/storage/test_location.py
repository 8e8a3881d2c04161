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
