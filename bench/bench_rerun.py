"""Benchmark of a rerun that sends nothing (issue 19): a local folder against `s3://` on a local
S3-compatible server (`moto_server`, its own process), at 1,000 and 10,000 finished rows.

Not a test. For each row count: a manifest of that many native rows is run once into a local folder and
once into `s3://` (the emulator with no latency, `--no-report`: only the finished record matters), then
rerun `--repeat` times into each (nothing to send). Prints the reruns' wall seconds and, for `s3://`, the
store's requests during each rerun by kind (from the server's request log): what a rerun reads, and that it
lists and reads no image however many there are.

    uv run python bench/bench_rerun.py [--rows 1000 10000] [--repeat 3] [--concurrency 64]

`--synthesize --src OTHER/src` instead writes each finished output (a folder, and `s3://` as one compacted
journal object) straight from the manifest's plan, the lines as a run journals them (`synthesized`: no
first run, which takes most of an hour at 50,000 on a loaded machine), settles it once with each code,
then reruns it `--repeat` times with this checkout's code and OTHER's in turn, each on its own copy, and
prints each rerun's user + sys CPU seconds and peak RSS (`os.wait4`) with its wall:

    uv run python bench/bench_rerun.py --synthesize --src /tmp/before/src --rows 10000 50000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_flow import KEY, start_emulator, write_manifest
from bench_store import BUCKET, SECRET, run, s3_client, start_moto, store_requests


def reruns(
    cmd: list[str], env: dict[str, str], log: Path, repeat: int
) -> list[tuple[float, int, Counter[str]]]:
    """(wall seconds, exit code, the store's requests by kind) of `repeat` reruns."""
    done = []
    for _ in range(repeat):
        mark = len(log.read_text(errors="replace").splitlines())
        wall, _, code = run(cmd, env)
        done.append((wall, code, store_requests(log, mark)))
    return done


def synthesized(manifest: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Each planned request of `manifest` as a finished success: its image's name and its journal lines
    (started, finished, answered, outcome; then its usage line, `"event": "usage"` as a bucket keeps it),
    the fields as `work.store` writes them."""
    from imagebatch.manifest import load_manifest, plan
    from imagebatch.work.request_record import file_stem

    for req in plan(load_manifest(manifest).jobs):
        key, request_id = req.idempotency_key, "req_" + req.idempotency_key[4:36]
        ids = {"idempotency_key": key, "job_id": req.job_id, "request_index": req.request_index,
               "turn_index": req.turn_index, "variant": 1, "route": req.route, "model": req.model,
               "attempt": 1, "started_at": "2026-11-29T09:07:39.636855+00:00"}  # fmt: skip
        finished = {"duration_s": 1.3751, "outcome": "ok", "error_code": None, "request_id": request_id,
                    "images": 1, "retry_in": None}  # fmt: skip
        path = f"images/{file_stem(req, False)}.png"
        record = {"job_id": req.job_id, "request_index": req.request_index, "turn_index": 0,
                  "status": "succeeded", "model": req.model, "route": req.route, "idempotency_key": key,
                  "paths": [path], "images": 1, "width": 1024, "height": 1024, "mime_type": "image/png",
                  "attempts": 1, "finish_reason": "STOP", "error": None, "request_id": request_id,
                  "http_status": None, "variant": 1}  # fmt: skip
        usage = {
            **ids,
            **finished,
            "http_status": 200,
            "usage": {"promptTokenCount": 9, "candidatesTokenCount": 1128},
        }
        started, ended = {"event": "attempt_started", **ids}, {"event": "attempt_finished", **ids, **finished}
        answered, outcome = {"event": "answered", **record}, {"event": "outcome", **record}
        yield path, [started, ended, answered, outcome, {"event": "usage", **usage}]


LINKS_PER_COPY = 60_000


def synthesize(manifest: Path, out: Path, png: Path) -> None:
    """A finished folder of `manifest` in `out` (journal.jsonl, usage.jsonl, and each image a hard link to
    `png`: the rerun only looks it up)."""
    (out / "images").mkdir(parents=True)
    source = png
    with (out / "journal.jsonl").open("w") as journal, (out / "usage.jsonl").open("w") as usage:
        for n, (path, lines) in enumerate(synthesized(manifest)):
            if n % LINKS_PER_COPY == 0:  # a file has at most 65,000 links (ext4): a fresh copy now and then
                png = Path(shutil.copy(source, out / "images" / f".one-{n // LINKS_PER_COPY}.png"))
            for line in lines:
                if line["event"] == "usage":
                    del line["event"]
                    usage.write(json.dumps(line, separators=(",", ":")) + "\n")
                else:
                    journal.write(json.dumps(line, separators=(",", ":")) + "\n")
            (out / path).parent.mkdir(exist_ok=True)
            os.link(png, out / path)


def synthesize_bucket(manifest: Path, store: str, prefix: str) -> None:
    """A finished `s3://BUCKET/prefix`: its journal as one compacted object (as a run's end leaves it); its
    images are not made (a bucket's rerun trusts a settled outcome and reads none: the request counts)."""
    with tempfile.TemporaryFile() as fh:
        for _, lines in synthesized(manifest):
            fh.writelines(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)
        fh.seek(0)
        s3_client(store).upload_fileobj(fh, BUCKET, f"{prefix}/journal/00000001-compact.jsonl")


def measured(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float, int]:
    """(wall s, user + sys CPU s, peak RSS MiB, exit code) of a child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def alternated(args: argparse.Namespace, tmp: Path, store: str, env: dict[str, str]) -> None:
    """The `--synthesize` table: each count, each location, this code and `--src`'s in turn."""
    from bench_flow import write_manifest

    codes = {"after": env, "before": {**env, "PYTHONPATH": args.src}}
    png = tmp / "one.png"
    from PIL import Image

    Image.new("RGB", (64, 64), (200, 30, 30)).save(png)
    print("| finished rows | location | code | rerun | wall s | CPU s | peak RSS MiB | exit |")
    print("|-|-|-|-|-|-|-|-|")
    for rows in args.rows:
        manifest = tmp / f"m{rows}.csv"
        write_manifest(manifest, rows)
        outs: dict[tuple[str, str], str] = {}
        for code in codes:
            folder = tmp / f"{code}{rows}"
            synthesize(manifest, folder, png)
            synthesize_bucket(manifest, store, f"{code}{rows}")
            outs[("local folder", code)] = str(folder)
            outs[("s3://", code)] = f"s3://{BUCKET}/{code}{rows}"
        for place in ("local folder", "s3://"):
            for i in range(args.repeat + 1):  # the first: the settle after the run (results.csv written)
                for code, code_env in codes.items():
                    base = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--no-report"]
                    wall, cpu, rss, exit_code = measured([*base, "--out", outs[(place, code)]], code_env)
                    what = "first settle" if i == 0 else f"rerun {i}"
                    cells = [
                        f"{rows:,}",
                        place,
                        code,
                        what,
                        f"{wall:.1f}",
                        f"{cpu:.2f}",
                        f"{rss:.0f}",
                        exit_code,
                    ]
                    print("| " + " | ".join(map(str, cells)) + " |", flush=True)
        print(f"  load: {os.getloadavg()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--synthesize", action="store_true", help="write each finished output, no first run")
    parser.add_argument("--src", help="with --synthesize: the other code's src/ folder (the code before)")
    args = parser.parse_args()
    if args.synthesize:
        emulator, service = start_emulator(0.0)
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
            moto, store = start_moto(Path(tmp) / "moto.log", spill=True)
            env = {**os.environ, "IMAGEBATCH_BASE_URL": service, "IMAGEBATCH_API_KEY": KEY, **SECRET}
            env |= {"AWS_ENDPOINT_URL": store, "AWS_ALLOW_HTTP": "true"}
            try:
                alternated(args, Path(tmp), store, env)
            finally:
                moto.terminate()
                emulator.terminate()
        return
    emulator, service = start_emulator(0.0)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "moto.log"
        moto, store = start_moto(log)
        env = {**os.environ, "IMAGEBATCH_BASE_URL": service, "IMAGEBATCH_API_KEY": KEY, **SECRET}
        env |= {"AWS_ENDPOINT_URL": store, "AWS_ALLOW_HTTP": "true"}
        print("| finished rows | location | first run wall s | rerun wall s (median; all) | rerun exit |")
        print("|-|-|-|-|-|")
        try:
            for rows in args.rows:
                manifest = Path(tmp) / f"m{rows}.csv"
                write_manifest(manifest, rows)
                base = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--no-report"]
                base += ["--concurrency", str(args.concurrency)]
                places = (
                    ("local folder", str(Path(tmp) / f"out{rows}")),
                    ("s3://", f"s3://{BUCKET}/r{rows}"),
                )
                for name, out in places:
                    first, _, code = run([*base, "--out", out], env)
                    assert code == 0, f"the first run into {out} exited {code}"
                    done = reruns([*base, "--out", out], env, log, args.repeat)
                    walls = [wall for wall, _, _ in done]
                    every = ", ".join(f"{w:.2f}" for w in walls)
                    median = f"{statistics.median(walls):.2f} ({every})"
                    cells = [f"{rows:,}", name, f"{first:.1f}", median, [c for _, c, _ in done]]
                    print("| " + " | ".join(map(str, cells)) + " |", flush=True)
                    for i, (_, _, kinds) in enumerate(done if out.startswith("s3://") else [], 1):
                        listed = dict(sorted(kinds.items()))
                        print(f"  rerun {i}: {sum(kinds.values())} store requests: {listed}", flush=True)
        finally:
            moto.terminate()
            emulator.terminate()


if __name__ == "__main__":
    main()
