"""obstore against fsspec/s3fs on the write pattern of an output location in a bucket (issue 19): the
choice of obstore, shown with figures.

Not a test. Starts `moto_server` on 127.0.0.1 (its own process, as in `bench_store.py`) and runs, with each
library in turn, on a fresh prefix:

1. create-only small objects: `--segments` journal segments of ~600 bytes, one after another (a run's
   group commits are serial), each `If-None-Match: *`; then as many creates of names that exist, which
   must all be refused (the library must say "exists", not overwrite);
2. image-size PUTs: `--images` objects of `--image-kb` KiB from `--threads` threads at once (a run's
   request threads);
3. listing: the segments' prefix listed `--lists` times;
4. compare-and-swap: `--swaps` lease renewals, each `If-Match` on the previous ETag, then one with a stale
   ETag, which must be refused.

For each: wall seconds, the client's CPU seconds (this process: what a run pays on its own cores; the
server's are its own process's), and operations per second. s3fs is in the `bench` dependency group:

    uv run --group bench python bench/bench_store_libs.py [--segments 1000] [--images 400] [--image-kb 1024]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_store import BUCKET, SECRET, start_moto

REGION = SECRET["AWS_REGION"]


class Obstore:
    name = "obstore"

    def __init__(self, endpoint: str, prefix: str) -> None:
        from obstore.store import S3Store

        self.store = S3Store(
            BUCKET,
            prefix=prefix,
            endpoint=endpoint,
            access_key_id=SECRET["AWS_ACCESS_KEY_ID"],
            secret_access_key=SECRET["AWS_SECRET_ACCESS_KEY"],
            region=REGION,
            client_options={"allow_http": True},
        )

    def create(self, name: str, data: bytes) -> bool:
        import obstore
        from obstore.exceptions import AlreadyExistsError

        try:
            obstore.put(self.store, name, data, mode="create")
            return True
        except AlreadyExistsError:
            return False

    def put(self, name: str, data: bytes) -> str:
        import obstore

        return str(obstore.put(self.store, name, data)["e_tag"])

    def swap(self, name: str, data: bytes, etag: str) -> str | None:
        import obstore
        from obstore.exceptions import PreconditionError

        try:
            return str(obstore.put(self.store, name, data, mode={"e_tag": etag})["e_tag"])
        except PreconditionError:
            return None

    def list(self, prefix: str) -> list[str]:
        import obstore

        return [str(m["path"]) for batch in obstore.list(self.store, prefix) for m in batch]


class S3fs:
    name = "s3fs"

    def __init__(self, endpoint: str, prefix: str) -> None:
        import s3fs

        self.fs = s3fs.S3FileSystem(
            key=SECRET["AWS_ACCESS_KEY_ID"],
            secret=SECRET["AWS_SECRET_ACCESS_KEY"],
            endpoint_url=endpoint,
            client_kwargs={"region_name": REGION},
            skip_instance_cache=True,
            use_listings_cache=False,
        )
        self.root = f"{BUCKET}/{prefix}"

    @staticmethod
    def refused(exc: OSError) -> bool:
        """Whether s3fs's error is S3's 412 (its message; the botocore error is only its context)."""
        return isinstance(exc, FileExistsError) or "pre-conditions you specified did not hold" in str(exc)

    def create(self, name: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(f"{self.root}/{name}", data, mode="create")
            return True
        except OSError as exc:
            if self.refused(exc):
                return False
            raise

    def put(self, name: str, data: bytes) -> str:
        return str(self.fs.pipe_file(f"{self.root}/{name}", data)["ETag"])

    def swap(self, name: str, data: bytes, etag: str) -> str | None:
        try:  # s3fs has no compare-and-swap of its own: put_object's IfMatch, passed through to botocore
            return str(self.fs.pipe_file(f"{self.root}/{name}", data, IfMatch=etag)["ETag"])
        except OSError as exc:
            if self.refused(exc):
                return None
            raise

    def list(self, prefix: str) -> list[str]:
        return list(self.fs.find(f"{self.root}/{prefix}"))


def timed(what: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, this process's CPU seconds, result) of `what()`."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = what()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def workload(lib: Any, args: argparse.Namespace) -> list[tuple[str, int, float, float]]:
    """(step, operations, wall s, CPU s) of each step; asserts each library does the step right."""
    segment = b"".join(b'{"event": "attempt", "key": "ib1-%032d", "attempt": 1}\n' % i for i in range(8))
    names = [f"journal/00000001-{i:08d}.jsonl" for i in range(args.segments)]
    rows = []
    wall, cpu, made = timed(lambda: [lib.create(n, segment) for n in names])
    assert all(made), f"{lib.name}: a create-only write of a new name was refused"
    rows.append(("create-only segment PUTs (serial)", len(names), wall, cpu))
    wall, cpu, made = timed(lambda: [lib.create(n, b"other") for n in names])
    assert not any(made), f"{lib.name}: a create-only write overwrote an existing object"
    rows.append(("create-only PUTs refused (exists)", len(names), wall, cpu))

    image = os.urandom(args.image_kb * 1024)
    with ThreadPoolExecutor(args.threads) as pool:

        def images() -> list[str]:
            return list(pool.map(lambda i: lib.put(f"images/job/{i}.png", image), range(args.images)))

        wall, cpu, _ = timed(images)
    rows.append((f"image PUTs of {args.image_kb} KiB ({args.threads} threads)", args.images, wall, cpu))

    wall, cpu, listed = timed(lambda: [lib.list("journal/") for _ in range(args.lists)])
    assert all(len(x) == len(names) for x in listed), f"{lib.name}: a listing missed segments"
    rows.append((f"listings of {len(names):,} segments", args.lists, wall, cpu))

    etag = lib.put(".imagebatch.lease", b'{"expires_at": 0}')

    def renew() -> str:
        tag = etag
        for i in range(args.swaps):
            tag = lib.swap(".imagebatch.lease", b'{"expires_at": %d}' % i, tag)
            assert tag is not None, f"{lib.name}: a swap on the current ETag was refused"
        return tag

    wall, cpu, _ = timed(renew)
    assert lib.swap(".imagebatch.lease", b"late", etag) is None, f"{lib.name}: a stale ETag was accepted"
    rows.append(("compare-and-swap PUTs (If-Match)", args.swaps, wall, cpu))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=1000)
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--image-kb", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--lists", type=int, default=20)
    parser.add_argument("--swaps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2, help="passes of both libraries, alternating")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        moto, endpoint = start_moto(Path(tmp) / "moto.log")
        try:
            print("| pass | library | step | operations | wall s | ops/s | client CPU ms per op |")
            print("|-|-|-|-|-|-|-|")
            for n in range(1, args.repeat + 1):
                for kind in (Obstore, S3fs):
                    lib = kind(endpoint, f"{kind.name}-{n}")
                    for step, ops, wall, cpu in workload(lib, args):
                        cells = [
                            n,
                            kind.name,
                            step,
                            ops,
                            f"{wall:.2f}",
                            f"{ops / wall:.0f}",
                            f"{cpu / ops * 1e3:.2f}",
                        ]
                        print("| " + " | ".join(map(str, cells)) + " |", flush=True)
        finally:
            moto.terminate()


if __name__ == "__main__":
    main()
