"""The run's records of finished units, kept in a nameless file in the output folder instead of memory."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from imagebatch.tasks import context as context_module
from imagebatch.tasks.context import RecordSpool
from imagebatch.tasks.store import RequestRecord


def rec(i: int, status: str = "succeeded") -> RequestRecord:
    return RequestRecord(
        job_id=f"job-{i}", request_index=0, turn_index=0, status=status,  # type: ignore[arg-type]
        model="native-image-2.1", route="native", idempotency_key=f"ib1-{i:032x}",
        paths=[f"images/job-{i}/0-{i:012x}.png"], images=1, request_id=f"req_{i:032x}",
    )  # fmt: skip


def test_records_go_to_a_nameless_file_and_come_back_equal(tmp_path: Path) -> None:
    spool = RecordSpool(tmp_path)
    spool[0] = [rec(0)]
    spool[2] = [rec(1), rec(2, "failed")]
    assert spool[0] == [rec(0)] and spool[2] == [rec(1), rec(2, "failed")]
    assert 0 in spool and 1 not in spool and sorted(spool) == [0, 2] and len(spool) == 2
    with pytest.raises(KeyError):
        spool[1]
    assert list(tmp_path.iterdir()) == []  # nothing named in the output folder, nothing left after a crash
    assert spool._fd is not None and os.fstat(spool._fd).st_size > 0 and not spool._memory
    spool[0] = [rec(9)]  # a unit's records replaced (never in a run, but a mapping allows it)
    assert spool[0] == [rec(9)]
    spool.close()
    assert spool._fd is None


def test_a_full_disk_keeps_the_records_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = RecordSpool(tmp_path)
    spool[0] = [rec(0)]

    def full(*_args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(context_module.os, "pwrite", full)
    spool[1] = [rec(1)]
    assert spool[0] == [rec(0)] and spool[1] == [rec(1)] and 1 in spool._memory
    assert RecordSpool(tmp_path / "missing")._fd is None  # no folder: memory from the start


def test_many_threads_write_and_read_their_own_records(tmp_path: Path) -> None:
    spool = RecordSpool(tmp_path)
    wrong: list[int] = []

    def work(start: int) -> None:
        for i in range(start, start + 200):
            spool[i] = [rec(i)]
            if spool[i] != [rec(i)]:
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(n * 200,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert wrong == [] and len(spool) == 1600
    assert all(spool[i][0].idempotency_key == f"ib1-{i:032x}" for i in range(1600))
