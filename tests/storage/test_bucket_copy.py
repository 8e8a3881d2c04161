"""A bucket's local copy (`BucketBackend.local_copy`) against a real S3-compatible server (moto): objects
streamed into their files (never read whole), a window of them at a time, and a fetch cut short leaving
no half file."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from typing import Any

import pytest

from imagebatch.storage import objectstore
from imagebatch.storage.bucket import BucketBackend
from imagebatch.storage.objectstore import ObjectLocation, StoreError


def whole_reads_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any read of an object whole fails the test: a fetch must stream."""

    def refused(self: ObjectLocation, name: str, *_: Any) -> None:
        raise AssertionError(f"{name} read whole")

    monkeypatch.setattr(ObjectLocation, "get_tagged", refused)
    monkeypatch.setattr(ObjectLocation, "get_bounded", refused)


def test_a_fetch_streams_each_object_into_its_file(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = s3.bucket()
    big = b"".join(b"row %06d,succeeded,images/item-%06d.png\n" % (i, i) for i in range(60_000))  # ~2.4 MB
    s3.client.put_object(Bucket=bucket, Key="p/results.csv", Body=big)
    images = {f"images/j/{i}.png": os.urandom(100 + i) for i in range(50)}  # more than a window of them
    for name, data in images.items():
        s3.client.put_object(Bucket=bucket, Key=f"p/{name}", Body=data)
    monkeypatch.setattr(objectstore, "READ_CHUNK_BYTES", 64 << 10)  # results.csv arrives in ~40 chunks
    whole_reads_refused(monkeypatch)

    with BucketBackend(f"s3://{bucket}/p").local_copy() as copy:
        copy.fetch(["results.csv", *images, "images/j/missing.png", "../outside.png"], ["images/j/kept.png"])

        assert (copy.folder / "results.csv").read_bytes() == big
        assert all((copy.folder / name).read_bytes() == data for name, data in images.items())
        assert not (copy.folder / "images/j/missing.png").exists()  # not in the bucket: skipped
        assert not (copy.folder.parent / "outside.png").exists()
        kept = copy.folder / "images/j/kept.png"
        assert kept.read_bytes() == b"" and kept.stat().st_mtime == 0  # a placeholder dated 1970
        left = sorted(p.name for p in copy.folder.rglob(".imagebatch-fetch-*"))
        assert left == []


def test_a_fetch_cut_short_leaves_no_half_file(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = s3.bucket()
    s3.client.put_object(Bucket=bucket, Key="p/results.csv", Body=b"x" * 300_000)
    monkeypatch.setattr(objectstore, "READ_CHUNK_BYTES", 64 << 10)
    streamed = ObjectLocation.get_stream

    def dropped(self: ObjectLocation, name: str) -> Iterator[bytes] | None:
        chunks = streamed(self, name)
        assert chunks is not None

        def cut() -> Iterator[bytes]:
            yield next(chunks)
            raise StoreError(errno.EIO, f"reading {name} failed: connection reset")

        return cut()

    monkeypatch.setattr(ObjectLocation, "get_stream", dropped)
    with BucketBackend(f"s3://{bucket}/p").local_copy() as copy:
        with pytest.raises(StoreError, match="connection reset"):
            copy.fetch(["results.csv"])
        assert sorted(p.name for p in copy.folder.iterdir()) == []  # neither a half results.csv nor its part
