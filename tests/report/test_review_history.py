"""A changed row's history on the review page (issue 37): a row whose prompt changed is a new request with
a new key; the image approved for its earlier key (still in OUT, named by the journal) is shown beside the
new request's cards and served, and nothing else is; in a bucket too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.review import approved_before, request, review_folder
from helpers.runs import read_jsonl

from imagebatch.report.review import ReviewServer
from imagebatch.report.review_data import load_cards
from imagebatch.storage.folder import FolderBackend
from imagebatch.storage.kinds import open_location
from imagebatch.work.decisions import Decision, read_decisions, record_decision
from imagebatch.work.store import OutputStore, RequestRecord


def test_a_changed_rows_cards_carry_the_image_approved_for_its_earlier_prompt(tmp_path: Path) -> None:
    out = review_folder(tmp_path, requests=6, redone=2, variants=2)
    folder = FolderBackend(out)
    earlier = approved_before(tmp_path, out, "p002", reviewer="maria")
    found = load_cards(folder, approved=read_decisions(folder))
    with_history = {c.key: c.shown["h"] for c in found.cards.ordered() if "h" in c.shown}
    p002 = [c.key for c in found.cards.ordered() if c.shown["t"] == "p002"]
    assert len(p002) == 2  # both variants of the new request show it
    assert with_history == {key: [earlier, 1, "maria"] for key in p002}
    (rel,) = found.earlier[earlier]
    assert rel.startswith("images/p002/0-") and (out / rel).is_file()
    # Without the decisions (report.html's reading) or with the approval taken back, nothing is shown
    assert not any("h" in c.shown for c in load_cards(folder).cards.ordered())
    record_decision(folder, Decision(earlier, 1, "rejected", "wrong colour", "bob"))
    assert load_cards(folder, approved=read_decisions(folder)).earlier == {}


def test_only_an_approved_earlier_key_of_a_row_is_shown_the_latest_one(tmp_path: Path) -> None:
    out = review_folder(tmp_path, requests=4, redone=None)
    folder = FolderBackend(out)
    first = approved_before(tmp_path, out, "p001")
    current = {c.shown["t"]: c.key for c in load_cards(folder).cards.ordered()}
    # An approval of a key results.csv still names is no history; nor is one the journal never named
    record_decision(folder, Decision(current["p003"], 1, "approved", "", "alice"))
    record_decision(folder, Decision("ib1-" + "0" * 64, 1, "approved", "", "alice"))
    found = load_cards(folder, approved=read_decisions(folder))
    assert {c.shown["t"]: c.shown["h"][0] for c in found.cards.ordered() if "h" in c.shown} == {"p001": first}
    # The row changed twice: the later approval is the one shown
    (tmp_path / "catalog.csv").write_text((tmp_path / "earlier.csv").read_text())
    second = approved_before(tmp_path, out, "p001", reviewer="bob")
    assert second != first
    found = load_cards(folder, approved=read_decisions(folder))
    assert [c.shown["h"] for c in found.cards.ordered() if "h" in c.shown] == [[second, 1, "bob"]]


def test_the_server_serves_the_earlier_image_and_nothing_else_by_an_old_key(tmp_path: Path) -> None:
    out = review_folder(tmp_path, requests=4, redone=None)
    earlier = approved_before(tmp_path, out, "p001")
    rejected = approved_before(tmp_path, out, "p002")
    record_decision(FolderBackend(out), Decision(rejected, 1, "rejected", "", "bob"))
    with ReviewServer(FolderBackend(out), "alice") as server:
        (rel,) = server.earlier[earlier]
        assert request(server.url, path=f"/image/{earlier}/0") == (200, (out / rel).read_bytes())
        assert request(server.url, path=f"/thumb/{earlier}/0")[0] == 200
        for path in (f"/image/{earlier}/1", f"/image/{rejected}/0", f"/thumb/{rejected}/0"):
            assert request(server.url, path=path)[0] == 404, path
        # An earlier key is shown, never decided: the page's decisions name its current cards only
        status, _ = server.decide({"key": earlier, "decision": "rejected"})
        assert status == 400


def test_a_buckets_changed_row_shows_its_earlier_approved_image_from_the_journals_segments(
    s3: Any, tmp_path: Path
) -> None:
    out = review_folder(tmp_path, requests=3, redone=None)
    earlier = approved_before(tmp_path, out, "p001", reviewer="maria")
    url = f"s3://{s3.bucket()}/run"
    bucket = open_location(url)
    for path in out.rglob("*"):  # the run's files, as a run into the bucket leaves them
        if path.is_file() and path.name not in ("journal.jsonl", "review.jsonl", ".imagebatch.lock"):
            bucket.put(path.relative_to(out).as_posix(), path.read_bytes())
    store = OutputStore(url)
    with store.backend.hold():
        for line in read_jsonl(out / "journal.jsonl"):
            if line.pop("event") == "outcome":
                store.record_outcome(RequestRecord.from_json(line))
        store.backend.sync()
    record_decision(bucket, Decision(earlier, 1, "approved", "", "maria"))
    found = load_cards(bucket, approved=read_decisions(bucket))
    assert [c.shown["h"] for c in found.cards.ordered() if "h" in c.shown] == [[earlier, 1, "maria"]]
    with ReviewServer(bucket, "alice") as server:
        (rel,) = server.earlier[earlier]
        assert request(server.url, path=f"/image/{earlier}/0") == (200, (out / rel).read_bytes())
