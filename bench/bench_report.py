"""The contact sheet at catalog scale: build time of a 10,000-request report (cold: every thumbnail made;
warm: a rebuild, thumbnails kept) and how long its first page takes to load in headless Chromium.

    uv run python bench/bench_report.py [--requests 10000]
    /usr/bin/time -v uv run python bench/bench_report.py --rss DIR   # report.html's memory over DIR

With `--rss`, report.html is built once over the folder `bench_review.py --keep DIR` made (a catalog
manifest, run.json naming it, results.csv by the project's writer, a thumbnail per image already there:
a rebuild, as a review's `rebuild` or `imagebatch report` runs it), the prompts from the manifest planned
again; its pages, CPU seconds and peak RSS printed (quote `/usr/bin/time -v`'s "Maximum resident set
size"). The same script runs against another checkout (`cd BEFORE && uv run python .../bench_report.py
--rss DIR`).
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from PIL import Image

from imagebatch.report import build_report

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def make_folder(root: Path, n: int) -> None:
    """An output folder of `n` succeeded 1024x1024 requests (one real PNG, hard-linked n times)."""
    buf = io.BytesIO()
    Image.new("RGB", (1024, 1024), (200, 120, 40)).save(buf, "PNG")
    (root / "images").mkdir(parents=True)
    first = root / "images" / "base.png"
    first.write_bytes(buf.getvalue())
    header = "job_id,request_index,turn_index,status,paths,images,width,height,mime_type,model,route,"
    header += "idempotency_key,attempts,finish_reason,error,request_id\n"
    lines = []
    for i in range(n):
        rel = f"images/j{i:05d}-0.png"
        (root / rel).hardlink_to(first)
        lines.append(f"j{i:05d},0,0,succeeded,{rel},1,1024,1024,image/png,native-image-2.1,native,"
                     f"ib1-{i:032x},1,STOP,,req_{i}\n")  # fmt: skip
    (root / "results.csv").write_text(header + "".join(lines))


def build_once(out: Path) -> None:
    """report.html built over `out`; its pages, wall and CPU seconds and peak RSS printed."""
    import resource

    t0 = time.perf_counter()
    build_report(out)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    pages = len(list(out.glob("report*.html")))
    print(f"pages {pages}; build {wall:.1f} s; peak RSS {peak:.0f} MiB; CPU {time.process_time():.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rss", type=Path, help="build report.html once over this kept folder")
    args = parser.parse_args()
    if args.rss:
        return build_once(args.rss / "out")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "out"
        make_folder(root, args.requests)
        t0 = time.perf_counter()
        page = build_report(root)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        build_report(root)
        warm = time.perf_counter() - t0
        pages = len(list(root.glob("report*.html")))
        chromium = shutil.which("chromium")
        load = "n/a (no chromium)"
        if chromium:
            t0 = time.perf_counter()
            subprocess.run(
                [chromium, *FLAGS, f"--user-data-dir={tmp}/profile", "--dump-dom", page.as_uri()],
                capture_output=True, check=True, timeout=120,
            )  # fmt: skip
            load = f"{time.perf_counter() - t0:.2f} s"
        print(
            "| requests | pages | build, cold | build, warm | page 1 in headless Chromium (with its start) |"
        )
        print("|-|-|-|-|-|")
        print(f"| {args.requests:,} | {pages} | {cold:.1f} s | {warm:.1f} s | {load} |")


if __name__ == "__main__":
    main()
