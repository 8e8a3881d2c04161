"""An output folder to review, written directly (a manifest, its plan, one drawn PNG per request, results.csv
and run.json as a run leaves them; no run, so no Prefect), and Chromium driven by Selenium through Debian's
chromedriver (never a downloaded driver)."""

from __future__ import annotations

import hashlib
import http.client
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from helpers.browser import CHROMIUM, FLAGS
from helpers.runs import read_jsonl
from imagebatch.manifest import load_manifest, plan
from imagebatch.storage.csvcells import write_csv
from imagebatch.work.store import RESULT_COLUMNS

CHROMEDRIVER = shutil.which("chromedriver")
BOUND = 30.0
"""Seconds a test waits for the page to do what it was asked (on a loaded machine)."""
PRODUCTS = [
    ("ceramic mug", "cobalt blue", (38, 74, 168)), ("ceramic mug", "sage green", (132, 160, 120)),
    ("canvas tote bag", "sand", (212, 188, 140)), ("desk lamp", "brushed brass", (181, 148, 74)),
    ("wool scarf", "burgundy", (128, 30, 48)), ("water bottle", "slate grey", (96, 104, 112)),
]  # fmt: skip


def product_png(shape: int, colour: tuple[int, int, int], side: int = 256) -> bytes:
    """A catalog-like picture: a coloured product on white with a soft shadow."""
    import io

    im = Image.new("RGB", (side, side), (250, 250, 248))
    draw = ImageDraw.Draw(im)
    s = side / 256
    draw.ellipse((60 * s, 200 * s, 196 * s, 222 * s), fill=(225, 225, 222))
    if shape % 3 == 0:  # a mug
        draw.rounded_rectangle((78 * s, 70 * s, 168 * s, 206 * s), radius=int(12 * s), fill=colour)
        draw.arc((150 * s, 100 * s, 200 * s, 170 * s), 270, 90, fill=colour, width=int(12 * s))
    elif shape % 3 == 1:  # a bag
        draw.rectangle((64 * s, 96 * s, 192 * s, 210 * s), fill=colour)
        draw.arc((94 * s, 50 * s, 162 * s, 130 * s), 180, 360, fill=colour, width=int(8 * s))
    else:  # a lamp
        draw.polygon(
            [(88 * s, 60 * s), (168 * s, 60 * s), (190 * s, 120 * s), (66 * s, 120 * s)], fill=colour
        )
        draw.rectangle((122 * s, 120 * s, 134 * s, 200 * s), fill=colour)
        draw.rectangle((92 * s, 196 * s, 164 * s, 210 * s), fill=colour)
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def catalog(root: Path, requests: int, references: bool, count: int) -> Path:
    """`root/catalog.csv`: `requests` product rows (two colourways a SKU) and a row `broken`, each of
    `count` requests, each naming `root/ref.png` with `references`."""
    manifest = root / "catalog.csv"
    refs = ",reference_images" if references else ""
    many = ",count" if count > 1 else ""
    if references:
        (root / "ref.png").write_bytes(product_png(0, (200, 200, 200)))
    lines = [f"id,sku,product_name,colour,prompt{refs}{many}"]
    for i in range(requests):
        name, colour, _ = PRODUCTS[i % len(PRODUCTS)]
        lines.append(
            f"p{i:03d},SKU-{1000 + i // 2},{name},{colour},Studio photo of a {{product_name}} in {{colour}}"
            + (",ref.png" if references else "")
            + (f",{count}" if many else "")
        )
    lines.append(
        "broken,SKU-9999,mug,black,Studio photo of a {product_name} in {colour}"
        + ("," if references else "")
        + (",1" if many else "")
    )
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def review_folder(
    root: Path,
    requests: int = 12,
    redone: int | None = 1,
    variants: int = 2,
    references: bool = False,
    side: int = 256,
    count: int = 1,
) -> Path:
    """`root/out`, an output folder as a run over a catalog manifest of `requests` rows leaves it (every
    request succeeded, a 256 px PNG each), plus one failed request (no image), and, if `redone` is given,
    variants 2..`variants` of that request (each its own key, as a redo adds them). The manifest is
    `root/catalog.csv`, named by run.json, so the page shows each prompt; its metadata columns (`sku`,
    `product_name`, `colour`) are results.csv's too, as a run writes them. With `references`, each row
    names a reference image (`root/ref.png`). `side`: the images' size in pixels; `count`: each row's
    requests (candidates of one job), each its own image."""
    manifest = catalog(root, requests, references, count)
    out = root / "out"
    rows: list[dict[str, Any]] = []
    for n, req in enumerate(plan(load_manifest(manifest))):
        row: dict[str, Any] = {
            "job_id": req.job_id, "request_index": req.request_index, "turn_index": req.turn_index,
            "status": "succeeded", "images": 1, "width": side, "height": side, "mime_type": "image/png",
            "model": req.model, "route": "native", "idempotency_key": req.idempotency_key, "attempts": 1,
            "finish_reason": "STOP", "request_id": f"req_{n}", "variant": 1, **req.job.metadata,
        }  # fmt: skip
        if req.job_id == "broken":
            rows.append(
                row | {"status": "failed", "images": 0, "width": "", "height": "", "error": "HTTP 503"}
            )
            continue
        rel = f"images/{req.job_id}/0-{req.idempotency_key[-12:]}.png"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(product_png(n, PRODUCTS[n % len(PRODUCTS)][2], side))
        rows.append(row | {"paths": rel})
        for v in range(2, variants + 1) if redone == n else ():
            key = "ib1-" + hashlib.sha256(f"{req.idempotency_key} variant {v}".encode()).hexdigest()
            rel2 = f"images/{req.job_id}/0-{key[-12:]}.png"
            (out / rel2).write_bytes(product_png(n + v - 1, (20 * v, 20, 20), side))
            rows.append(
                row | {"paths": rel2, "idempotency_key": key, "variant": v, "request_id": f"req_v{v}"}
            )
    with (out / "results.csv").open("w", newline="") as fh:
        write_csv(fh, [*RESULT_COLUMNS, "sku", "product_name", "colour"], rows)
    sha = hashlib.sha256(manifest.read_bytes()).hexdigest()
    run = {"manifest": str(manifest), "manifest_sha256": sha, "state": "finished"}
    (out / "run.json").write_text(json.dumps(run))
    return out


def chromium(profile: Path, width: int = 1280, height: int = 900) -> Any:
    """A headless Chromium under Selenium (the caller quits it); skips the test without Debian's chromium
    and chromedriver."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium or chromedriver is not installed (apt-get install chromium chromium-driver)")
    import subprocess

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]:
        options.add_argument(flag)
    service = Service(executable_path=CHROMEDRIVER, log_output=subprocess.DEVNULL)  # no driver download
    return webdriver.Chrome(options=options, service=service)


def request(
    url: str,
    method: str = "GET",
    path: str = "/",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """One HTTP request to the server at `url` (`http://127.0.0.1:PORT/`), headers exactly as given
    (http.client adds `Host` only if `headers` has none)."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        given = dict(headers or {})
        conn.putrequest(method, path, skip_host="Host" in given, skip_accept_encoding=True)
        for name, value in given.items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


# --- driving the page ---------------------------------------------------------------------------------


def until(browser: Any, check: Callable[[Any], Any], what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, BOUND, poll_frequency=0.05).until(check, message=what)


def open_page(browser: Any, url: str) -> list[str]:
    """Load the page; the cards' keys in the page's order."""
    browser.get(url)
    until(browser, lambda d: d.execute_script("return document.body.dataset.ready") == "1", "the page ready")
    return list(
        browser.execute_script(
            "return JSON.parse(document.getElementById('data').textContent).cards.map(c => c.k)"
        )
    )


def js(browser: Any, script: str, *args: Any) -> Any:
    """The value of the expression `script` in the page (`arguments[0]`, ... are `args`)."""
    return browser.execute_script("return " + script, *args)


def select(browser: Any, key: str) -> None:
    """Select the card `key` (a click on its heading line; it must be in the document)."""
    browser.execute_script("document.querySelector(`.card[data-key='${arguments[0]}'] .id`).click()", key)
    until(browser, lambda d: js(d, "document.querySelector('.card.sel').dataset.key") == key, "selected")


def press(browser: Any, keys: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).send_keys(keys).perform()


def saved(browser: Any, n: int) -> None:
    """Wait until this page has had `n` decisions answered as recorded."""
    until(browser, lambda d: d.execute_script("return document.body.dataset.saved") == str(n), f"{n} saved")


def shown(browser: Any) -> dict[str, tuple[str, str]]:
    """The cards in the document: key -> (decision, review line)."""
    cards = browser.execute_script(
        "return [...document.querySelectorAll('.card')].map(c => [c.dataset.key, c.dataset.decision,"
        " c.querySelector('.rv').textContent])"
    )
    return {key: (decision, line) for key, decision, line in cards}


def recorded(out: Path) -> list[tuple[str, int, str, str, str]]:
    return [
        (d["key"], d["variant"], d["decision"], d["note"], d["reviewer"])
        for d in read_jsonl(out / "review.jsonl")
    ]


def approved_before(root: Path, out: Path, job: str, reviewer: str = "alice") -> str:
    """Row `job` of `root/catalog.csv` as it was before its prompt changed: its earlier request (the same
    row with another prompt, so another key) made and approved, its image in `out` under the name a run
    gives it and its outcome in the journal, written by the project's own writers (`OutputStore`,
    `record_decision`). Returns the earlier key."""
    from imagebatch.storage.folder import FolderBackend
    from imagebatch.work.decisions import Decision, record_decision
    from imagebatch.work.store import OutputStore, RequestRecord, file_stem

    current = (root / "catalog.csv").read_text()
    earlier = root / "earlier.csv"
    earlier.write_text(current.replace("in {colour}", "in {colour} from the front"))
    req = next(r for r in plan(load_manifest(earlier)) if r.job_id == job)
    rel = f"images/{file_stem(req, False)}.png"
    (out / rel).write_bytes(product_png(2, (30, 140, 60)))
    store = OutputStore(out)
    with store.backend.hold():
        record = RequestRecord(job, req.request_index, req.turn_index, "succeeded", req.model, "native",
                               req.idempotency_key, paths=[rel], images=1)  # fmt: skip
        store.record_outcome(record)
        store.backend.sync()
    record_decision(FolderBackend(out), Decision(req.idempotency_key, 1, "approved", "", reviewer))
    return req.idempotency_key


CANDIDATES = "p00007"
"""The job of `catalog_folder` whose row asks for 3 candidates (`count` 3): its requests are picked among."""


def catalog_folder(root: Path, cards: int = 10_000) -> Path:
    """`root/out`, a catalog run of `cards` images as `run` leaves it, written fast by the project's own
    writers (no run): the manifest `root/catalog.csv` (id, sku with three colourways each, product_name,
    colour, prompt, a reference image, count: 1, but 3 for job `CANDIDATES`), its plan's keys, results.csv
    (`OutputStore.write_results`) and run.json (`OutputStore.write_run`), and one 256 px PNG and its
    thumbnail hard-linked per request, so the report and the page make none."""
    from imagebatch.work.store import OutputStore, file_stem

    colours = [
        "cobalt blue",
        "sage green",
        "sand",
        "brushed brass",
        "burgundy",
        "slate grey",
        "ivory",
        "black",
    ]
    manifest = root / "catalog.csv"
    (root / "ref.png").write_bytes(product_png(0, (200, 200, 200)))
    lines = ["id,sku,product_name,colour,prompt,reference_images,count"]
    for i in range(cards - 2):  # one row of 3 candidates: `cards` images in all
        name = PRODUCTS[i % len(PRODUCTS)][0]
        count = 3 if f"p{i:05d}" == CANDIDATES else 1
        lines.append(f"p{i:05d},SKU-{10000 + i // 3},{name},{colours[i % 8]},"
                     f"Studio photo of a {{product_name}} in {{colour}},ref.png,{count}")  # fmt: skip
    manifest.write_text("\n".join(lines) + "\n")
    out = root / "out"
    (out / "images").mkdir(parents=True)
    (out / "thumbs").mkdir()
    image, thumb = out / "base.png", out / "base.jpg"
    image.write_bytes(product_png(1, (38, 74, 168)))
    Image.open(image).convert("RGB").save(thumb, "JPEG", quality=80)
    rows = []
    for req in plan(load_manifest(manifest)):
        rel = f"images/{file_stem(req, False)}.png"
        (out / rel).parent.mkdir(exist_ok=True)
        (out / rel).hardlink_to(image)
        (out / "thumbs" / f"{rel.removeprefix('images/').replace('/', '__')}.jpg").hardlink_to(thumb)
        rows.append({
            "job_id": req.job_id, "request_index": req.request_index, "turn_index": 0, "status": "succeeded",
            "paths": rel, "images": 1, "width": 256, "height": 256, "mime_type": "image/png",
            "model": req.model, "route": "native", "idempotency_key": req.idempotency_key, "attempts": 1,
            "finish_reason": "STOP", "request_id": f"req_{req.job_id}_{req.request_index}", "variant": 1,
            **req.job.metadata,
        })  # fmt: skip
    store = OutputStore(out)
    store.write_results(rows, ["sku", "product_name", "colour"])
    sha = hashlib.sha256(manifest.read_bytes()).hexdigest()
    store.write_run({"manifest": str(manifest), "manifest_sha256": sha, "state": "finished"})
    return out
