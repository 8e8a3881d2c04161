"""The review server's view of the decisions (`DecisionCache`): only what was appended since is read, a
line still being written waits, the record's order decides (as `read_decisions` says), on a folder and on
a bucket (moto); and the cards' order and the names they may serve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from imagebatch.report.review_data import load_cards, safe_name
from imagebatch.report.review_decisions import DecisionCache
from imagebatch.storage.folder import FolderBackend
from imagebatch.storage.kinds import open_location
from imagebatch.storage.layout import REVIEW_FILE
from imagebatch.work.decisions import Decision, read_decisions, record_decision


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_folders_cache_reads_what_others_append_and_waits_for_a_whole_line(tmp_path: Path) -> None:
    folder, clock = FolderBackend(tmp_path), Clock()
    record_decision(folder, Decision("ib1-a", 1, "approved"))
    cache = DecisionCache(folder, interval=1.0, clock=clock)
    version, now = cache.since(-1)
    assert {k: d.decision for k, d in now.items()} == {"ib1-a": "approved"}

    record_decision(folder, Decision("ib1-b", 1, "rejected", "too dark"))  # another reviewer's server
    assert cache.since(version) == (version, {})  # read again at most once a second
    clock.now += 1.0
    later, changed = cache.since(version)
    assert later > version and {k: d.note for k, d in changed.items()} == {"ib1-b": "too dark"}

    line = json.dumps(
        {"key": "ib1-a", "variant": 1, "decision": "rejected", "note": "", "reviewer": "", "at": "x"}
    )
    with (tmp_path / REVIEW_FILE).open("ab") as fh:  # a writer halfway through its line
        fh.write(line[:20].encode())
    clock.now += 1.0
    assert cache.since(later)[1] == {}
    with (tmp_path / REVIEW_FILE).open("ab") as fh:
        fh.write(line[20:].encode() + b"\n")
    clock.now += 1.0
    assert {k: d.decision for k, d in cache.since(later)[1].items()} == {"ib1-a": "rejected"}

    mine = cache.record(Decision("ib1-c", 1, "approved", reviewer="me"))  # in force at once
    assert cache.since(-1)[1]["ib1-c"] == mine
    assert cache.since(-1)[1] == read_decisions(folder)


def test_a_buckets_cache_fetches_only_new_objects_and_keeps_the_listings_order(s3: Any) -> None:
    location = open_location(f"s3://{s3.bucket()}/run")
    record_decision(location, Decision("ib1-a", 1, "approved", reviewer="ann"))
    cache = DecisionCache(location, interval=0)
    assert cache.since(-1)[1]["ib1-a"].decision == "approved"
    # An object listed before the one already read (another server's clock was behind): it is older, so
    # the approval stays in force, as read_decisions says.
    early = {"key": "ib1-a", "variant": 1, "decision": "rejected", "note": "", "reviewer": "bob",
             "at": "2000-01-01T00:00:00.000000Z"}  # fmt: skip
    assert location.put_new("review/20000101T000000.000000Z-0a0a0a0a0a0a.json", json.dumps(early).encode())
    record_decision(location, Decision("ib1-b", 1, "rejected", reviewer="bob"))
    in_force = cache.since(-1)[1]
    assert {k: d.decision for k, d in in_force.items()} == {"ib1-a": "approved", "ib1-b": "rejected"}
    assert in_force == read_decisions(location)


def test_cards_are_the_rows_with_images_each_requests_variants_newest_first(tmp_path: Path) -> None:
    header = "job_id,request_index,turn_index,status,paths,images,model,route,idempotency_key,variant\n"
    rows = [
        "a,0,0,succeeded,images/a/0-1.png,1,m,native,ib1-a1,1",
        "b,0,0,failed,,0,m,native,ib1-b1,",
        "a,0,0,succeeded,images/a/0-3.png,1,m,native,ib1-a3,3",
        "c,0,0,skipped,images/c/0-1.png;images/c/0-1.txt,1,m,native,ib1-c1,",
        "a,0,0,succeeded,images/a/0-2.png,1,m,native,ib1-a2,2",
        "d,0,0,succeeded,../d.png;/etc/x.png;images/../d.png;thumbs/x.png,1,m,native,ib1-d1,1",
    ]
    (tmp_path / "results.csv").write_text(header + "\n".join(rows) + "\n")
    found = load_cards(FolderBackend(tmp_path))
    cards = list(found.cards.ordered())
    assert [(c.key, c.variant, c.shown["nv"]) for c in cards] == [
        ("ib1-a3", 3, 3), ("ib1-a2", 2, 3), ("ib1-a1", 1, 3), ("ib1-c1", 1, 1),
    ]  # fmt: skip
    assert cards[3].images == ("images/c/0-1.png",)
    assert (found.without, found.refused) == (1, 4)
    # Each redone image names the versions it replaces, oldest first; those are marked replaced (`x`).
    assert [(c.shown.get("pk"), c.shown.get("x")) for c in cards] == [
        (["ib1-a1", "ib1-a2"], None), (["ib1-a1"], 1), (None, 1), (None, None),
    ]  # fmt: skip
    # A made image's status (succeeded, or done in an earlier run) is not shown; no metadata columns.
    assert "s" not in cards[3].shown and "s" not in cards[0].shown
    assert found.columns == [] and cards[0].shown["m"] == []


def test_cards_show_the_manifests_columns_and_sit_together_by_group(tmp_path: Path) -> None:
    from imagebatch.report.review_data import ReviewError

    header = (
        "job_id,request_index,status,paths,images,model,route,idempotency_key,variant,sku,colour,season\n"
    )
    rows = [
        "a,0,succeeded,images/a/0.png,1,m,native,ib1-a,1,SKU-1,black,ss27",
        "b,0,succeeded,images/b/0.png,1,m,native,ib1-b,1,SKU-2,white,ss27",
        "c,0,succeeded,images/c/0.png,1,m,native,ib1-c,1,SKU-1,white,ss27",
        "d,0,succeeded,images/d/0.png,1,m,native,ib1-d,1,SKU-3,red,",
        "e,0,succeeded,images/e/0.png,1,m,native,ib1-e,1,SKU-2,black,ss27",
    ]
    (tmp_path / "results.csv").write_text(header + "\n".join(rows) + "\n")
    folder = FolderBackend(tmp_path)
    every = load_cards(folder)  # all the manifest's columns by default, results.csv's order
    assert every.columns == ["sku", "colour", "season"]
    assert [c.shown["m"] for c in every.cards.ordered()][:2] == [
        ["SKU-1", "black", "ss27"],
        ["SKU-2", "white", "ss27"],
    ]
    grouped = load_cards(folder, show=["colour"], group_by="sku")  # groups in order of first appearance
    assert [(c.key, c.shown["g"], c.shown["m"]) for c in grouped.cards.ordered()] == [
        ("ib1-a", "SKU-1", ["black"]), ("ib1-c", "SKU-1", ["white"]), ("ib1-b", "SKU-2", ["white"]),
        ("ib1-e", "SKU-2", ["black"]), ("ib1-d", "SKU-3", ["red"]),
    ]  # fmt: skip
    for show, group_by, flag in ((["size"], None, "--show"), (None, "Sku", "--group-by")):
        try:
            load_cards(folder, show=show, group_by=group_by)
        except ReviewError as exc:
            assert str(exc).startswith(f"{flag}: results.csv has no column ")
            assert "(its columns: sku, colour, season)" in str(exc)
        else:
            raise AssertionError(f"{flag} accepted a column results.csv does not have")


def test_only_plain_names_under_images_may_be_served() -> None:
    assert safe_name("images/job/0-abc.png")
    for name in ("/images/x.png", "images/../x.png", "images/./x.png", "images//x.png", "x.png",
                 "thumbs/x.jpg", "images\\..\\x.png", "images/x\n.png", "images/"):  # fmt: skip
        assert not safe_name(name), name


def test_the_pages_inline_data_cannot_end_its_script_element() -> None:
    import re

    from imagebatch.report.review_page import inline_json, render_page

    prompt = "a mug </script><script>alert(1)</script><!-- & more"

    page = render_page(
        "t", "token", "nonce", inline_json([{"k": "ib1-a", "p": prompt}]), {"aside": "x"}
    ).decode()
    (data,) = re.findall(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert json.loads(data) == {"cards": [{"k": "ib1-a", "p": prompt}], "aside": "x"}
    # three elements end: the data, the page's script and its live part (report/review_live.js)
    assert "<script>alert" not in page and page.count("</script>") == 3


def test_the_undo_stack_is_replayed_from_the_record_per_reviewer(tmp_path: Path) -> None:
    from imagebatch.work.decisions import History, iter_decisions

    folder = FolderBackend(tmp_path)
    for decision in (
        Decision("ib1-a", 1, "approved", reviewer="ann"),
        Decision("ib1-b", 1, "rejected", "dark", reviewer="ann"),
        Decision("ib1-b", 1, "rejected", "too dark", reviewer="ann"),  # a note changed: its own step
        Decision("ib1-a", 1, "rejected", reviewer="bob"),  # another reviewer's: not ann's to undo
        Decision("ib1-b", 1, "rejected", "dark", reviewer="ann", undo=True),  # ann's u
    ):
        record_decision(folder, decision)
    history = list(iter_decisions(folder))
    assert history[-1].undo and not history[0].undo  # kept in the record, read back
    assert b'"undo"' not in (tmp_path / REVIEW_FILE).read_bytes().splitlines()[0]  # only where true
    replayed = History()
    assert all(replayed.apply(decision) for decision in history)
    assert replayed.undo_stack("ann") == [("ib1-a", ""), ("ib1-b", "")]  # the note change taken back
    assert replayed.undo_stack("bob") == [("ib1-a", "")]
    assert replayed.in_force["ib1-b"] == history[1]  # the first rejection, as ann recorded it
    # The server's cache replays the same record, and what another server appends after
    cache = DecisionCache(folder, interval=60)
    record_decision(folder, Decision("ib1-b", 1, "cleared", reviewer="ann", undo=True))
    assert cache.undo_stack("ann") == [("ib1-a", "")]
    # A bulk approve: each decision its own line, with the batch's id, read back on the stack
    for key in ("ib1-c", "ib1-d"):
        record_decision(folder, Decision(key, 1, "approved", reviewer="ann", batch="b7"))
    assert b'"batch":"b7"' in (tmp_path / REVIEW_FILE).read_bytes().splitlines()[-1]
    assert b'"batch"' not in (tmp_path / REVIEW_FILE).read_bytes().splitlines()[0]  # only where set
    assert cache.undo_stack("ann") == [("ib1-a", ""), ("ib1-c", "b7"), ("ib1-d", "b7")]


def test_a_buckets_cache_puts_its_own_decision_in_force_and_replays_an_earlier_one_listed_later(
    s3: Any,
) -> None:
    """Its own decision is not listed again; another server's object that sorts before it (made a moment
    earlier) replays the record in the listing's order, which then decides what an undo brings back."""
    location = open_location(f"s3://{s3.bucket()}/run")
    cache = DecisionCache(location, interval=0)
    cache.record(Decision("ib1-a", 1, "approved", reviewer="alice", at="2026-01-01T00:00:01.000000Z"))
    cache.record(Decision("ib1-a", 1, "rejected", reviewer="bob", at="2026-01-01T00:00:03.000000Z"))
    assert [d.reviewer for d in cache.since(-1)[1].values()] == ["bob"]
    record_decision(
        location, Decision("ib1-a", 1, "rejected", "handle", "carol", "2026-01-01T00:00:02.000000Z")
    )
    after, refused = cache.undo("bob", "ib1-a")
    assert refused == [] and after["ib1-a"].reviewer == "carol"  # carol's came before bob's: it comes back
    assert read_decisions(location) == cache.since(-1)[1]
    after, refused = cache.undo("bob", "ib1-a")
    assert refused == ["nothing of yours to undo on this image (undone already)"]
