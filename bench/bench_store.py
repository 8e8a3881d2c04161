"""Benchmark of an output location (issue 19): the same run into a local folder, into `s3://` on a local
S3-compatible server (moto's, as its own process), and the plain asyncio peer (`peer.py`), side by side.

Not a test. Starts the emulator (`--latency` s per generation) and `moto_server` on 127.0.0.1, runs
`imagebatch run MANIFEST --out X --concurrency C --no-report` as a child process for each location, then
its rerun (sends nothing), and prints: wall seconds, requests/s over the run's own span (run.json's
`started_at` to `ended_at`, so Prefect's start-up is left out), peak RSS of the run process, and for
`s3://` the store's requests by kind (from the server's request log) and PUTs per image.

    uv run python bench/bench_store.py [--rows 2000] [--latency 0.2] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

sys.path.insert(0, str(Path(__file__).parent))
from bench_flow import KEY, start_emulator, write_manifest

BUCKET = "imagebatch-bench"
SECRET = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_REGION": "us-east-1"}


def start_moto(log: Path, spill: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    """`moto_server` on a free port, its request log (one line per request) into `log`.

    `spill` starts it through `moto_on_disk.py`, which keeps every object's bytes in a file in a folder
    beside `log` rather than in the server's memory: a run of 500,000 images fits on disk.
    """
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = [str(Path(__file__).with_name("moto_on_disk.py"))] if spill else ["-m", "moto.server"]
    cmd = [sys.executable, *server, "-H", "127.0.0.1", "-p", str(port)]
    env = {**os.environ, "MOTO_ON_DISK_DIR": str(log.with_suffix(".objects"))}
    Path(env["MOTO_ON_DISK_DIR"]).mkdir(exist_ok=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(100):
        try:
            httpx.get(url + "/moto-api/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    s3_client(url).create_bucket(Bucket=BUCKET)
    return proc, url


def s3_client(url: str) -> Any:
    """A boto3 S3 client of the moto server at `url`."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench-secret",
    )


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS KiB, exit code) of a child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, rusage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t0, rusage.ru_maxrss, os.waitstatus_to_exitcode(status)


def span(run_json: bytes) -> float:
    info = json.loads(run_json)
    start, end = (datetime.fromisoformat(info[k]) for k in ("started_at", "ended_at"))
    return (end - start).total_seconds()


def store_requests(log: Path, since: int) -> Counter[str]:
    """The server's requests after line `since`, by kind (PUT images/, PUT journal/, GET, LIST, ...)."""
    kinds: Counter[str] = Counter()
    for line in log.read_text(errors="replace").splitlines()[since:]:
        m = re.search(r'"(GET|PUT|HEAD|DELETE|POST) /[^/ ?]+(?:/([^ ?]*))?(\?[^ ]*)? HTTP', line)
        if not m:
            continue
        method, key, query = m.group(1), m.group(2) or "", m.group(3) or ""
        if "list-type" in query:  # a listing: named by its prefix under the run's (journal/, ...)
            prefix = parse_qs(query[1:]).get("prefix", [""])[0]
            kinds[f"LIST {prefix.split('/', 1)[1] if '/' in prefix else '(all)'}"] += 1
            continue
        where = key.split("/", 2)[1] if key.count("/") >= 1 else key
        kinds[f"{method} {where}"] += 1
    return kinds


def log_length(log: Path) -> int:
    """Lines in the server's request log so far: where the next run's requests start."""
    return len(log.read_text(errors="replace").splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    emulator, service = start_emulator(args.latency)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "moto.log"
        moto, store = start_moto(log)
        try:
            manifest = Path(tmp) / "m.csv"
            write_manifest(manifest, args.rows)
            env = {
                **os.environ,
                "IMAGEBATCH_BASE_URL": service,
                "IMAGEBATCH_API_KEY": KEY,
                **SECRET,
                "AWS_ENDPOINT_URL": store,
                "AWS_ALLOW_HTTP": "true",
            }
            base = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--no-report"]
            base += ["--concurrency", str(args.concurrency)]
            print(
                f"{args.rows} requests, latency {args.latency} s, "
                f"--concurrency {args.concurrency}, --no-report"
            )
            print(
                "| location | wall s | requests/s (run span) | peak RSS MiB | rerun wall s (0 sent) | exit |"
            )
            print("|-|-|-|-|-|-|")
            for name, out in (
                ("local folder", str(Path(tmp) / "out")),
                ("s3:// (moto)", f"s3://{BUCKET}/bench"),
            ):
                one_location(name, out, base, env, args.rows, log, store)
            peer_row(manifest, Path(tmp) / "peer", service, args.concurrency, args.rows)
        finally:
            moto.terminate()
            emulator.terminate()


def one_location(
    name: str, out: str, base: list[str], env: dict[str, str], rows: int, log: Path, store: str
) -> None:
    """The run `base --out OUT`, then its rerun: a row of the table; for `s3://`, the store's requests."""
    cmd = [*base, "--out", out]
    mark = log_length(log)
    wall, rss, code = run(cmd, env)
    puts = store_requests(log, mark)
    on_s3 = out.startswith("s3://")
    if on_s3:
        run_json = s3_client(store).get_object(Bucket=BUCKET, Key="bench/run.json")["Body"].read()
    else:
        run_json = (Path(out) / "run.json").read_bytes()
    rate = rows / span(run_json)
    rerun_mark = log_length(log)
    rerun_wall, _, _ = run(cmd, env)
    cells = [name, f"{wall:.1f}", f"{rate:.1f}", f"{rss / 1024:.0f}", f"{rerun_wall:.1f}", code]
    print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    if on_s3:
        writes = sum(n for k, n in puts.items() if k.startswith("PUT"))
        print(f"  store requests of the run: {dict(puts)}; PUTs per image {writes / rows:.2f}")
        print(f"  store requests of the rerun: {dict(store_requests(log, rerun_mark))}")


def peer_row(manifest: Path, out: Path, service: str, concurrency: int, rows: int) -> None:
    """The plain asyncio peer on the same manifest: the table's last row (requests/s over its own loop)."""
    cmd = [
        sys.executable,
        str(Path(__file__).parent / "peer.py"),
        str(manifest),
        "--out",
        str(out),
        "--base-url",
        service,
        "--api-key",
        KEY,
        "--concurrency",
        str(concurrency),
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"| asyncio peer | {time.perf_counter() - t0:.1f} | "
        f"{rows / summary['loop_s']:.1f} | | | "
        f"{done.returncode} |"
    )


if __name__ == "__main__":
    main()
