"""The review page at catalog scale: `imagebatch review` over a 10,000-request run, opened in headless
Chromium (Debian's, through Selenium and its chromedriver, window 1440 x 900), and decisions posted from
the page.

    uv run python bench/bench_review.py [--requests 10000] [--posts 500] [--loads 5] [--searches 20]
                                        [--group-by sku] [--team-posts 250]
    uv run python bench/bench_review.py --requests 200000 --keep DIR   # the folder only, kept in DIR
    /usr/bin/time -v uv run python bench/bench_review.py --rss DIR      # the server's memory over DIR

With `--rss`, no browser: the server starts over the folder `--keep` made, its page is fetched over HTTP
(read and dropped a megabyte at a time, as a browser receives it), one card looked up and one decision
recorded, and the process's peak RSS and CPU time printed (quote `/usr/bin/time -v`'s "Maximum resident
set size": it counts the interpreter's start as well). The same script runs against another checkout
(`cd BEFORE && uv run python .../bench_review.py --rss DIR`): it uses only what both have.

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
- a search: one SKU typed into the page's search box (the whole of it at once, as a paste), timed from the
  input event to the matching cards laid out (the page's own `searchMs`) and to the next frame painted,
  over `--searches` SKUs spread over the set, each then cleared;
- the same page load again with 10,000 decisions already in review.jsonl;
- two reviewers at once (`--team-posts`, 0 skips it): a server on 127.0.0.2 with a token each, two
  browsers signed in with their links, both pages polling `GET /api/changes` every 2 s, each posting
  `--team-posts` decisions on the same cards at the same time (every one a disagreement), p50 / p95 / max
  over both, each reviewer's first cards when signed in; and the server's answer to a poll with nothing
  new, and with one change, at 10,000 cards.

A figure a browser did not report (a paint or resource timing entry missing, which happened at times) is
shown as n/a with how many loads had it, never a crash at the end of the run.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import secrets
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from PIL import Image

from imagebatch.manifest import load_manifest, plan_job
from imagebatch.report.review import ReviewServer
from imagebatch.storage.csvcells import write_csv
from imagebatch.storage.folder import FolderBackend
from imagebatch.work.store import RESULT_COLUMNS

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
COLOURS = ["cobalt blue", "sage green", "sand", "brushed brass", "burgundy", "slate grey", "ivory", "black"]
LINKS = 60_000
"""Requests whose images share one file (hard links)."""
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

    def rows() -> Iterator[dict[str, Any]]:  # a row at a time: 200,000 of them as a list is 0.5 GB
        for i, job in enumerate(load_manifest(manifest).jobs):  # (three colourways a product)
            png, jpg = out / f"base-{i // LINKS}.png", out / f"base-{i // LINKS}.jpg"
            if i % LINKS == 0:  # a file takes at most 65,000 links (ext4): a copy every `LINKS`
                png.write_bytes(image.getvalue())
                jpg.write_bytes(thumb.getvalue())
            for req in plan_job(job):
                name = f"{req.job_id}-0-{req.idempotency_key[-12:]}.png"
                (out / "images" / name).hardlink_to(png)
                (out / "thumbs" / f"{name}.jpg").hardlink_to(jpg)
                yield {
                    "job_id": req.job_id, "request_index": 0, "turn_index": 0, "status": "succeeded",
                    "paths": f"images/{name}", "images": 1, "width": 1024, "height": 1024,
                    "mime_type": "image/png", "model": req.model, "route": "native",
                    "idempotency_key": req.idempotency_key, "attempts": 1, "finish_reason": "STOP",
                    "request_id": f"req_{req.job_id}", **req.job.metadata,
                }  # fmt: skip

    with (out / "results.csv").open("w", newline="") as fh:
        write_csv(fh, [*RESULT_COLUMNS, "sku", "product_name", "colour"], rows())
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
    for flag in [*FLAGS, f"--user-data-dir={profile}", "--window-size=1440,900"]:
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


def team(out: Path, tmp: Path, posts: int) -> tuple[list[float], float, float, list[float]]:
    """Two reviewers deciding at once, each in a browser of their own signed in with their token: every
    decision's time, then a poll's (nothing new; one change) in ms, in the server's own process; and each
    reviewer's first cards (the page's `first-cards` mark, signed in, the record already full)."""
    from selenium.webdriver.support.ui import WebDriverWait

    tokens = {name: secrets.token_urlsafe(24) for name in ("alice", "bob")}
    server = ReviewServer(FolderBackend(out), "bench", host="127.0.0.2", reviewers=tokens)
    drivers = {name: browser(tmp / f"profile-{name}") for name in tokens}
    firsts: list[float] = []
    try:
        with server:
            for name, driver in drivers.items():
                driver.get(f"{server.url}?token={tokens[name]}")
                WebDriverWait(driver, 120).until(
                    lambda d: (
                        d.current_url == server.url and d.execute_script("return document.body.dataset.ready")
                    )
                )
                firsts.append(driver.execute_script(FIRST_CARDS))
            with ThreadPoolExecutor(len(drivers)) as pool:
                both = list(pool.map(lambda d: d.execute_async_script(POSTS, posts), drivers.values()))
            version = server.decisions.version
            t0 = time.perf_counter()
            for _ in range(1000):
                server.changes(version)
            idle = (time.perf_counter() - t0) / 1000 * 1000
            t0 = time.perf_counter()
            for _ in range(1000):
                server.changes(version - 1)
            one = (time.perf_counter() - t0) / 1000 * 1000
    finally:
        for driver in drivers.values():
            driver.quit()
    times = [t for each in both for t in each]
    if times and isinstance(times[0], str):
        raise SystemExit(f"a decision was refused: {times[0]}")
    return times, idle, one, firsts


FIRST_CARDS = "return performance.getEntriesByName('first-cards')[0].startTime"

SEARCH = """
const [sku, done] = [arguments[0], arguments[arguments.length - 1]];
const box = document.getElementById('search');
const t0 = performance.now();
box.value = sku;
box.dispatchEvent(new Event('input'));
requestAnimationFrame(() => setTimeout(() => {
  const painted = performance.now() - t0;
  done([+document.body.dataset.searchMs, painted, document.getElementById('shown').textContent]);
}, 0));
"""


def searches(driver: Any, skus: list[str]) -> list[list[Any]]:
    """Each SKU searched for on the loaded page, then the search cleared again (not timed)."""
    found = []
    for sku in skus:
        found.append(driver.execute_async_script(SEARCH, sku))
        driver.execute_async_script(SEARCH, "")
    return found


def median(values: list[float], of: int, digits: int = 0) -> str:
    """The median, or n/a (with how many of `of` had a value) where none was reported."""
    if not values:
        return f"n/a (0 of {of})"
    told = f"{statistics.median(values):.{digits}f} ms"
    return told if len(values) == of else f"{told} ({len(values)} of {of})"


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
    n = len(results)
    return (
        f"| {label} | {marks[0]:.0f} ms | {median(marks, n)} | {max(marks):.0f} ms | "
        f"{median(scripts, n)} | {median(paints, n)} | {median(thumbs, n)} | {results[0][3]} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--posts", type=int, default=500)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--searches", type=int, default=20)
    parser.add_argument("--group-by", default=None, help="a column to group the cards by (e.g. sku)")
    parser.add_argument("--team-posts", type=int, default=250, help="each of two reviewers' decisions")
    parser.add_argument("--keep", type=Path, help="make the folder in this directory, and stop")
    parser.add_argument("--rss", type=Path, help="the server's peak RSS over this kept folder")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True)
        t0 = time.perf_counter()
        make_folder(args.keep, args.requests)
        return print(f"{args.requests:,} requests in {args.keep / 'out'} ({time.perf_counter() - t0:.0f} s)")
    if args.rss:
        return serve_once(args.rss / "out")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        out = make_folder(Path(tmp), args.requests)
        made = time.perf_counter() - t0
        t0 = time.perf_counter()
        grouped = {"group_by": args.group_by} if args.group_by else {}  # (so that it runs on older code too)
        server = ReviewServer(FolderBackend(out), "bench", **grouped)
        started = time.perf_counter() - t0
        driver = browser(Path(tmp) / "profile")
        try:
            with server:
                answer = server.page("x")  # (bytes before the page was streamed)
                page = answer.length if hasattr(answer, "length") else len(answer)
                first = loads(driver, server.url, args.loads)
                step = max(1, args.requests // 3 // args.searches)
                skus = [f"SKU-{10000 + i}" for i in range(0, args.requests // 3, step)][: args.searches]
                searched = searches(driver, skus)
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
        two = team(out, Path(tmp), args.team_posts) if args.team_posts else None
    report(args, made, started, page, first, decided, searched, times, two)


def serve_once(out: Path) -> None:
    """The review server over `out`: started, its page read over HTTP, a card looked up and a decision
    recorded; its cards, page size, CPU seconds and peak RSS printed."""
    import resource
    import urllib.request

    t0, cpu = time.perf_counter(), time.process_time()
    server = ReviewServer(FolderBackend(out), "bench")
    started, start_cpu = time.perf_counter() - t0, time.process_time() - cpu
    with server:
        t0 = time.perf_counter()
        with urllib.request.urlopen(server.url, timeout=600) as answer:
            size = 0
            while chunk := answer.read(1 << 20):
                size += len(chunk)
        served = time.perf_counter() - t0
        key = next(iter(server.cards))
        status, _ = server.decide({"key": key, "decision": "approved", "note": ""})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu = time.process_time()
    print(f"cards {len(server.cards):,}; start {started:.1f} s ({start_cpu:.1f} CPU s); "
          f"page {size / 1e6:.1f} MB in {served:.1f} s; decision {int(status)}; peak RSS {peak:.0f} MiB; "
          f"CPU {cpu:.1f} s")  # fmt: skip


def report(
    args: argparse.Namespace,
    made: float,
    started: float,
    page: int,
    first: Any,
    decided: Any,
    searched: list[list[Any]],
    times: list[float],
    two: tuple[list[float], float, float, list[float]] | None,
) -> None:
    """The figures as bench/README.md's tables."""
    print(f"folder: {args.requests:,} requests made in {made:.1f} s; server start {started:.2f} s; "
          f"page {page / 1e6:.1f} MB")  # fmt: skip
    print()
    print("| page load | first cards, cold | median | max | page arrived to first cards (median) "
          "| first paint (median) | first thumbnail (median) | cards in the document |")  # fmt: skip
    print("|-|-|-|-|-|-|-|-|")
    print(describe(f"{args.requests:,} requests, no decisions", first))
    print(describe(f"{args.requests:,} requests, {args.requests:,} decisions", decided))
    print()
    print(f"| search, one SKU of {args.requests:,} cards | found and laid out: median | max "
          "| to the next frame: median | max | cards shown |")  # fmt: skip
    print("|-|-|-|-|-|-|")
    laid, painted = [r[0] for r in searched], [r[1] for r in searched]
    print(f"| {len(searched)} SKUs | {median(laid, len(searched), 1)} | {max(laid):.1f} ms | "
          f"{median(painted, len(searched), 1)} | {max(painted):.1f} ms | {searched[0][2]} |")  # fmt: skip
    print()
    print("| decisions posted | p50 | p95 | max |")
    print("|-|-|-|-|")
    p50, p95 = quantile(times, 0.5), quantile(times, 0.95)
    print(f"| {len(times)} | {p50:.1f} ms | {p95:.1f} ms | {max(times):.1f} ms |")
    if two is not None:
        both, idle, one, firsts = two
        p50, p95 = quantile(both, 0.5), quantile(both, 0.95)
        print(f"| two reviewers at once, {len(both)} | {p50:.1f} ms | {p95:.1f} ms | {max(both):.1f} ms |")
        print()
        cards = f"{args.requests:,} cards"
        print(
            f"a poll (GET /api/changes) at {cards}, in the server: none new {idle:.3f} ms, one {one:.3f} ms"
        )
        print(f"two reviewers signed in on 127.0.0.2: first cards {', '.join(f'{t:.0f} ms' for t in firsts)}")


if __name__ == "__main__":
    main()
