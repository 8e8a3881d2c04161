"""The review page at catalog scale: `imagebatch review` over a 10,000-request run, opened in headless
Chromium (Debian's, through Selenium and its chromedriver), and decisions posted from the page.

    uv run python bench/bench_review.py [--requests 10000] [--posts 500] [--loads 5] [--group-by sku]

The folder is laid out as a run leaves it: a 10,000-row catalog manifest (its prompts shown on the
cards), its plan's keys and its metadata columns (sku, product_name, colour) in results.csv, one 1024 px
PNG and one thumbnail hard-linked per request. The server runs in this process (its own threads), as
`imagebatch review` does, showing every metadata column (and grouping by `--group-by`, if given).

Measured:
- server start: results.csv read, the manifest planned again (for the prompts), the port bound;
- first cards: the page's `first-cards` mark (navigation start to the first cards in the document, the
  data parsed), the part of it after the page arrived (the page's own script: parsing its data and
  laying out the first cards), and first-contentful-paint, over `--loads` fresh loads (the first cold);
- first thumbnail: navigation start to the first thumbnail's arrival;
- a decision saved: `--posts` decisions posted one after another by the page's own `fetch`, each timed
  from the call to its answer (recorded and synced before the answer), p50 / p95 / max;
- the same page load again with 10,000 decisions already in review.jsonl.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from PIL import Image

from imagebatch.manifest import load_manifest, plan
from imagebatch.report.review import ReviewServer
from imagebatch.storage.csvcells import write_csv
from imagebatch.storage.location import LocalFolder
from imagebatch.work.store import RESULT_COLUMNS

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
COLOURS = ["cobalt blue", "sage green", "sand", "brushed brass", "burgundy", "slate grey", "ivory", "black"]
PRODUCTS = ["ceramic mug", "canvas tote bag", "desk lamp", "wool scarf", "water bottle", "linen cushion"]


def make_folder(root: Path, n: int) -> Path:
    """`root/out` with `n` succeeded requests of a catalog manifest `root/catalog.csv`."""
    manifest = root / "catalog.csv"
    lines = ["id,sku,product_name,colour,prompt"]
    for i in range(n):
        prompt = "Studio photo of a {product_name} in {colour} on white, soft shadow, 45 degree view"
        lines.append(f'p{i:05d},SKU-{10000 + i // 3},{PRODUCTS[i % 6]},{COLOURS[i % 8]},"{prompt}"')
    manifest.write_text("\n".join(lines) + "\n")
    out = root / "out"
    (out / "images").mkdir(parents=True)
    (out / "thumbs").mkdir()
    image, thumb = io.BytesIO(), io.BytesIO()
    Image.new("RGB", (1024, 1024), (200, 120, 40)).save(image, "PNG")
    Image.new("RGB", (256, 256), (200, 120, 40)).save(thumb, "JPEG", quality=80)
    (out / "base.png").write_bytes(image.getvalue())
    (out / "base.jpg").write_bytes(thumb.getvalue())
    rows = []
    for req in plan(load_manifest(manifest)):  # (three colourways a product)
        name = f"{req.job_id}-0-{req.idempotency_key[-12:]}.png"
        (out / "images" / name).hardlink_to(out / "base.png")
        (out / "thumbs" / f"{name}.jpg").hardlink_to(out / "base.jpg")
        rows.append({
            "job_id": req.job_id, "request_index": 0, "turn_index": 0, "status": "succeeded",
            "paths": f"images/{name}", "images": 1, "width": 1024, "height": 1024, "mime_type": "image/png",
            "model": req.model, "route": "native", "idempotency_key": req.idempotency_key, "attempts": 1,
            "finish_reason": "STOP", "request_id": f"req_{req.job_id}", **req.job.metadata,
        })  # fmt: skip
    with (out / "results.csv").open("w", newline="") as fh:
        write_csv(fh, [*RESULT_COLUMNS, "sku", "product_name", "colour"], rows)
    sha = hashlib.sha256(manifest.read_bytes()).hexdigest()
    (out / "run.json").write_text(
        json.dumps({"manifest": str(manifest), "manifest_sha256": sha, "state": "finished"})
    )
    return out


def browser(profile: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        raise SystemExit(
            "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*FLAGS, f"--user-data-dir={profile}", "--window-size=1280,900"]:
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(driver, log_output=subprocess.DEVNULL))


LOAD_TIMES = """
const done = arguments[arguments.length - 1];
const wait = () => {
  const img = document.querySelector('.card img');
  const thumb = img && img.complete && img.naturalWidth > 0;
  if (!thumb) return setTimeout(wait, 10);
  const mark = performance.getEntriesByName('first-cards')[0];
  const paint = performance.getEntriesByName('first-contentful-paint')[0];
  const res = performance.getEntriesByType('resource').find(e => e.name.includes('/thumb/'));
  const nav = performance.getEntriesByType('navigation')[0];
  done([mark.startTime, paint ? paint.startTime : null, res ? res.responseEnd : null,
        document.querySelectorAll('.card').length, mark.startTime - nav.responseEnd]);
};
wait();
"""

POSTS = """
const [n, done] = [arguments[0], arguments[arguments.length - 1]];
const token = document.querySelector('meta[name="review-token"]').content;
const keys = JSON.parse(document.getElementById('data').textContent).cards.map(c => c.k);
(async () => {
  const times = [];
  for (let i = 0; i < n; i++) {
    const body = JSON.stringify({key: keys[i % keys.length], decision: i % 3 ? 'approved' : 'rejected',
                                 note: i % 3 ? '' : 'handle missing'});
    const t0 = performance.now();
    const r = await fetch('/api/decision', {method: 'POST', body,
      headers: {'Content-Type': 'application/json', 'X-Review-Token': token}});
    await r.json();
    if (!r.ok) { done(['HTTP ' + r.status]); return; }
    times.push(performance.now() - t0);
  }
  done(times);
})();
"""


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def loads(driver: Any, url: str, count: int) -> list[list[float]]:
    results = []
    for _ in range(count):
        driver.get("about:blank")
        driver.get(url)
        results.append(driver.execute_async_script(LOAD_TIMES))
    return results


def describe(label: str, results: list[list[float]]) -> str:
    marks = [r[0] for r in results]
    paints = [r[1] for r in results if r[1] is not None]
    thumbs = [r[2] for r in results if r[2] is not None]
    scripts = [r[4] for r in results]
    return (
        f"| {label} | {marks[0]:.0f} ms | {statistics.median(marks):.0f} ms | {max(marks):.0f} ms | "
        f"{statistics.median(scripts):.0f} ms | "
        f"{statistics.median(paints):.0f} ms | {statistics.median(thumbs):.0f} ms | {results[0][3]} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--posts", type=int, default=500)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--group-by", default=None, help="a column to group the cards by (e.g. sku)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        out = make_folder(Path(tmp), args.requests)
        made = time.perf_counter() - t0
        t0 = time.perf_counter()
        grouped = {"group_by": args.group_by} if args.group_by else {}  # (so that it runs on older code too)
        server = ReviewServer(LocalFolder(out), "bench", **grouped)
        started = time.perf_counter() - t0
        driver = browser(Path(tmp) / "profile")
        try:
            with server:
                page = len(server.page("x"))
                first = loads(driver, server.url, args.loads)
                times = driver.execute_async_script(POSTS, args.posts)
                if times and isinstance(times[0], str):
                    raise SystemExit(f"a decision was refused: {times[0]}")
                at = "2026-01-01T00:00:00.000000Z"
                decision = {"variant": 1, "decision": "approved", "note": "", "reviewer": "x", "at": at}
                lines = [json.dumps({"key": k, **decision}) for k in server.cards]
                with (out / "review.jsonl").open("a") as fh:
                    fh.write("\n".join(lines) + "\n")
                decided = loads(driver, server.url, args.loads)
        finally:
            driver.quit()
    print(f"folder: {args.requests:,} requests made in {made:.1f} s; server start {started:.2f} s; "
          f"page {page / 1e6:.1f} MB")  # fmt: skip
    print()
    print("| page load | first cards, cold | median | max | page arrived to first cards (median) "
          "| first paint (median) | first thumbnail (median) | cards in the document |")  # fmt: skip
    print("|-|-|-|-|-|-|-|-|")
    print(describe(f"{args.requests:,} requests, no decisions", first))
    print(describe(f"{args.requests:,} requests, {args.requests:,} decisions", decided))
    print()
    print("| decisions posted | p50 | p95 | max |")
    print("|-|-|-|-|")
    p50, p95 = quantile(times, 0.5), quantile(times, 0.95)
    print(f"| {len(times)} | {p50:.1f} ms | {p95:.1f} ms | {max(times):.1f} ms |")


if __name__ == "__main__":
    main()
