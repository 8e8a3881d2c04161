"""The two kinds of output location, chosen from what `--out` names: an object store for `s3://`, `gs://`,
`az://` (`storage.objectstore`), else a local folder (`storage.location`)."""

from __future__ import annotations

import os

from imagebatch.storage.location import LocalFolder, Location, is_object_url, local_path


def open_location(out: str | os.PathLike[str]) -> Location:
    """The `Location` `--out` names: an object store for `s3://`, `gs://`, `az://`, else a local folder."""
    if is_object_url(out):
        from imagebatch.storage.objectstore import ObjectLocation  # obstore, only for a bucket: start-up

        return ObjectLocation(str(out))
    return LocalFolder(local_path(out))
