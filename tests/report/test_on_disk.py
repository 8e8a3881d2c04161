"""The report and the review read from indexes on disk: the plan's details (`report.details`), results.csv's
rows (`report.rowindex`) and the review's cards (`report.cardstore`) answer as the in-memory versions did,
and the memory they take does not grow with the rows."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.review import catalog, review_folder

from imagebatch.manifest import load_manifest, plan
from imagebatch.report import build_report
from imagebatch.report.cardstore import CardStore, ReviewCard
from imagebatch.report.details import index_details, manifest_details
from imagebatch.report.review_page import inline_json
from imagebatch.storage.csvcells import read_csv, write_csv
from imagebatch.work.decisions import Decision
from imagebatch.work.runsummary import RunSummary
from imagebatch.work.store import RESULT_COLUMNS


def test_the_plans_details_index_answers_as_the_plan(tmp_path: Path) -> None:
    manifest = catalog(tmp_path, 30, references=True, count=2)
    planned = list(plan(load_manifest(manifest)))
    details = index_details(iter(planned))
    assert len(details) == len(planned) and set(details) == {r.idempotency_key for r in planned}
    for req in planned:
        shown = details[req.idempotency_key]
        assert (shown.prompt, shown.reference_images, shown.mask) == (
            req.prompt,
            req.reference_images,
            req.mask,
        )
    assert "ib1-none" not in details and details.get("ib1-none") is None
    with pytest.raises(KeyError):
        details["ib1-none"]
    sha = hashlib.sha256(manifest.read_bytes()).hexdigest()
    run = RunSummary.parse(
        json.dumps({"manifest": str(manifest), "manifest_sha256": sha, "state": "finished"}).encode(),
        "run.json",
    )
    again = manifest_details(run)
    assert dict(again.items()) == dict(details.items())
    manifest.write_text(manifest.read_text().replace("Studio", "Outdoor photo"))  # changed since the run
    assert dict(manifest_details(run)) == {}


def test_the_card_store_streams_the_pages_data_as_it_would_be_inlined_whole() -> None:
    cards = [
        ReviewCard(
            f"ib1-{i:05d}",
            1 + i % 3,
            (f"images/j{i}/0.png",),
            {
                "k": f"ib1-{i:05d}",
                "t": f"p{i} café",
                "p": "</script><!-- & é" if i % 7 == 0 else "a mug",
                "m": ["SKU-1", str(i)],
            },
            (f"/refs/{i}.png",) if i % 2 else (),
        )
        for i in range(2_345)  # more than two of the store's batches
    ]
    store = CardStore()
    for card in cards:
        store.add(card)
    store.done()
    streamed = b"".join(store.json_chunks())
    assert streamed == inline_json([c.shown for c in cards]).encode()
    assert store.json_length == len(streamed)
    assert list(store) == [c.key for c in cards] and list(store.ordered()) == cards
    assert store["ib1-01234"] == cards[1234] and store.get("ib1-x") is None and "ib1-00007" in store
    assert store.having(["ib1-00001", "ib1-x", "ib1-02344"]) == {"ib1-00001", "ib1-02344"}
    empty = CardStore().done()
    assert b"".join(empty.json_chunks()) == b"[]" and empty.json_length == 2 and len(empty) == 0


def test_the_report_counts_and_marks_a_redone_image_from_its_index(tmp_path: Path) -> None:
    out = review_folder(tmp_path, requests=6, redone=1, variants=3, references=True)
    rows = read_csv(out / "results.csv")
    key = next(r["idempotency_key"] for r in rows if r["job_id"] == "p001" and r["variant"] == "1")
    rejected = Decision(key, 1, "rejected", "handle missing", "maria")
    page = build_report(out, decisions={key: rejected}).read_text()
    assert "3 redone" not in page and "· 2 redone" in page  # variants 1 and 2 of p001, replaced by 3
    assert '<div class="rv rv-redone">rejected, redone by maria' in page
    assert page.count('data-review="redone"') == 2 and page.count("Studio photo of a") >= 6


def _results(out: Path, n: int, images: int, per_sku: int = 3) -> None:
    """results.csv of `n` requests, one in `images` succeeded with its image's name (the file need not
    be there), the others failed; `per_sku` rows share a SKU."""
    out.mkdir(parents=True)
    rows = (
        {"job_id": f"j{i:06d}", "request_index": 0, "turn_index": 0, "model": "m", "route": "native",
         "idempotency_key": f"ib1-{i:032x}", "attempts": 1, "variant": 1 + (i % 5 == 0),
         "sku": f"S{i // per_sku}"}
        | ({"status": "succeeded", "paths": f"images/j{i:06d}/0.png", "images": 1} if i % images == 0
           else {"status": "failed", "error": "HTTP 503"})
        for i in range(n)
    )  # fmt: skip
    with (out / "results.csv").open("w", newline="") as fh:
        write_csv(fh, [*RESULT_COLUMNS, "sku"], rows)


_PEAK = """
import sys, tracemalloc
from pathlib import Path
from imagebatch.report import build_report
from imagebatch.report.review_data import load_cards
from imagebatch.storage.folder import FolderBackend
out = Path(sys.argv[2])
tracemalloc.start()
if sys.argv[1] == "review":
    load_cards(FolderBackend(out), group_by="sku")
else:
    build_report(out, page_size=500, decisions={})
print(tracemalloc.get_traced_memory()[1])
"""


def _peak(name: str, out: Path) -> int:
    """The peak of what Python allocates while `name` reads `out`, in a process of its own: tracemalloc
    counts every thread's allocations, and a test process may still run threads of earlier tests."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, name, str(out)], capture_output=True, text=True, timeout=600, check=True
    )
    return int(done.stdout.split()[-1])


@pytest.mark.parametrize(
    ("name", "sizes"), [("review", (4_000, 12_000)), ("report", (12_000, 36_000))], ids=["review", "report"]
)
def test_memory_does_not_grow_with_the_rows(tmp_path: Path, name: str, sizes: tuple[int, int]) -> None:
    peaks = []
    # Each size past the indexes' batches (`rowindex.BATCH`, `cardstore.BATCH`) and the report's first
    # pages. The review keeps one small entry per group (the order of first appearance): 100 rows a SKU,
    # so that what is measured is the rows, which must not be held. The review's rows held whole (its
    # indexes' batches made unbounded) go from 4.3 to 12.2 MB over 4,000 to 12,000 rows, where bounded
    # they stay at 2.0 MB. Each of the report's pages carries a pager that names every page, so its peak
    # grows a little with the number of pages (1.4x from 4,000 to 12,000 rows at 500 a page): its sizes
    # are where the pages' fixed part makes that small against the rows it must not hold.
    for n in sizes:
        out = tmp_path / str(n)
        _results(out, n, images=1 if name == "review" else 10, per_sku=100)  # report: a thumbnail tried
        peaks.append(_peak(name, out))
    assert peaks[1] < 1.25 * peaks[0], peaks  # three times the rows; held in memory, they took three times
