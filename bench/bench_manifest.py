"""Benchmark: load, validate and plan a generated 100,000-row CSV manifest (a script, not a test).

    uv run python bench/bench_manifest.py [--rows 100000] [--no-tracemalloc] [--format csv|xlsx|parquet]
    uv run python bench/bench_manifest.py --command [--repeat 3]   # `imagebatch validate`, as a user runs it

`--format xlsx` or `parquet` writes the same rows as a workbook or a Parquet file (with pandas, every cell
as text) and times reading that instead. Each phase is timed in wall and CPU seconds (CPU time varies less
on a machine shared with other jobs).

The manifest mixes routes like a real catalog job: native text-to-image rows with templated prompts,
native edits naming one of a few shared reference images, masked edits on the images route, and text
rows. Each phase is timed separately; then, unless --no-tracemalloc, the whole run is repeated under
tracemalloc to measure the peak of Python allocations (tracemalloc slows Python, so it is not timed).
"""

from __future__ import annotations

import argparse
import csv
import platform
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from imagebatch.manifest import load_manifest, plan, summarise

RATIOS = ("1:1", "4:5", "3:4", "2:3", "16:9", "9:16")
COLOURS = ("cobalt blue", "sage green", "sand", "brushed brass", "rust", "matte white")
PRODUCTS = ("ceramic mug", "canvas tote", "desk lamp", "wool throw", "stoneware vase")


def make_folder(root: Path, rows: int) -> Path:
    """Write a few shared images and a `rows`-row CSV manifest under `root`; return the manifest."""
    images = root / "images"
    images.mkdir()
    for i in range(4):
        Image.new("RGB", (256, 256), (60 * i, 90, 200 - 40 * i)).save(images / f"ref-{i}.png")
    Image.new("RGBA", (256, 256), (0, 0, 0, 0)).save(images / "mask.png")
    path = root / "manifest.csv"
    header = ["id", "sku", "product_name", "colour", "route", "model", "aspect_ratio", "image_size", "size"]
    header += ["reference_images", "mask", "count", "max_tokens", "prompt"]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for i in range(rows):
            product, colour = PRODUCTS[i % len(PRODUCTS)], COLOURS[i % len(COLOURS)]
            row = dict.fromkeys(header, "")
            row.update(id=f"sku-{i:06d}", sku=f"SKU{i:06d}", product_name=product, colour=colour)
            row["prompt"] = "Studio photo of a {product_name} in {colour} on white"
            kind = i % 10
            if kind == 0:  # masked edit on the images route
                row.update(route="images", reference_images=f"images/ref-{i % 4}.png", mask="images/mask.png")
                row.update(size="1024x1024", prompt="Replace the background of the {product_name}")
            elif kind == 1:  # text relay
                row.update(route="messages", model="claude-compat-small", max_tokens="300")
                row["prompt"] = "Write alt text for a {colour} {product_name}"
            elif kind < 6:  # native edit with a shared reference image
                row.update(reference_images=f"images/ref-{i % 4}.png", aspect_ratio=RATIOS[i % len(RATIOS)])
            else:  # native text-to-image
                row.update(aspect_ratio=RATIOS[i % len(RATIOS)], image_size="1K", count=str(1 + i % 2))
            writer.writerow([row[h] for h in header])
    return path


def manifests(sizes: list[int]) -> Iterator[tuple[int, Path]]:
    """Each size and a manifest of that many rows (`make_folder`), in a temporary folder removed after."""
    with tempfile.TemporaryDirectory() as tmp:
        for rows in sizes:
            folder = Path(tmp, str(rows))
            folder.mkdir()
            yield rows, make_folder(folder, rows)


def convert(path: Path, fmt: str) -> Path:
    """The CSV manifest written again as a workbook or a Parquet file (every cell as text), by a child
    process: writing a workbook takes openpyxl about 0.7 GB for 100,000 rows, which must not count in the
    reader's peak RSS."""
    if fmt == "csv":
        return path
    target = path.with_suffix(f".{fmt}")
    write = (
        "import sys, pandas as pd\n"
        "frame = pd.read_csv(sys.argv[1], dtype=str, keep_default_na=False)\n"
        "if sys.argv[2].endswith('.xlsx'): frame.to_excel(sys.argv[2], index=False, sheet_name='Products')\n"
        "else: frame.to_parquet(sys.argv[2], index=False)\n"
    )
    subprocess.run([sys.executable, "-c", write, str(path), str(target)], check=True)
    return target


def run(path: Path) -> tuple[dict[str, tuple[float, float]], int, int]:
    """(wall, CPU) seconds of each phase, the jobs and the requests."""
    timings: dict[str, tuple[float, float]] = {}
    start, cpu = time.perf_counter(), time.process_time()
    manifest = load_manifest(path)
    timings["load + validate"] = (time.perf_counter() - start, time.process_time() - cpu)
    start, cpu = time.perf_counter(), time.process_time()
    requests = plan(manifest)
    timings["plan (keys)"] = (time.perf_counter() - start, time.process_time() - cpu)
    start, cpu = time.perf_counter(), time.process_time()
    summary = summarise(requests)
    timings["summarise"] = (time.perf_counter() - start, time.process_time() - cpu)
    timings["total"] = (sum(w for w, _ in timings.values()), sum(c for _, c in timings.values()))
    return timings, len(manifest.jobs), summary.requests


def command(path: Path, repeat: int) -> None:
    """Time `imagebatch validate PATH` in a child process (what a user waits for, imports included), each
    run's wall and CPU seconds and peak RSS, beside the csv module alone reading the same file."""
    start = time.process_time()
    with path.open(newline="") as f:
        cells = sum(len(record) for record in csv.reader(f))
    print(f"csv module alone: {time.process_time() - start:.2f} CPU s ({cells:,} cells)")
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "imagebatch.cli.main", "validate", str(path)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        rss = after.ru_maxrss / 1024  # the largest child so far, KiB on Linux
        print(f"validate: exit {done.returncode}, {wall:.2f} s wall, {cpu:.2f} CPU s, peak RSS {rss:,.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--no-tracemalloc", action="store_true", help="skip the memory pass")
    parser.add_argument("--format", choices=("csv", "xlsx", "parquet"), default="csv")
    parser.add_argument("--command", action="store_true", help="time `imagebatch validate` as a command")
    parser.add_argument("--repeat", type=int, default=3, help="with --command: runs")
    args = parser.parse_args()
    if args.command:
        with tempfile.TemporaryDirectory() as tmp:
            command(convert(make_folder(Path(tmp), args.rows), args.format), args.repeat)
        return

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        path = convert(make_folder(Path(tmp), args.rows), args.format)
        generated = time.perf_counter() - start
        size_mb = path.stat().st_size / 1e6
        timings, jobs, requests = run(path)
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
        traced_mb = None
        if not args.no_tracemalloc:
            tracemalloc.start()
            run(path)
            traced_mb = tracemalloc.get_traced_memory()[1] / 1e6
            tracemalloc.stop()

    print(f"python {platform.python_version()} on {platform.machine()} ({sys.platform})")
    print(f"manifest: {args.rows:,} rows, {args.format}, {size_mb:.1f} MB, generated in {generated:.1f} s")
    print(f"jobs: {jobs:,}  requests: {requests:,}")
    print()
    print(f"{'phase':<18}{'seconds':>9}{'cpu s':>9}{'rows/s':>12}")
    for phase, (seconds, cpu) in timings.items():
        print(f"{phase:<18}{seconds:>9.2f}{cpu:>9.2f}{args.rows / seconds:>12,.0f}")
    print()
    print(f"peak RSS (whole process): {peak_rss_mb:,.0f} MB")
    if traced_mb is not None:
        print(f"peak Python allocations during load + plan (tracemalloc): {traced_mb:,.0f} MB")


if __name__ == "__main__":
    main()
