"""An object store (S3, GCS, Azure Blob, or an S3-compatible one) as an output location, with the same
guarantees as a local folder, built on whole-object PUTs, create-only writes (`If-None-Match: *`) and
compare-and-swap on an ETag (`If-Match`), through `obstore` (Rust `object_store`).

- `ObjectLocation`: the `Location` of one `scheme://bucket/prefix`. Credentials come from each cloud's
  standard chain (for S3: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, a profile or
  an instance role; `AWS_ENDPOINT_URL` and `AWS_ALLOW_HTTP` for an S3-compatible server), never from a
  parameter; no message of this module holds a credential or a response body.
- `SegmentJournal`: the journal as append-only segments, one create-only object per group commit,
  `journal/<run>-[<shard>-]<seq>.jsonl` (zero-padded: listing gives the order), compacted at a run's end.
- `Lease`: the folder lock as an object (`.imagebatch.lease`), taken create-only and renewed by
  compare-and-swap; it expires `LEASE_SECONDS` after its last renewal, and only then may another run take
  the prefix over. A sharded run's parent holds it (marked with its number of shards) from its start to
  its end; each shard holds a lease of its own (`.imagebatch.shard-I-of-N.lease`) and writes only while
  its parent's lease is live (`ParentLease`), so no run can take the prefix over while a shard writes.

One module over 450 lines on purpose: the segments' names, the compaction, the lease and the location
share one contract with the store (create-only writes that recognise their own retried success, one
fencing clock); split, the lease's fencing and the segments' writes that rely on it would be in two files
that must change together. The store-neutral part is already `storage.location`.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError

from imagebatch.storage.location import OutputLockedError, check_store_config, json_object, shown_url

LEASE_NAME = ".imagebatch.lease"


def shard_lease_name(shard: str) -> str:
    """The lease shard `I-of-N` of a sharded run holds alone while it sends (the folder's shard lock)."""
    return f".imagebatch.shard-{shard}.lease"


LEASE_SECONDS = 60.0
"""How long a lease lasts past its last renewal. A crashed run's prefix can be taken over this long after
it died: short next to a pod's restart, long enough to ride out two missed renewals plus a store's
retries (a renewal that fails transiently is tried again at the next tick)."""
RENEW_SECONDS = 20.0
"""How often the holder renews (a third of the expiry)."""
SAFETY_SECONDS = 10.0
"""The holder stops writing journal segments this long before its lease would expire in its own view,
so that a run that was paused (or cut off) past its expiry cannot write after another machine, whose
clock agrees within that margin (NTP), has taken the prefix over."""
RETRY: dict[str, Any] = {
    "max_retries": 10,
    "retry_timeout": timedelta(seconds=60),
    "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=8), "base": 2},
}
"""obstore's retries (exponential backoff with jitter) of 5xx answers (503 SlowDown, 500), connection
errors, dropped connections and read timeouts; a write that still fails stops the run as a full disk."""
READ_THREADS = 16
"""Journal segments fetched at once when a rerun replays them."""

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
        from obstore.store import AzureStore, GCSStore, S3Store

        kind = {"s3": S3Store, "gs": GCSStore, "az": AzureStore}[self.scheme]
        options: dict[str, Any] = {"retry_config": retry or RETRY, "client_options": client_options or None}
        self.store: Any = kind(self.bucket, prefix=self.prefix or None, **options)

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

    def get_tagged(self, name: str) -> tuple[bytes, str] | None:
        with self._failing("reading", name):
            try:
                result = obstore.get(self.store, name)
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
        if len(names) <= 1:
            return [self.get(n) for n in names]
        with ThreadPoolExecutor(min(READ_THREADS, len(names)), thread_name_prefix="imagebatch-read") as ex:
            return list(ex.map(self.get, names))

    def check(self) -> str | None:
        """Why this place cannot be used (a missing bucket, refused credentials, no endpoint), in one
        line naming the bucket; None if a listing works."""
        try:
            next(iter(obstore.list(self.store, JOURNAL, chunk_size=1)), None)
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


# -- the journal as segments --

JOURNAL = "journal/"


def _run_of(name: str) -> int:
    """The run number of a journal object's name (`journal/00000003-...`), or -1 for a stranger."""
    stem = name.removeprefix(JOURNAL)
    return int(stem[:8]) if stem[:8].isdigit() else -1


def journal_objects(names: list[str]) -> list[str]:
    """The journal objects a reader replays, in order: the latest compaction, then every segment of a
    later run (a compaction holds every earlier line; segments it left behind, by a crash before they
    were deleted, are ignored)."""
    names = [n for n in names if n.endswith(".jsonl") and _run_of(n) >= 0]
    compacts = [n for n in names if n.endswith("-compact.jsonl")]
    if not compacts:
        return names
    last = max(compacts, key=_run_of)
    return [last] + [n for n in names if _run_of(n) > _run_of(last)]


def next_run(names: list[str]) -> int:
    """The number of a new run's segments: one past every run the journal holds."""
    return max((_run_of(n) for n in names), default=0) + 1


def read_lines(data: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects of a segment's lines (a line that does not parse is skipped, as a torn one)."""
    for raw in data.splitlines():
        if (obj := json_object(raw)) is not None:
            yield obj


def read_journal(loc: ObjectLocation) -> Iterator[dict[str, Any]]:
    """Every line of the journal (and the usage lines it carries), in order; segments fetched in parallel."""
    for blob in loc.get_many(journal_objects(loc.list(JOURNAL))):
        if blob is not None:  # a segment removed since the listing (a compaction): its lines are in it
            yield from read_lines(blob)


class SegmentJournal:
    """Lines appended by a run's threads, made durable together: a thread that needs its line durable
    either finds a PUT that started after its line covered it, or PUTs every pending line as one new
    segment itself (group commit, as one fsync covers many lines in a local folder). A failed PUT fails
    every thread whose line it held: those lines are lost, as a torn write's are, and the run stops."""

    def __init__(
        self,
        loc: ObjectLocation,
        run: int,
        shard: str | None = None,
        fence: Callable[[], None] = lambda: None,
    ) -> None:
        self.loc = loc
        self.run = run
        self.shard = shard
        self.fence = fence
        """Raises (an OSError) when this run may no longer write: its lease is lost or about to expire."""
        self.puts = 0
        self._seq = 0
        self._pending: list[bytes] = []
        self._written = 0
        self._synced = 0
        self._failed: list[tuple[int, int, OSError]] = []
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()

    def append(self, line: bytes, sync: bool) -> None:
        with self._lock:
            self._pending.append(line)
            self._written += 1
            written = self._written
        if sync:
            self.sync_through(written)

    def sync(self) -> None:
        with self._lock:
            written = self._written
        self.sync_through(written)

    def sync_through(self, written: int) -> None:
        """Return once the first `written` lines are in a segment; raise if the PUT that held one failed."""
        with self._commit_lock:
            for start, end, exc in self._failed:
                if start < written <= end:
                    raise exc
            if self._synced >= written:
                return
            with self._lock:
                lines, self._pending = self._pending, []
                start, upto = self._synced, self._written
            try:
                self.fence()
                self._put(b"".join(lines))
            except OSError as exc:
                self._failed.append((start, upto, exc))
                self._synced = upto
                raise
            self._synced = upto

    def _put(self, data: bytes) -> None:
        self._seq += 1
        shard = f"{self.shard}-" if self.shard else ""
        name = f"{JOURNAL}{self.run:08d}-{shard}{self._seq:08d}.jsonl"
        self.puts += 1
        if not self.loc.put_new(name, data):
            raise StoreError(errno.EEXIST, f"{self.loc.url}/{name} exists: another run is writing here")

    def compact(self) -> None:
        """Replace every journal object with one (`<run>-compact.jsonl`, created only if absent), then
        delete the rest; later lines go to the next run number's segments. A rerun then reads one object.
        Only while the prefix is held alone."""
        self.sync()
        with self._commit_lock:
            names = journal_objects(self.loc.list(JOURNAL))
            if len(names) <= 1 and (not names or names[0].endswith("-compact.jsonl")):
                return
            blobs = [b or b"" for b in self.loc.get_many(names)]
            data = b"".join(b if not b or b.endswith(b"\n") else b + b"\n" for b in blobs)
            self.fence()
            # Named by the highest run it holds: a sharded run's shards numbered their segments at their
            # own start, after this run took its number; segments a crash left behind are then ignored.
            self.run = max(self.run, *map(_run_of, names))
            target = f"{JOURNAL}{self.run:08d}-compact.jsonl"
            if not self.loc.put_new(target, data):
                raise StoreError(errno.EEXIST, f"{self.loc.url}/{target} exists: another run is writing here")
            self.loc.delete_many(names)
            self.run += 1
            self._seq = 0


# -- the lease --


class Lease:
    """The prefix held by one run: an object holding its owner and expiry, created only if absent,
    renewed every `RENEW_SECONDS` by compare-and-swap on its ETag. Another run may take it over (by
    compare-and-swap too, so only one does) once it has expired. `clock` is wall time (expiries are
    compared across machines); tests inject one."""

    def __init__(
        self,
        loc: ObjectLocation,
        what: str,
        *,
        name: str = LEASE_NAME,
        clock: Callable[[], float] | None = None,
        on_lost: Callable[[OSError], None] | None = None,
        shards: int | None = None,
    ) -> None:
        self.loc, self.what, self.name = loc, what, name
        self.shards = shards
        """A sharded run's parent: its number of shards, which may write under this lease (`ParentLease`)."""
        self.clock = clock or time.time
        self.on_lost = on_lost
        self.owner = uuid.uuid4().hex
        self.expires_at = 0.0
        self.lost: OSError | None = None
        self._etag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self, expires_at: float) -> bytes:
        holder = f"{socket.gethostname()} pid {os.getpid()}"
        body = {"owner": self.owner, "holder": holder, "expires_at": expires_at}
        return json.dumps(body | ({"shards": self.shards} if self.shards else {})).encode()

    def acquire(self) -> None:
        """Take the lease, or raise `OutputLockedError` naming the holder while its lease is live."""
        expires = self.clock() + LEASE_SECONDS
        etag = self.loc.create(self.name, self._body(expires))
        if etag is None:
            got = self.loc.get_tagged(self.name)
            if got is None:  # released and removed meanwhile: try once more
                etag = self.loc.create(self.name, self._body(expires))
            else:
                other = _parse(got[0])
                if float(other.get("expires_at", 0)) > self.clock():
                    holder = other.get("holder", "another machine")
                    raise OutputLockedError(f"{self.what} ({holder}) is using {self.loc.url}")
                etag = self.loc.replace(self.name, self._body(expires), got[1])
            if etag is None:
                raise OutputLockedError(f"{self.what} took {self.loc.url} at the same moment")
        self._etag, self.expires_at = etag, expires

    def renew(self) -> None:
        """Push the expiry on; `OutputLockedError` if another run has taken the lease over."""
        assert self._etag is not None
        expires = self.clock() + LEASE_SECONDS
        body = self._body(expires)
        etag = self.loc.replace(self.name, body, self._etag)
        if etag is None:
            got = self.loc.get_tagged(self.name)
            if got is None or got[0] != body:  # not a retried swap of our own that had landed
                raise OutputLockedError(f"the lease on {self.loc.url} was taken over by another run")
            etag = got[1]
        self._etag, self.expires_at = etag, expires

    def check(self) -> None:
        """Raise (an OSError) unless this run may still write: the lease held, short of its safety margin."""
        if self.lost is not None:
            raise self.lost
        if self.clock() >= self.expires_at - SAFETY_SECONDS:
            raise StoreError(errno.ETIMEDOUT, f"the lease on {self.loc.url} could not be renewed in time")

    def _renewing(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            try:
                self.renew()
            except OSError:
                continue  # the store failed (after its retries): try again at the next tick
            except OutputLockedError as exc:
                self.lost = StoreError(errno.EBUSY, str(exc))
                if self.on_lost is not None:
                    self.on_lost(self.lost)
                return

    def start(self) -> None:
        self._thread = threading.Thread(target=self._renewing, name="imagebatch-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and mark the lease expired (by compare-and-swap: never another run's lease). The
        object stays: removing it could remove a lease another run took in between."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._etag is not None and self.lost is None:
            with contextlib.suppress(OSError):
                self.loc.replace(self.name, self._body(0.0), self._etag)
        self._etag = None


def live_lease(
    loc: ObjectLocation, name: str, clock: Callable[[], float] | None = None
) -> dict[str, Any] | None:
    """The body of the lease `name` while it is live (not expired, not released), else None."""
    got = loc.get(name)
    body = _parse(got) if got is not None else {}
    return body if float(body.get("expires_at", 0)) > (clock or time.time)() else None


class ParentLease:
    """A shard's view of its sharded run's parent's lease on the prefix (the folder's lock, held shared).

    A shard starts only under a live lease marked with its number of shards, and writes (its fence,
    `check`) only while that same lease is live, short of `SAFETY_SECONDS`: the lease is read again
    when less than a renewal period is left of the expiry last seen (one GET about every 20 s of
    writing). A parent that died stops renewing, so its shards stop writing before its lease expires
    and another run may take the prefix over (a run that is not sharded is refused until then)."""

    def __init__(self, loc: ObjectLocation, shard: str, clock: Callable[[], float] | None = None) -> None:
        self.loc, self.shard = loc, shard
        self.clock = clock or time.time
        body = live_lease(loc, LEASE_NAME, self.clock)
        shards = int(shard.rpartition("-of-")[2])
        if body is None:
            raise OutputLockedError(
                f"shard {shard} writes into {loc.url} only while its sharded run holds it, and no run does"
            )
        if body.get("shards") != shards:
            holder = body.get("holder", "another machine")
            what = "a run that is not sharded" if not body.get("shards") else "another sharded run"
            raise OutputLockedError(f"{what} ({holder}) is using {loc.url}")
        self.owner, self.expires_at = body.get("owner"), float(body["expires_at"])

    def check(self) -> None:
        """Raise (an OSError) unless the parent's lease is still live, short of the safety margin."""
        if self.clock() >= self.expires_at - SAFETY_SECONDS - RENEW_SECONDS:
            body = _parse(self.loc.get(LEASE_NAME) or b"")
            self.expires_at = float(body.get("expires_at", 0)) if body.get("owner") == self.owner else 0.0
        if self.clock() >= self.expires_at - SAFETY_SECONDS:
            why = f"shard {self.shard}: its sharded run no longer holds {self.loc.url} (its parent died?)"
            raise StoreError(errno.EBUSY, why)


def lease_holder(loc: ObjectLocation, clock: Callable[[], float] | None = None) -> str | None:
    """Who holds the prefix's lease now (its holder as the lease names it), or None when nobody does:
    read only, the lease is never taken (`validate --out` asks while a run may be sending)."""
    body = live_lease(loc, LEASE_NAME, clock)
    return None if body is None else f"another imagebatch run ({body.get('holder', 'another machine')})"


def _parse(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}
