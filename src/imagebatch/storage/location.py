"""The whole-object operations of an output location (`Location`: put, create-only put, get, list,
delete), with the local folder's (`LocalFolder`: rename, fsync); an object store's are
`storage.objectstore.ObjectLocation`'s (whole-object PUTs, create-only and compare-and-swap writes,
listing for order). `storage.kinds.open_location` picks the kind from `--out`.

Names are relative, `/`-separated (`images/job/0-abc.png`, `run.json`). The whole interface of an
output location, records and holds included, is `storage.backend.Backend`, built on these whole-object
operations: a new kind of store is one more class with its methods (and a scheme in
`storage.kinds.open_location`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import urlsplit

from imagebatch.gateway.constants import STORE_ENDPOINTS
from imagebatch.storage.bounded import is_record, read_record

OBJECT_SCHEMES = ("s3", "gs", "az")
"""The URL schemes `--out` takes for an object store (anything else is a local folder)."""


class OutputLockedError(RuntimeError):
    """The output location is held by another run."""


RUN = "another imagebatch run"
"""Who holds a location held alone, as a refusal names it."""


class OutsideRootError(PermissionError):
    """A write into a folder the user named (OUT, DEST) whose path leaves it through a symbolic link."""


def confined(root: Path, name: str | os.PathLike[str]) -> Path:
    """`root / name`, for writing: `OutsideRootError` (its message names the path) if the path, or any
    folder on its way, is a symbolic link that leads out of `root`, or if `name` climbs out with `..`.

    The one check of every write imagebatch makes into OUT or DEST (export's files, review.jsonl, the
    thumbnails and the report's pages), as reads already refuse to follow a link out: a folder of DEST
    linked to `/etc` must not receive a deliverable. A link that stays inside is
    followed. What is checked is the path as it is now; a writer that appends also opens with
    `O_NOFOLLOW`, so a link put in the file's place afterwards fails the open."""
    path = Path(root) / name
    try:
        inside = path.resolve().is_relative_to(Path(root).resolve())
    except (OSError, RuntimeError):  # a loop of links (RuntimeError before Python 3.13)
        inside = False
    if not inside:
        raise OutsideRootError(f"{path} leads out of {root} (a symbolic link on its way): not written")
    return path


def is_object_url(out: str | os.PathLike[str]) -> bool:
    """Whether `--out` names an object store (`s3://bucket/prefix`, `gs://...`, `az://...`)."""
    text = str(out) if isinstance(out, str) else ""
    return text.split("://", 1)[0].lower() in OBJECT_SCHEMES and "://" in text


def shown_url(url: str) -> str:
    """`url` as a message may show it: without a user name, password, query or fragment (where a
    credential would hide: `s3://KEY:SECRET@bucket`, a presigned URL's `?X-Amz-Signature=`).

    The one redaction of a location for every message and log line that names one: `--out`, a manifest's
    URL, export's OUT and `--to`, a reference cell. Anything that is not `scheme://...` is
    returned as it is (a local path holds no credential)."""
    scheme, sep, rest = str(url).partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        return str(url)
    rest = re.split(r"[?#]", rest, maxsplit=1)[0]
    authority, slash, path = rest.partition("/")
    authority = authority.rpartition("@")[2]
    return f"{scheme}://{authority}{slash}{path}"


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?:[^\s'\"<>`]*[^\s'\"<>`:,.;)])?")
"""A URL inside a message: up to a space or a quote, a trailing `:` `,` `.` `;` `)` left to the text."""


def redact_urls(text: str) -> str:
    """`text` with every URL in it as `shown_url` shows it: for a message built from parts that may
    name a location (a manifest's problem quoting its cell, an exception's text)."""
    return _URL_IN_TEXT.sub(lambda m: shown_url(m.group()), text)


def store_config_fault(scheme: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why the store's configuration in the environment cannot be used, or None: an endpoint that is not
    an http(s) URL of a server. Checked before obstore sees it: it panics on such a value at the first
    request (`PanicException`, a traceback). The value is not repeated (it may hold a
    secret a person pasted in the wrong variable)."""
    env = os.environ if environ is None else environ
    for name in STORE_ENDPOINTS.get(scheme, ()):
        value = env.get(name)
        if value is None:
            continue
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018  (a port that is not a number raises here)
        except ValueError:
            return f"{name} is not a URL"
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            return f"{name} must be the http:// or https:// URL of the store's server (it is not)"
        if any(c.isspace() or not c.isprintable() for c in value) or parts.username or parts.password:
            return f"{name} must be a plain http(s) URL: no space, no user or password (credentials)"
    return None


MAX_OBJECT_KEY_BYTES = 1024
"""The longest object key S3 (and GCS) accept, in UTF-8 bytes."""
MAX_RUN_NAME_BYTES = 256
"""Room for the longest name a run writes under its prefix (`images/<a 128-character job id>/...png`,
a journal segment, a shard's lease), with some to spare."""


def check_store_config(scheme: str, prefix: str = "") -> None:
    """ValueError, saying why, if `store_config_fault` finds the environment's store configuration bad,
    or if `prefix` leaves too little of an object key for the names a run writes under it (S3 stored
    1,142-byte keys under a 1,100-character prefix from moto, and refuses them from AWS)."""
    if why := store_config_fault(scheme):
        raise ValueError(why)
    if (size := len(prefix.encode())) > MAX_OBJECT_KEY_BYTES - MAX_RUN_NAME_BYTES - 1:
        most = MAX_OBJECT_KEY_BYTES - MAX_RUN_NAME_BYTES - 1
        raise ValueError(
            f"the prefix is {size:,} bytes long; at most {most:,} (an object's key is at most "
            f"{MAX_OBJECT_KEY_BYTES:,} bytes, and a run's names under it take up to {MAX_RUN_NAME_BYTES})"
        )


def local_path(out: str | os.PathLike[str]) -> Path:
    """A local `--out` as a path (`file://` accepted, as a plain path)."""
    return Path(os.fspath(out).removeprefix("file://"))


class Location(Protocol):
    """Named bytes in one place: the whole-object operations the output store is built on."""

    url: str
    """How messages name the place (a folder's path, or `s3://bucket/prefix`): never a credential."""

    def put_new(self, name: str, data: bytes) -> bool:
        """Write `name` only if it does not exist yet (create-only); False if it did."""

    def put(self, name: str, data: bytes) -> None:
        """Write `name` whole: a reader sees the old object or the new one, never a part."""

    def get(self, name: str) -> bytes | None:
        """The bytes of `name`, or None if there is no such object."""

    def exists(self, name: str) -> bool: ...

    def list(self, prefix: str) -> list[str]:
        """The names under `prefix` (a folder-like prefix ending in `/`), sorted."""

    def delete(self, name: str) -> None:
        """Remove `name` (no error if it is already gone)."""


@contextlib.contextmanager
def atomic_file(path: Path, *, sync: bool = True) -> Iterator[BinaryIO]:
    """A file to write that replaces `path` whole when the block ends (synced, unless `sync` is False: a
    file a crash may lose), or never if it raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; outputs are ordinary files others may read
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Write `data` to `path` so that a reader sees either the old file or the whole new one."""
    with atomic_file(path, sync=sync) as fh:
        fh.write(data)


class LocalFolder:
    """A local folder as a `Location`: a whole write is a synced temporary file renamed into place."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def put_new(self, name: str, data: bytes) -> bool:
        path = confined(self.root, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return True

    def put(self, name: str, data: bytes) -> None:
        write_atomic(confined(self.root, name), data)

    def get(self, name: str) -> bytes | None:
        """Through `storage.bounded`: a FIFO or a device in a file's place is refused, a file over
        `MAX_RECORD_BYTES` too (`RecordError`)."""
        return read_record(self.root / name)

    def exists(self, name: str) -> bool:
        """Whether `name` is a file; a FIFO or a device in its place is refused (`RecordError`), not
        taken for a missing file."""
        return is_record(self.root / name)

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())

    def delete(self, name: str) -> None:
        confined(self.root, name).unlink(missing_ok=True)


def json_object(raw: bytes) -> dict[str, Any] | None:
    """One line of a journal (a file's or a segment's): its JSON object, or None for a line that does not
    parse (torn by a crash) or is not an object; readers skip those."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
