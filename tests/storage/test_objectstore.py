"""The object-store kind of output location against a real S3-compatible server (moto): conditional
writes, an answer replayed by its files, and the store's refusals."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
from helpers.records import record

from imagebatch.storage.objectstore import ObjectLocation
from imagebatch.work.store import OutputStore


def test_the_server_honours_create_only_and_compare_and_swap(s3: Any) -> None:
    loc = ObjectLocation(f"s3://{s3.bucket()}/p")
    etag = loc.create("a", b"one")
    assert etag is not None
    assert loc.create("a", b"two") is None  # If-None-Match: * refused
    assert loc.get("a") == b"one"
    assert loc.create("a", b"one") == etag  # a retried create of our own bytes counts as done
    new = loc.replace("a", b"three", etag)
    assert new is not None and new != etag
    assert loc.replace("a", b"four", etag) is None  # If-Match on a stale ETag refused
    assert loc.get("a") == b"three"


def test_an_unsettled_answer_counts_as_done_only_if_its_files_are_there(s3: Any) -> None:
    store = OutputStore(f"s3://{s3.bucket()}/u")
    with store.backend.hold():
        for key in ("with", "without"):
            store.journal("attempt_started", idempotency_key=key, attempt=1)
            store.journal("attempt_finished", idempotency_key=key, outcome="ok")
            store.journal("answered", **asdict(record(key=key, paths=[f"images/j/{key}.png"])))
        store.write_file("j/with.png", b"png")  # then killed: no outcome journaled for either
    states = OutputStore(store.where).load_state()
    assert states["with"].status == "succeeded"
    assert states["without"].status == "unknown"


def test_a_missing_bucket_and_refused_credentials_are_named_without_the_secret(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = ObjectLocation("s3://no-such-bucket-here/p").check()
    assert missing is not None and "the bucket 'no-such-bucket-here' does not exist" in missing
    bucket = s3.bucket()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    refused = ObjectLocation(f"s3://{bucket}/p").check()
    assert refused is not None and "refused the credentials" in refused and f"'{bucket}'" in refused
    assert "wrong-secret-value" not in refused and s3.secret_key not in refused


def test_urls_with_credentials_or_queries_are_refused() -> None:
    for url in ("s3://key:secret@bucket/p", "s3://bucket/p?secret=1", "ftp://bucket/p"):
        with pytest.raises(ValueError, match="credentials come from the environment") as refused:
            ObjectLocation(url)
        assert "secret" not in str(refused.value)  # the URL is named without what it hid
