"""The report's bounds against hostile inputs (issue 21): a huge image costs a bounded amount of memory
(a placeholder, not a 1.3 GB decode), and a malformed `#hash` does not break the filter script."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.browser import dom
from helpers.images import blank_png

from imagebatch.report import build_report
from imagebatch.storage.folder import FolderBackend
from imagebatch.work import thumbnails
from imagebatch.work.thumbnails import keep_thumbnail

HEADER = "job_id,request_index,turn_index,status,paths,images,width,height,mime_type,model,route,"
HEADER += "idempotency_key,attempts,finish_reason,error,request_id\n"
KEY = "ib1-" + "0" * 32

CHILD = r"""
import json, re, sys
from pathlib import Path
from imagebatch.work import thumbnails
def peak():  # VmHWM, kB: reset first, as a forked child starts with its parent's high-water mark
    return int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1))
open("/proc/self/clear_refs", "w").write("5")
before = peak()
try:
    result = thumbnails.ensure_thumbnail(Path(sys.argv[2]), Path(sys.argv[1]), "t")
except ValueError as exc:
    result = str(exc)
after = peak()
print(json.dumps({"kib": after - before, "result": result}))
"""


def thumbnail_cost(tmp_path: Path, side: int) -> tuple[int, str]:
    """Peak RSS growth (bytes) of a fresh process thumbnailing a `side` x `side` RGBA PNG, and the result."""
    source = tmp_path / f"rgba-{side}.png"
    source.write_bytes(blank_png(side, side))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(source), str(tmp_path / f"out-{side}")],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    return measured["kib"] * 1024, measured["result"]


@pytest.mark.slow  # decodes a 13000 x 13000 image in processes of its own
def test_a_huge_image_costs_at_most_about_100_mb_more_than_a_small_one(tmp_path: Path) -> None:
    """13000 x 13000 RGBA (a 660 KB file) took 1.3 GB; the largest image still thumbnailed (4896 x 4896,
    just under THUMB_MAX_PIXELS) is decoded whole but reduced in bands, not copied premultiplied."""
    small, small_result = thumbnail_cost(tmp_path, 1024)
    largest, largest_result = thumbnail_cost(tmp_path, 4896)
    huge, huge_result = thumbnail_cost(tmp_path, 13000)
    assert small_result == largest_result == "thumbs/t.jpg"
    assert huge_result.startswith("13000 x 13000 pixels: too large to thumbnail")
    assert largest - small < 100 * 2**20, f"{(largest - small) / 2**20:.0f} MiB"
    assert huge - small < 20 * 2**20, f"{(huge - small) / 2**20:.0f} MiB"


def test_a_huge_image_or_reference_is_a_placeholder_card_naming_its_size(tmp_path: Path) -> None:
    (tmp_path / "images" / "j").mkdir(parents=True)
    (tmp_path / "images" / "j" / "big.png").write_bytes(blank_png(13000, 13000))
    (tmp_path / "ref.png").write_bytes(blank_png(6000, 5000))
    (tmp_path / "small.png").write_bytes(blank_png(600, 500))
    row = f"j,0,0,succeeded,images/j/big.png,1,13000,13000,image/png,native-image-2,native,{KEY},1,,,r\n"
    (tmp_path / "results.csv").write_text(HEADER + row)
    plan = {KEY: SimpleNamespace(prompt="p", reference_images=[tmp_path / "ref.png", tmp_path / "small.png"],
                                 mask=None)}  # fmt: skip
    page = build_report(tmp_path, details=plan).read_text()  # type: ignore[arg-type]
    assert '<a href="images/j/big.png"><div class="big">image 13000 x 13000 pixels: too large' in page
    assert '<div class="big">reference 6000 x 5000 pixels: too large to thumbnail (over 24,000,000' in page
    assert page.count('<img class="ref"') == 1  # the small reference still has its thumbnail
    small_ref = "ref-" + hashlib.sha256(str(tmp_path / "small.png").encode()).hexdigest()[:16]
    assert [p.name for p in (tmp_path / "thumbs").iterdir()] == [f"{small_ref}.jpg"]


def test_a_run_skips_the_thumbnail_of_a_huge_image_it_receives(tmp_path: Path) -> None:
    keep_thumbnail(FolderBackend(tmp_path), "images/j/big.png", blank_png(13000, 13000))
    keep_thumbnail(FolderBackend(tmp_path), "images/j/ok.png", blank_png(600, 500))
    assert sorted(p.name for p in (tmp_path / "thumbs").iterdir()) == ["j__ok.png.jpg"]
    assert thumbnails.THUMB_MAX_PIXELS < 13000 * 13000


def two_card_report(tmp_path: Path) -> Path:
    rows = [f"a,0,0,failed,,0,,,,native-image-2,native,{KEY},1,,HTTP 503,r\n",
            f"b,0,0,unknown,,0,,,,compat-image-2,images_generations,ib1-{'1' * 32},1,,,r\n"]  # fmt: skip
    (tmp_path / "results.csv").write_text(HEADER + "".join(rows))
    return build_report(tmp_path)


def visible(page: str) -> list[str]:
    tags = re.findall(r'<div class="card [^>]*>', page)
    return [re.search(r'data-status="(\w+)"', t)[1] for t in tags if "hidden" not in t]  # type: ignore[index]


@pytest.mark.slow  # a browser
@pytest.mark.parametrize(
    "fragment",
    ["#status]=x", "#%", "#status=%ZZ&route=[&=&&model", "#__proto__=x&constructor=y&status", "#status=x"],
)
def test_a_malformed_hash_shows_every_card_and_the_script_still_runs(tmp_path: Path, fragment: str) -> None:
    shown = dom(two_card_report(tmp_path), tmp_path / "chromium", fragment)
    assert visible(shown) == ["failed", "unknown"]
    assert '<span id="shown">2</span>' in shown  # apply() ran: the script did not throw before it
    assert re.search(r'<body data-images="0" data-loaded="0"', shown)  # and the load handler was set


@pytest.mark.slow  # a browser
def test_a_well_formed_hash_still_filters(tmp_path: Path) -> None:
    shown = dom(two_card_report(tmp_path), tmp_path / "chromium", "#status=unknown&model=compat-image-2")
    assert visible(shown) == ["unknown"] and '<span id="shown">1</span>' in shown
