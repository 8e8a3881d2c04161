"""`imagebatch export` to JPEG: images per second on one thread, and on every core with a process pool
and with a thread pool (issue 24's benchmark).

    uv run python bench/bench_export.py                      # 10,000 1024 px PNGs -> JPEG q90
    uv run python bench/bench_export.py --images 2000 --modes inline process thread

It makes, in a temporary folder, an output folder as a run leaves it: `--images` source images under
images/<job>/ and a results.csv written by the run's own writer (`OutputStore.write_results`, with a
`sku` metadata column). The sources are `--distinct` different photo-like 1024 x 1024 PNGs (a gradient
under a tint and camera-like noise: about 1.2 MB each, which decodes like a photograph, where the
emulator's flat placeholders would decode several times faster), hard-linked under every name: what is
measured is decoding, converting and writing, not the disk. Then, for each mode, a fresh DEST and
`imagebatch.delivery.export.export(..., ExportOptions(name="{sku}.{ext}", format="jpeg"))` timed from start to
export.csv; then a second export into the last mode's DEST (everything unchanged). "inline" is one
thread (`workers=1`: converted in the calling thread, no pool); "process" a spawned process pool and
"thread" a thread pool of `--workers`. CPU ms/image counts every thread and worker process: on a
shared machine (other jobs running) it says what an image costs when the wall clock cannot; "cores busy"
(CPU seconds over wall seconds) how much of the machine the export got.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from PIL import Image

from imagebatch.delivery.export import default_workers, export
from imagebatch.delivery.options import ExportOptions
from imagebatch.work.store import OutputStore


def photo(seed: int, side: int) -> bytes:
    """A photo-like PNG: smooth tones and noise (what a generated product shot decodes like)."""
    base = Image.linear_gradient("L").resize((side, side)).convert("RGB")
    tint = Image.new("RGB", (side, side), ((seed * 37) % 256, (seed * 91) % 256, (seed * 53) % 256))
    noise = Image.effect_noise((side, side), 12).convert("RGB")
    buf = io.BytesIO()
    Image.blend(Image.blend(base, tint, 0.5), noise, 0.15).save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def make_out(root: Path, images: int, distinct: int, side: int) -> Path:
    out = root / "out"
    originals = []
    for seed in range(distinct):
        path = root / f"source-{seed}.png"
        path.write_bytes(photo(seed, side))
        originals.append(path)
    rows = []
    for i in range(images):
        key = "ib1-" + hashlib.sha256(str(i).encode()).hexdigest()[:32]
        rel = f"images/p{i:05d}/0-{key[4:16]}.png"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(originals[i % distinct], out / rel)
        rows.append(
            {
                "job_id": f"p{i:05d}",
                "request_index": 0,
                "turn_index": 0,
                "status": "succeeded",
                "paths": rel,
                "images": 1,
                "width": side,
                "height": side,
                "mime_type": "image/png",
                "idempotency_key": key,
                "sku": f"SKU-{i:05d}",
            }
        )
    OutputStore(out).write_results(rows, ["sku"])
    return out


def cpu_seconds() -> float:
    """CPU time of this process and of its waited-for children (a process pool's workers, once shut)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def timed(out: Path, dest: Path, workers: int, pool: str, quality: int) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (every thread and worker process) and the summary of one export."""
    cpu = cpu_seconds()
    started = time.perf_counter()
    summary = export(
        str(out),
        str(dest),
        ExportOptions(name="{sku}.{ext}", format="jpeg", quality=quality, workers=workers),
        pool=pool,  # type: ignore[arg-type]
    )
    return time.perf_counter() - started, cpu_seconds() - cpu, summary.line()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--distinct", type=int, default=32)
    parser.add_argument("--side", type=int, default=1024)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--modes", nargs="+", default=["inline", "process", "thread"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        out = make_out(root, args.images, args.distinct, args.side)
        print(f"made {args.images} sources in {time.perf_counter() - started:.1f} s; {args.workers} workers")
        print(f"load average before: {os.getloadavg()[0]:.1f}")
        print("| mode | workers | images | wall s | images/s | CPU ms/image | cores busy | load after |")
        print("|-|-|-|-|-|-|-|-|")
        dest = root / "dest"
        workers, pool = 1, "thread"
        for mode in [*args.modes, "again"]:
            if mode != "again":
                dest = root / f"dest-{mode}"
                workers, pool = (1, "thread") if mode == "inline" else (args.workers, mode)
            wall, cpu, line = timed(out, dest, workers, pool, args.quality)
            label = f"again, {args.modes[-1]} (all unchanged)" if mode == "again" else mode
            print(
                f"| {label} | {workers} | {args.images:,} | {wall:.1f} | {args.images / wall:.1f} | "
                f"{1000 * cpu / args.images:.0f} | {cpu / wall:.2f} | {os.getloadavg()[0]:.1f} |"
            )
            print(f"<!-- {line} -->", flush=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
