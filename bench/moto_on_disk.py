"""`python bench/moto_on_disk.py -H 127.0.0.1 -p PORT`: moto's server with every object's bytes on disk.

Not a test. moto keeps an object's bytes in a `tempfile.SpooledTemporaryFile`, in memory up to 5 MiB and
then in an open temporary file: a run of 500,000 images would hold about 40 GiB in the server's memory,
or half a million open descriptors (the limit here is 20,000). This launcher gives moto's S3 models a
buffer that keeps its bytes in a named file under `MOTO_ON_DISK_DIR` (a fresh temporary folder by
default) and opens it only for the one read or write at hand, then starts moto's own server. Everything
else is moto's (its request handling, conditional writes, multipart uploads).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any


class DiskBuffer:
    """The part of `SpooledTemporaryFile` that moto's FakeKey and FakeMultipart use, kept in a file."""

    root: Path

    def __init__(self, *_: Any, **__: Any) -> None:
        self.path = self.root / uuid.uuid4().hex
        self.path.touch()
        self.pos = 0
        self.closed = False

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.path.stat().st_size + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        with self.path.open("rb") as fh:
            fh.seek(self.pos)
            got = fh.read(n)
        self.pos += len(got)
        return got

    def write(self, data: bytes) -> int:
        with self.path.open("r+b") as fh:
            fh.seek(self.pos)
            fh.write(data)
        self.pos += len(data)
        return len(data)

    def truncate(self, size: int | None = None) -> int:
        end = self.pos if size is None else size
        with self.path.open("r+b") as fh:
            fh.truncate(end)
        return end

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.path.unlink(missing_ok=True)


def main() -> None:
    root = Path(os.environ.get("MOTO_ON_DISK_DIR") or tempfile.mkdtemp(prefix="moto-on-disk-"))
    DiskBuffer.root = root
    import moto.s3.models as models
    from moto.server import main as serve

    models.tempfile = type("tempfile", (), {"SpooledTemporaryFile": DiskBuffer})  # type: ignore[assignment]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that the files go with the server
    try:
        serve(sys.argv[1:])
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
