"""An object store (S3, GCS, Azure Blob, or an S3-compatible one) as an output location (`ObjectLocation`),
with the same guarantees as a local folder, built on whole-object PUTs, create-only writes
(`If-None-Match: *`) and compare-and-swap on an ETag (`If-Match`), through `obstore` (Rust
`object_store`). Credentials come from each cloud's standard chain, never from a parameter; no message of
this module holds a credential or a response body. The journal's segments are `storage.segments`, the
lock's lease `storage.lease`, both built on these writes.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import re
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from itertools import islice
from typing import Any, BinaryIO

with contextlib.suppress(ModuleNotFoundError):  # the s3 extra: ObjectLocation() says it is missing
    import obstore
    from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError

from imagebatch.extras import needs_extra
from imagebatch.storage import layout
from imagebatch.storage.bounded import MAX_RECORD_BYTES, check_size
from imagebatch.storage.location import check_store_config, shown_url

RETRY: dict[str, Any] = {
    "max_retries": 10,
    "retry_timeout": timedelta(seconds=60),
    "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=8), "base": 2},
}
"""obstore's retries (exponential backoff with jitter) of 5xx answers (503 SlowDown, 500), connection
errors, dropped connections and read timeouts; a write that still fails stops the run as a full disk."""
READ_THREADS = 16
"""Journal segments fetched at once when a rerun replays them."""
PART_BYTES = 8 << 20
"""The part of a streamed upload (S3 takes 5 MiB to 5 GiB but the last): what one part in flight holds."""
PARTS_IN_FLIGHT = 2
"""Parts of one streamed upload sent at once: its memory is about `PART_BYTES` times this."""
READ_CHUNK_BYTES = 4 << 20
"""The chunk an object read as a stream (the compacted journal) arrives in."""

_URL = re.compile(r"^(?P<scheme>s3|gs|az)://(?P<bucket>[^/?#@]+)(?:/(?P<prefix>[^?#@]*))?$", re.IGNORECASE)


def split_url(url: str) -> tuple[str, str, str]:
    """`scheme://bucket/prefix` as (scheme in lower case, bucket, prefix without its outer slashes);
    ValueError for anything else, or a URL that holds credentials (`s3://key:secret@...`)."""
    match = _URL.match(url.rstrip("/"))
    if match is None:
        secret = any(c in url for c in "@?#")
        why = "holds a user, password or query" if secret else "is not an object store URL"
        raise ValueError(
            f"{shown_url(url)!r} {why}: use s3://bucket/prefix, gs://bucket/prefix or "
            "az://container/prefix (credentials come from the environment, never the URL)"
        )
    return match["scheme"].lower(), match["bucket"], (match["prefix"] or "").strip("/")


class StoreError(OSError):
    """A request to the object store that failed for good (after retries): handled as a failed disk
    write (the run stops dispatching). The message names the place and the cause, never a credential."""


def describe(exc: BaseException) -> str:
    """The cause of a store error in a few words: the service's error code and HTTP status, or the kind
    of failure. The response body and headers are left out (they may echo an access key id)."""
    text = str(exc)
    code = re.search(r"<Code>([A-Za-z]+)</Code>", text)
    status = re.search(r"status code: (\d{3})", text)
    if code or status:
        parts = [code.group(1) if code else "", f"HTTP {status.group(1)}" if status else ""]
        return ", ".join(p for p in parts if p)
    for needle, why in (
        ("onnection refused", "connection refused"),
        ("dns error", "the endpoint's name does not resolve"),
        ("timed out", "timed out"),
        ("error sending request", "the endpoint could not be reached"),
    ):
        if needle in text:
            return why
    return type(exc).__name__


class ObjectLocation:
    """One `scheme://bucket/prefix` of an object store, as a `Location`."""

    def __init__(
        self, url: str, *, retry: dict[str, Any] | None = None, client_options: dict[str, Any] | None = None
    ) -> None:
        self.scheme, self.bucket, self.prefix = split_url(url)
        check_store_config(self.scheme, self.prefix)
        self.url = f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        with needs_extra("s3", f"an object store location ({self.scheme}://)"):
            from obstore.store import AzureStore, GCSStore, S3Store

        kind = {"s3": S3Store, "gs": GCSStore, "az": AzureStore}[self.scheme]
        options: dict[str, Any] = {"retry_config": retry or RETRY, "client_options": client_options or None}
        self.store: Any = kind(self.bucket, prefix=self.prefix or None, **options)
        self.record_limit = MAX_RECORD_BYTES
        """The largest object read (`storage.bounded`): its size is known from the GET's answer, before
        its body is read, so a larger one costs nothing but the refusal."""

    @contextlib.contextmanager
    def _failing(self, what: str, name: str) -> Iterator[None]:
        try:
            yield
        except BaseError as exc:
            raise StoreError(errno.EIO, f"{what} {self.url}/{name} failed: {describe(exc)}") from None
        except (FileNotFoundError, PermissionError, ConnectionError, TimeoutError) as exc:
            raise StoreError(errno.EIO, f"{what} {self.url}/{name} failed: {describe(exc)}") from None

    def create(self, name: str, data: bytes) -> str | None:
        """Write `name` only if absent; its ETag, or None if it existed (and holds other bytes)."""
        with self._failing("writing", name):
            try:
                return str(obstore.put(self.store, name, data, mode="create")["e_tag"])
            except AlreadyExistsError:
                pass
        # A create whose answer was lost is retried and refused: the object is then our own bytes.
        got = self.get_tagged(name)
        return got[1] if got is not None and got[0] == data else None

    def replace(self, name: str, data: bytes, etag: str) -> str | None:
        """Write `name` only if its ETag is still `etag` (compare-and-swap); the new ETag, or None."""
        with self._failing("writing", name):
            try:
                return str(obstore.put(self.store, name, data, mode={"e_tag": etag})["e_tag"])
            except (PreconditionError, FileNotFoundError):
                return None

    def put_new(self, name: str, data: bytes) -> bool:
        return self.create(name, data) is not None

    def put(self, name: str, data: bytes) -> None:
        with self._failing("writing", name):
            obstore.put(self.store, name, data)

    def put_stream(self, name: str, chunks: Iterable[bytes] | BinaryIO) -> None:
        """Write `name` from `chunks` (or a file open for reading, from where it stands) as a multipart
        upload, `PART_BYTES` a part: the whole object is never in memory. Chunks are first spooled to a
        temporary file (obstore reads an iterator inside its own runtime, where a chunk that itself reads
        the store would stop it), so a caller may stream one object of the store into another.

        It replaces any object of that name, as `put`: a multipart upload cannot be create-only through
        obstore (any conditional put is one request), so a caller that must not overwrite checks first,
        under the lease that keeps other runs out. A failed upload is aborted, leaving no object (an
        abort itself lost leaves hidden parts, which a bucket's rule for incomplete uploads removes)."""
        if not isinstance(chunks, Iterable) or hasattr(chunks, "read"):
            with self._failing("writing", name):
                obstore.put(self.store, name, chunks, chunk_size=PART_BYTES, max_concurrency=PARTS_IN_FLIGHT)
            return
        with tempfile.TemporaryFile(prefix="imagebatch-upload-") as spool:
            for chunk in chunks:
                spool.write(chunk)
            spool.seek(0)
            self.put_stream(name, spool)

    def get_stream(self, name: str) -> Iterator[bytes] | None:
        """The bytes of `name` as chunks of about `READ_CHUNK_BYTES`, never whole (no size bound: its
        reader bounds its lines); None if there is no such object."""
        with self._failing("reading", name):
            try:
                result = obstore.get(self.store, name)
            except FileNotFoundError:
                return None
        return self._chunks(name, result)

    def _chunks(self, name: str, result: Any) -> Iterator[bytes]:
        with self._failing("reading", name):
            for chunk in result.stream(min_chunk_size=READ_CHUNK_BYTES):
                yield bytes(chunk)

    def get_tagged(self, name: str) -> tuple[bytes, str] | None:
        with self._failing("reading", name):
            try:
                result = obstore.get(self.store, name)
                check_size(f"{self.url}/{name}", int(result.meta["size"]), self.record_limit)
                return bytes(result.bytes()), str(result.meta["e_tag"])
            except FileNotFoundError:
                return None

    def get_bounded(self, name: str, limit: int) -> tuple[bytes, int] | None:
        """The bytes of `name` and its size, read only when its size is under `limit` (else no byte of
        it is read: `b""` and the size); None if there is no such object. `StoreError` for a bucket that
        does not exist, as for any other failure: only a missing object is None."""
        with self._failing("reading", name):
            try:
                result = obstore.get(self.store, name)
            except FileNotFoundError as exc:
                if "NoSuchBucket" in str(exc) or "ContainerNotFound" in str(exc):
                    why = f"the bucket {self.bucket!r} does not exist ({describe(exc)})"
                    raise StoreError(errno.ENOENT, f"reading {self.url}/{name} failed: {why}") from None
                return None
            size = int(result.meta["size"])
            return (bytes(result.bytes()) if size < limit else b""), size

    def get(self, name: str) -> bytes | None:
        got = self.get_tagged(name)
        return None if got is None else got[0]

    def exists(self, name: str) -> bool:
        return self.modified(name) is not None

    def modified(self, name: str) -> datetime | None:
        """When `name` was last written (the store's clock), or None if there is no such object."""
        with self._failing("reading", name):
            try:
                return obstore.head(self.store, name)["last_modified"]
            except FileNotFoundError:
                return None

    def list(self, prefix: str) -> list[str]:
        with self._failing("listing", prefix):
            return sorted(str(m["path"]) for batch in obstore.list(self.store, prefix) for m in batch)

    def list_top(self) -> builtins.list[str]:
        """The names of the objects directly in the prefix (not under a `folder/` of it), sorted: one
        request. `list(prefix)` takes a folder-like prefix (`journal/`), never the start of a name."""
        with self._failing("listing", ""):
            return sorted(str(m["path"]) for m in obstore.list_with_delimiter(self.store)["objects"])

    def list_meta(self, prefix: str) -> builtins.list[builtins.list[Any]]:
        """[name, size, ETag] of each object under the folder-like `prefix` (`journal/`), sorted by name:
        one listing request (a page per 1,000 objects)."""
        with self._failing("listing", prefix):
            metas = [m for batch in obstore.list(self.store, prefix) for m in batch]
        return sorted([str(m["path"]), int(m["size"]), m.get("e_tag")] for m in metas)

    def meta(self, name: str) -> builtins.list[Any]:
        """[name, size, ETag] of the object `name`, or [name, None] when there is none: one HEAD."""
        with self._failing("reading", name):
            try:
                m = obstore.head(self.store, name)
            except FileNotFoundError:
                return [name, None]
        return [name, int(m["size"]), m.get("e_tag")]

    def delete(self, name: str) -> None:
        with self._failing("deleting", name), contextlib.suppress(FileNotFoundError):
            obstore.delete(self.store, name)

    def delete_many(self, names: builtins.list[str]) -> None:
        """Remove `names` in bulk (S3's DeleteObjects: up to 1,000 a request)."""
        if names:
            with self._failing("deleting", names[0]):
                obstore.delete(self.store, names)

    def get_many(self, names: builtins.list[str]) -> builtins.list[bytes | None]:
        """The bytes of `names`, in order, fetched `READ_THREADS` at a time."""
        return list(self.iter_many(names))

    def iter_many(self, names: builtins.list[str]) -> Iterator[bytes | None]:
        """The bytes of `names` (None for one not there), in order, one at a time to the caller while at
        most `READ_THREADS` are being fetched: memory holds a window of objects, never all of them."""
        if len(names) <= 1:
            yield from (self.get(n) for n in names)
            return
        todo = iter(names)
        with ThreadPoolExecutor(min(READ_THREADS, len(names)), thread_name_prefix="imagebatch-read") as ex:
            window: deque[Future[bytes | None]] = deque(
                ex.submit(self.get, n) for n in islice(todo, READ_THREADS)
            )
            while window:
                blob = window.popleft().result()
                if (name := next(todo, None)) is not None:
                    window.append(ex.submit(self.get, name))
                yield blob

    def check(self) -> str | None:
        """Why this place cannot be used (a missing bucket, refused credentials, no endpoint), in one
        line naming the bucket; None if a listing works."""
        try:
            next(iter(obstore.list(self.store, layout.JOURNAL_SEGMENTS, chunk_size=1)), None)
        except Exception as exc:
            cause = describe(exc)
            if "NoSuchBucket" in cause or ("HTTP 404" in cause and "Code" not in cause):
                return f"the bucket {self.bucket!r} does not exist ({cause})"
            if "HTTP 403" in cause or "HTTP 401" in cause:
                return (
                    f"the store refused the credentials for the bucket {self.bucket!r} ({cause}): check "
                    "the store's credential chain (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, a profile)"
                )
            return f"the bucket {self.bucket!r} cannot be reached ({cause})"
        return None
