"""The folder lock as an object, for an object store: a lease (`.imagebatch.lease`), taken create-only and
renewed by compare-and-swap on its ETag; it expires `LEASE_SECONDS` after its last renewal, and only then
may another run take the prefix over. A sharded run's parent holds it (marked with its number of shards)
from its start to its end; each shard holds a lease of its own and writes only while its parent's lease
is live (`ParentLease`), so no run can take the prefix over while a shard writes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from imagebatch.storage import layout
from imagebatch.storage.location import OutputLockedError
from imagebatch.storage.objectstore import ObjectLocation, StoreError

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
        name: str = layout.LEASE,
        clock: Callable[[], float] | None = None,
        on_lost: Callable[[OSError], None] | None = None,
        shards: int | None = None,
    ) -> None:
        self.loc, self.what, self.name = loc, what, name
        self.shards = shards
        """A sharded run's parent: its number of shards, which may write under this lease (`ParentLease`)."""
        self.shut = False
        """A sharded run's parent merging its shards' records: no shard may start any more (`shut_out`)."""
        self.clock = clock or time.time
        self.on_lost = on_lost
        self.owner = uuid.uuid4().hex
        self.expires_at = 0.0
        self.lost: OSError | None = None
        self._etag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._swapping = threading.Lock()
        """One compare-and-swap of the lease at a time (the renewing thread's, `shut_out`'s)."""

    def _body(self, expires_at: float) -> bytes:
        holder = f"{socket.gethostname()} pid {os.getpid()}"
        body = {"owner": self.owner, "holder": holder, "expires_at": expires_at}
        body |= {"shards": self.shards} if self.shards else {}
        return json.dumps(body | ({"shut": True} if self.shut else {})).encode()

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

    def shut_out(self) -> None:
        """A sharded run's parent lets no more shards start under this lease (`ParentLease` refuses them):
        the lease written again at once, marked so. A store that fails the write (after its retries) leaves
        the mark to the next renewal, within `RENEW_SECONDS`: the records are written all the same."""
        with self._swapping:
            self.shut = True
        with contextlib.suppress(OSError):
            self.renew()

    def renew(self) -> None:
        """Push the expiry on; `OutputLockedError` if another run has taken the lease over."""
        with self._swapping:
            self._renew()

    def _renew(self) -> None:
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
        body = live_lease(loc, layout.LEASE, self.clock)
        shards = int(shard.rpartition("-of-")[2])
        if body is None:
            raise OutputLockedError(
                f"shard {shard} writes into {loc.url} only while its sharded run holds it, and no run does"
            )
        if body.get("shards") != shards:
            holder = body.get("holder", "another machine")
            what = "a run that is not sharded" if not body.get("shards") else "another sharded run"
            raise OutputLockedError(f"{what} ({holder}) is using {loc.url}")
        if body.get("shut"):
            raise OutputLockedError(
                f"shard {shard} started after its sharded run ({body.get('holder', 'another machine')}) "
                f"began to write its records into {loc.url}: it sends nothing (the next run sends its part)"
            )
        self.owner, self.expires_at = body.get("owner"), float(body["expires_at"])

    def check(self) -> None:
        """Raise (an OSError) unless the parent's lease is still live, short of the safety margin."""
        if self.clock() >= self.expires_at - SAFETY_SECONDS - RENEW_SECONDS:
            body = _parse(self.loc.get(layout.LEASE) or b"")
            self.expires_at = float(body.get("expires_at", 0)) if body.get("owner") == self.owner else 0.0
        if self.clock() >= self.expires_at - SAFETY_SECONDS:
            why = f"shard {self.shard}: its sharded run no longer holds {self.loc.url} (its parent died?)"
            raise StoreError(errno.EBUSY, why)


def lease_holder(loc: ObjectLocation, clock: Callable[[], float] | None = None) -> str | None:
    """Who holds the prefix's lease now (its holder as the lease names it), or None when nobody does:
    read only, the lease is never taken (`validate --out` asks while a run may be sending)."""
    body = live_lease(loc, layout.LEASE, clock)
    return None if body is None else f"another imagebatch run ({body.get('holder', 'another machine')})"


def _parse(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}
