"""The run's record spool (its records of finished units, kept in a nameless file in the output folder instead
of memory) and its disk reserve (`work.spool`)."""

from __future__ import annotations

import errno
import os
import pickle
import threading
import tracemalloc
from pathlib import Path

import pytest

from imagebatch.work.spool import DiskReserve, RecordSpool, reserve_size
from imagebatch.work.store import RequestRecord


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


def test_units_finish_in_any_order_and_the_index_grows_to_the_highest(tmp_path: Path) -> None:
    spool = RecordSpool(tmp_path)
    for i in (7, 0, 3):
        spool[i] = [rec(i)]
    assert sorted(spool) == [0, 3, 7] and len(spool) == 3
    assert [spool[i] for i in (0, 3, 7)] == [[rec(0)], [rec(3)], [rec(7)]]
    for absent in (1, 2, 6, 8, 10**9, -1, "0", None):  # between, past the index, not an index at all
        assert absent not in spool
    with pytest.raises(KeyError):
        spool[5]
    with pytest.raises(KeyError):
        spool[8]
    with pytest.raises(ValueError, match="0 or more"):
        spool[-1] = [rec(1)]
    spool[3] = [rec(33)]  # replaced: counted once
    assert len(spool) == 3 and spool[3] == [rec(33)] and spool.get(4) is None


def test_iteration_is_a_snapshot(tmp_path: Path) -> None:
    disk = Disk(room=10**9)
    spool = RecordSpool(tmp_path, pwrite=disk)
    spool[0] = [rec(0)]
    disk.room = 0  # the next unit's records stay in memory
    spool[2] = [rec(2)]
    keys = iter(spool)
    disk.room = 10**9
    spool[1] = [rec(1)]
    assert list(keys) == [0, 2]  # the file's units in order, then memory's
    assert dict(spool.items()) == {0: [rec(0)], 1: [rec(1)], 2: [rec(2)]}


def test_the_index_holds_a_few_bytes_a_unit(tmp_path: Path) -> None:
    """Two 8-byte numbers a unit, whatever the run's size; a dict of tuples held about 200 bytes a unit."""
    units = 5_000
    spool = RecordSpool(tmp_path)
    spool[0] = [rec(0)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1, units):
            spool[i] = [rec(i)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(spool) == units and spool[units - 1] == [rec(units - 1)]
    assert held / units < 24, f"{held / units:.0f} bytes a unit"


class Disk:
    """`os.pwrite` on a disk with `room` bytes left: a write past it is cut short there (as the kernel does
    on a full disk), and one that starts there fails with ENOSPC."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.calls: list[tuple[int, int]] = []

    def __call__(self, fd: int, data: bytes, offset: int) -> int:
        self.calls.append((offset, len(data)))
        if offset >= self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.pwrite(fd, data[: self.room - offset], offset)


def test_a_full_disk_keeps_the_records_in_memory(tmp_path: Path) -> None:
    disk = Disk(room=10**9)
    spool = RecordSpool(tmp_path, pwrite=disk)
    spool[0] = [rec(0)]
    disk.room = 0
    spool[1] = [rec(1)]
    assert spool[0] == [rec(0)] and spool[1] == [rec(1)] and 1 in spool._memory
    assert RecordSpool(tmp_path / "missing")._fd is None  # no folder: memory from the start


def test_a_write_cut_short_by_a_full_disk_keeps_the_records_whole(tmp_path: Path) -> None:
    """A short `pwrite` (the disk filled during it) is not a whole one: the unit's records stay in memory,
    and later units overwrite the cut bytes."""
    first = len(pickle.dumps([rec(0)], protocol=pickle.HIGHEST_PROTOCOL))
    disk = Disk(room=first + 40)  # the second unit's write is cut short after 40 bytes
    spool = RecordSpool(tmp_path, pwrite=disk)
    for i in range(4):
        spool[i] = [rec(i), rec(100 + i, "failed")] if i else [rec(0)]
    assert [offset for offset, _ in disk.calls[:3]] == [0, first, first + 40]  # the rest was tried
    assert spool._in_file_at(0) and {1, 2, 3} <= spool._memory.keys()
    assert spool[0] == [rec(0)]
    assert all(spool[i] == [rec(i), rec(100 + i, "failed")] for i in (1, 2, 3))
    disk.room = 10**9  # space freed: later units go to the file again, after the last whole one
    spool[4] = [rec(4)]
    assert spool._offsets[4] == first and spool[4] == [rec(4)] and spool[1][0] == rec(1)
    assert len(spool) == 5 and sorted(spool) == [0, 1, 2, 3, 4]


def test_a_short_write_with_room_left_is_finished(tmp_path: Path) -> None:
    """A write may be cut short for other reasons (a signal): the rest is written, the unit stays on disk."""

    def halves(fd: int, data: bytes, offset: int) -> int:
        return os.pwrite(fd, data[: max(1, len(data) // 2)], offset)

    spool = RecordSpool(tmp_path, pwrite=halves)
    spool[0], spool[1] = [rec(0)], [rec(1)]
    assert not spool._memory and spool[0] == [rec(0)] and spool[1] == [rec(1)]


def test_a_reserve_holds_disk_space_until_it_is_released(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path, 1 << 20)
    assert reserve.held and list(tmp_path.iterdir()) == []  # nameless: nothing left after a crash
    assert reserve._fd is not None and os.fstat(reserve._fd).st_blocks * 512 >= 1 << 20  # allocated
    reserve.release()
    reserve.release()
    assert not reserve.held
    assert not DiskReserve(tmp_path / "missing", 1 << 20).held  # no folder: a run without one
    assert reserve_size(0) == 64 * 1024 and reserve_size(10**6) == 64 << 20


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
