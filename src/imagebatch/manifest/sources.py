"""A manifest and its reference images in an object store: `run`, `validate` and `deploy` take
`s3://bucket/key.csv` (and `gs://`, `az://`) wherever they take a manifest's path.

A URL stays text, never a `Path` (which would fold `s3://` into `s3:/`): a reference is resolved against
the manifest's prefix (`join`, `normalise`: never above the bucket) and must lie `inside` a files root, as
a path must lie inside a folder. Reads go through `storage.objectstore.ObjectLocation` (the store's own
credential chain and retries, no secret in a message), one location per bucket kept for the process
(`location`: one costs ~20 ms and keeps its connections), each read bounded (`read_object`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from imagebatch.gateway.constants import STORE_VARIABLE_PREFIXES
from imagebatch.storage.location import is_object_url

if TYPE_CHECKING:
    from imagebatch.storage.objectstore import ObjectLocation

MANIFEST_LIMIT = 1 << 30
"""The largest manifest object read (exclusive): a guard against naming a bucket's archive by mistake
(a million-row CSV is ~100 MB)."""


def is_url(ref: object) -> bool:
    """Whether `ref` is an object's URL (text starting `s3://`, `gs://` or `az://`)."""
    return isinstance(ref, str) and is_object_url(ref)


def split(url: str) -> tuple[str, str]:
    """`s3://bucket/a/b.png` as (`s3://bucket`, `a/b.png`); ValueError for what is not an object URL."""
    from imagebatch.storage.objectstore import split_url

    scheme, bucket, key = split_url(url)
    return f"{scheme}://{bucket}", key


def normalise(url: str) -> str:
    """`url` with its scheme in lower case and its key's `.`, `..` and empty segments resolved (a
    backslash read as a separator); ValueError for one that is not an object URL or climbs above its
    bucket."""
    bucket, key = split(url.replace("\\", "/"))
    parts: list[str] = []
    for segment in key.split("/"):
        if segment == "..":
            if not parts:
                raise ValueError(f"{url} climbs above the bucket's root")
            parts.pop()
        elif segment not in ("", "."):
            parts.append(segment)
    return "/".join([bucket, *parts])


def join(base: str, text: str) -> str:
    """The object a manifest in the prefix `base` names by `text`: a URL as itself, `/key` from the
    bucket's root, anything else under `base`. ValueError when it climbs above the bucket."""
    if is_object_url(text):
        return normalise(text)
    bucket, _ = split(base)
    text = text.replace("\\", "/")
    return normalise(f"{bucket}{text}" if text.startswith("/") else f"{base}/{text}")


def parent(url: str) -> str:
    """The prefix an object is in (`s3://bucket/a` for `s3://bucket/a/m.csv`): its manifest's 'folder'."""
    bucket, key = split(url)
    return "/".join([bucket, *key.split("/")[:-1]]) if key else bucket


def inside(url: str, root: str) -> bool:
    """Whether the normalised `url` is `root` or under it (a whole segment: `s3://b/ab` is not under
    `s3://b/a`)."""
    return url == root or url.startswith(root.rstrip("/") + "/")


_locations: dict[tuple[str, str], ObjectLocation] = {}
_lock = threading.Lock()


def location(bucket: str) -> ObjectLocation:
    """The `ObjectLocation` of `scheme://bucket`, made once per process and per value of the store's
    variables (a test, or a long-lived `serve`, may change them; only a digest of them is kept)."""
    from imagebatch.storage.objectstore import ObjectLocation, StoreError

    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(STORE_VARIABLE_PREFIXES))
    key = (bucket, hashlib.sha256(repr(env).encode()).hexdigest())
    with _lock:
        loc = _locations.get(key)
        if loc is None:
            try:
                loc = ObjectLocation(bucket)
            except Exception as exc:  # obstore refuses its configuration (an unknown region, a bad variable)
                # our own check (an endpoint that is no URL) says which variable; obstore's text may
                # repeat a value, so only its kind
                why = str(exc) if isinstance(exc, ValueError) else type(exc).__name__
                why = f"the store's configuration is refused ({why})"
                raise StoreError(errno.EINVAL, why) from None
            _locations[key] = loc
        return loc


def read_object(url: str, limit: int) -> tuple[bytes, int] | None:
    """The bytes of the object at the normalised `url` (none read when it is `limit` bytes or more) and
    its size; None if there is no such object. `StoreError` (an OSError naming the cause, never a
    secret) for a missing bucket, refused credentials, a store that cannot be reached or whose
    configuration (an unknown region, a bad variable) is refused."""
    bucket, key = split(url)
    return location(bucket).get_bounded(key, limit)


def read_stream(url: str) -> Iterator[bytes] | None:
    """The bytes of the object at the normalised `url` as chunks, never whole; None if there is no such
    object. `StoreError` as for `read_object` (a missing bucket among them)."""
    bucket, key = split(url)
    where = location(bucket)
    chunks = where.get_stream(key)
    if chunks is None:
        where.get_bounded(key, 0)  # no such object, or no such bucket: this one raises for a bucket
    return chunks
