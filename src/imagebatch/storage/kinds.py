"""The two kinds of output location, chosen once, from what `--out` names: an object store for `s3://`,
`gs://`, `az://` (`storage.bucket`), else a local folder (`storage.folder`). Nothing above storage/ asks
which kind it has: each difference is a method of `storage.backend.Backend`."""

from __future__ import annotations

import os
from collections.abc import Callable

from imagebatch.storage.backend import Backend
from imagebatch.storage.folder import FolderBackend
from imagebatch.storage.location import is_object_url, local_path


def open_location(
    out: str | os.PathLike[str], shard: str | None = None, *, clock: Callable[[], float] | None = None
) -> Backend:
    """The `Backend` `--out` names: an object store for `s3://`, `gs://`, `az://`, else a local folder.
    `shard`: `I-of-N` for one shard of a sharded run; `clock`: the wall clock a lease is timed by."""
    if is_object_url(out):
        from imagebatch.storage.bucket import BucketBackend  # obstore, only for a bucket: start-up

        return BucketBackend(str(out), shard, clock=clock)
    return FolderBackend(local_path(out), shard)
