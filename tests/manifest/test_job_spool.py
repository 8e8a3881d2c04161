"""A manifest's jobs kept on disk (`manifest.spool`), its ids by their hashes (`manifest.ids`), and its text
read in blocks (`manifest.textfile`): the same jobs, in the same order, and the same problems as when
everything was held in memory."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.manifests import collide_and_count_readings

from imagebatch.manifest import Job, Manifest, ManifestError, load_manifest, plan, spool, textfile
from imagebatch.manifest.ids import IdHashes


def job(i: int) -> Job:
    return Job(id=f"j-{i}", line=i + 2, location=f"line {i + 2}", prompt=f"p {i}", model="m", route="native")


def ids(jobs: Any) -> list[str]:
    return [j.id for j in jobs]


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(spool, "CHUNK", 4)
    return 4


def test_jobs_on_disk_come_back_in_order_as_often_as_iterated_counted_and_indexed(small_chunks: int) -> None:
    made = [job(i) for i in range(11)]  # two full chunks and a part
    writer = spool.JobSpool()
    for j in made:
        writer.add(j)
    jobs = writer.jobs()
    assert jobs.on_disk
    assert len(jobs) == 11
    assert list(jobs) == made
    assert list(jobs) == made  # again, from the file
    assert jobs == made and made == list(jobs)
    assert [jobs[i] for i in (0, 4, 10, -1, 3)] == [made[0], made[4], made[10], made[10], made[3]]
    assert jobs[2:9:3] == made[2:9:3]
    with pytest.raises(IndexError):
        jobs[11]
    # Two readers at once, from two threads, each in order.
    got: dict[int, list[str]] = {}

    def read(n: int) -> None:
        got[n] = [j.id for _ in range(20) for j in jobs]

    threads = [threading.Thread(target=read, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert got == {n: ids(made) * 20 for n in range(2)}


def test_one_chunk_of_jobs_stays_in_memory_with_no_file(small_chunks: int) -> None:
    writer = spool.JobSpool()
    for i in range(small_chunks):
        writer.add(job(i))
    jobs = writer.jobs()
    assert not jobs.on_disk
    assert ids(jobs) == ids(job(i) for i in range(small_chunks))


def test_a_spool_that_cannot_make_its_file_keeps_every_job_in_memory(
    small_chunks: int, tmp_path: Path
) -> None:
    writer = spool.JobSpool(folder=str(tmp_path / "no-such-folder"))
    made = [job(i) for i in range(10)]
    for j in made:
        writer.add(j)
    jobs = writer.jobs()
    assert not jobs.on_disk
    assert list(jobs) == made and len(jobs) == 10


@pytest.mark.parametrize("fault", ["fails", "short then fails", "makes no progress"])
def test_a_write_that_fails_keeps_that_chunk_and_the_rest_in_memory_and_loses_nothing(
    fault: str, small_chunks: int
) -> None:
    import os

    calls = {"n": 0}

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] == 1:  # the first chunk is written whole
            return os.pwrite(fd, data, offset)
        if fault == "fails":
            raise OSError(28, "No space left on device")
        if fault == "makes no progress":
            return 0
        if calls["n"] == 2:
            return os.pwrite(fd, data[:5], offset)  # a short write, then a failure
        raise OSError(28, "No space left on device")

    writer = spool.JobSpool(pwrite=pwrite)
    made = [job(i) for i in range(13)]
    for j in made:
        writer.add(j)
    jobs = writer.jobs()
    assert jobs.on_disk  # the first chunk
    assert list(jobs) == made and list(jobs) == made
    assert [jobs[i] for i in range(13)] == made


def test_a_loaded_manifest_keeps_its_jobs_on_disk_equal_to_those_of_a_list(
    small_chunks: int, tmp_path: Path
) -> None:
    rows = "".join(f"r-{i},native,a cat {i},{i % 3}\n" for i in range(10))
    path = tmp_path / "m.csv"
    path.write_text("id,route,prompt,extra\n" + rows)
    manifest = load_manifest(path)
    assert isinstance(manifest.jobs, spool.Jobs) and manifest.jobs.on_disk
    assert ids(manifest.jobs) == [f"r-{i}" for i in range(10)]
    assert [j.metadata for j in manifest.jobs] == [{"extra": str(i % 3)} for i in range(10)]
    assert manifest.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    # A manifest built from a list of the same jobs plans the same requests, keys included.
    listed = Manifest(path=path, sha256=manifest.sha256, format="csv", jobs=list(manifest.jobs))
    assert list(plan(listed)) == list(plan(manifest))
    # A shard keeps only its own, on disk as well.
    kept = load_manifest(path, keep=lambda j: j.id.endswith(("1", "5", "7")))
    assert ids(kept.jobs) == ["r-1", "r-5", "r-7"]


def test_duplicate_ids_are_named_as_before_among_thousands_of_rows(tmp_path: Path) -> None:
    lines = [f"sku-{i:05d},a mug {i}" for i in range(6000)]
    lines[1000] = "sku-00010,a copy"  # line 1002 repeats line 12
    lines[5999] = "SKU-00020,another"  # line 6001 differs from line 22 only by case
    lines[4000] = "sku-00010,again"  # line 4002 repeats line 12 too
    path = tmp_path / "m.csv"
    path.write_text("id,prompt\n" + "\n".join(lines) + "\n")
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert [str(p) for p in caught.value.problems] == [
        "line 1002 (id=sku-00010), field id: duplicate id 'sku-00010': also used on line 12",
        "line 4002 (id=sku-00010), field id: duplicate id 'sku-00010': also used on line 12",
        "line 6001 (id=SKU-00020), field id: id 'SKU-00020' differs from 'sku-00020' (line 22) only by case "
        "(their file names would collide on case-insensitive file systems)",
    ]


def test_two_ids_of_one_hash_are_read_again_and_the_manifest_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collision of two different ids' hashes (too rare to meet by chance) costs a second reading."""
    path = tmp_path / "m.csv"
    path.write_text("id,prompt\n" + "".join(f"id-{i},a cat\n" for i in range(50)))
    reads = collide_and_count_readings(monkeypatch, "id-30")
    manifest = load_manifest(path)
    assert ids(manifest.jobs) == [f"id-{i}" for i in range(50)]
    assert len(reads) == 2


def test_a_manifest_that_changes_between_its_two_readings_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id,prompt\na,one\na,two\n")
    real = textfile.TextBlocks.__iter__

    def changing(self: textfile.TextBlocks) -> Iterator[str]:
        yield from real(self)
        path.write_text("id,prompt\na,one\na,three\n")  # after the first reading

    monkeypatch.setattr(textfile.TextBlocks, "__iter__", changing)
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert [str(p) for p in caught.value.problems] == [
        "the manifest changed while it was read; check it again"
    ]


def test_the_id_hashes_hold_every_value_they_are_given_and_note_each_repeat() -> None:
    hashes = IdHashes()
    values = [hash(f"id-{i}") for i in range(5000)] + [0]
    assert all(hashes.add(v) for v in values)
    assert len(hashes) == 5001
    assert all(v in hashes for v in values)
    assert hash("not-added") not in hashes
    assert not hashes.repeated
    assert not hashes.add(values[1234])
    assert hashes.repeated == {values[1234]}


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_text_read_in_small_blocks_gives_the_same_jobs_problems_and_digest(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if fmt == "csv":
        body = "id,prompt,note\n" + "".join(f'r{i},"a cat\nnumber {i}",x\n' for i in range(30))
        body += "bad id!,a dog,x\nz,nul \x00 here,x\n"
    else:
        body = "".join(f'{{"id": "r{i}", "prompt": "a cat {i}"}}\n' for i in range(30))
        body += '{"id": "bad id!", "prompt": "a dog"}\n\nnot json\n{"id": "z", "prompt": "nul \\u0000"}'
    path = tmp_path / f"m.{fmt}"
    path.write_bytes(("\ufeff" + body).encode())

    def outcome() -> list[str]:
        with pytest.raises(ManifestError) as caught:
            load_manifest(path)
        return [str(p) for p in caught.value.problems]

    whole = outcome()
    monkeypatch.setattr(textfile, "BLOCK", 7)
    assert outcome() == whole
    assert len(whole) == 3 if fmt == "jsonl" else len(whole) == 2
    assert any("NUL" in p for p in whole)
    path.write_bytes(("\ufeff" + body.split("bad id!")[0].rsplit("\n", 1)[0] + "\n").encode())
    small = load_manifest(path)
    monkeypatch.setattr(textfile, "BLOCK", 1 << 20)
    assert list(load_manifest(path).jobs) == list(small.jobs)
    assert small.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_bad_byte_far_into_a_file_is_named_by_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(textfile, "BLOCK", 64)
    path = tmp_path / "m.csv"
    path.write_bytes(b"id,prompt\n" + b"".join(b"r%d,a cat\n" % i for i in range(100)) + b"x,caf\xe9\n")
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert [str(p) for p in caught.value.problems] == [
        "line 102: the file is not UTF-8 text (byte 0xe9 cannot be decoded) "
        "(save it as UTF-8 (in a spreadsheet program: 'CSV UTF-8'))"
    ]
