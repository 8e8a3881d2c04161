"""Star ratings (issue 37): 1 to 5 per image, recorded in review.jsonl with the reviewer, apart from the
decisions (never in force, never undone); the latest rating counts, whoever gave it; a hostile value is
refused when read and when posted; export.csv and `imagebatch.results()` carry a `stars` column."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest
from helpers.review import review_folder

import imagebatch
from imagebatch.delivery.export import export
from imagebatch.report.review import ReviewServer
from imagebatch.report.review_decisions import DecisionCache
from imagebatch.storage.folder import FolderBackend
from imagebatch.storage.layout import REVIEW_FILE
from imagebatch.work.decisions import (
    RATED,
    Decision,
    History,
    decided,
    parse_line,
    read_decisions,
    read_stars,
    record_decision,
)


def line(**fields: object) -> bytes:
    return json.dumps({"key": "ib1-a", "variant": 1, "reviewer": "alice", **fields}).encode()


@pytest.mark.parametrize("stars", [0, 6, -1, "5", 1e9, 4.0, True, None, [4]])
def test_a_hostile_rating_is_refused_when_read(stars: object) -> None:
    assert parse_line(line(decision=RATED, stars=stars), "review.jsonl line 1") is None


def test_a_rating_reads_back_and_old_lines_without_stars_still_read() -> None:
    rating = parse_line(line(decision=RATED, stars=4), "l")
    assert rating is not None and (rating.decision, rating.stars, rating.reviewer) == (RATED, 4, "alice")
    old = parse_line(
        b'{"key":"ib1-a","variant":1,"decision":"approved","note":"","reviewer":"bob","at":""}', "l"
    )
    assert old is not None and old.stars == 0
    # stars on a decision that is not a rating are not its own: left out
    approved = parse_line(line(decision="approved", stars=5), "l")
    assert approved is not None and approved.stars == 0


def test_ratings_stand_apart_from_decisions_and_the_latest_one_counts(tmp_path: Path) -> None:
    folder = FolderBackend(tmp_path)
    record_decision(folder, Decision("ib1-a", 1, "approved", "", "alice"))
    record_decision(folder, Decision("ib1-a", 1, RATED, "", "alice", stars=5))
    record_decision(folder, Decision("ib1-b", 1, RATED, "", "alice", stars=2))
    record_decision(folder, Decision("ib1-a", 1, RATED, "", "bob", stars=3))
    lines = (tmp_path / REVIEW_FILE).read_text().splitlines()
    assert json.loads(lines[1]) | {"at": ""} == {
        "key": "ib1-a", "variant": 1, "decision": "rated", "note": "", "reviewer": "alice", "at": "",
        "stars": 5,
    }  # fmt: skip
    assert "stars" not in json.loads(lines[0])  # a decision's line stays as it was
    assert read_stars(folder) == {"ib1-a": 3, "ib1-b": 2}  # bob's, the later
    assert {k: d.decision for k, d in read_decisions(folder).items()} == {"ib1-a": "approved"}
    assert set(decided(folder)) == {"ib1-a"}
    history = History()
    for d in [Decision("ib1-a", 1, "approved", "", "bob"), Decision("ib1-a", 1, RATED, "", "bob", stars=4)]:
        history.apply(d)
    assert history.undo_stack("bob") == [("ib1-a", "")]  # a rating is never undone by `u`
    for bad in (Decision("ib1-a", 1, RATED, stars=0), Decision("ib1-a", 1, "approved", stars=4)):
        with pytest.raises(ValueError, match="1 to 5 stars"):
            record_decision(folder, bad)


def test_the_cache_tells_a_page_of_a_rating_changed_by_another_server(tmp_path: Path) -> None:
    folder = FolderBackend(tmp_path)
    cache = DecisionCache(folder, interval=0)
    version, changed, stars = cache.changes(-1)
    assert (changed, stars) == ({}, {})
    record_decision(folder, Decision("ib1-a", 1, RATED, "", "alice", stars=4))
    later, changed, stars = cache.changes(version)
    assert later > version and changed == {} and {k: r.stars for k, r in stars.items()} == {"ib1-a": 4}
    record_decision(folder, Decision("ib1-a", 1, RATED, "", "bob", stars=1))
    assert [(r.stars, r.reviewer) for r in cache.changes(later)[2].values()] == [(1, "bob")]


def test_the_server_records_a_rating_and_refuses_a_hostile_one(tmp_path: Path) -> None:
    out = review_folder(tmp_path, requests=3, redone=None)
    with ReviewServer(FolderBackend(out), "alice") as server:
        key = next(iter(server.cards))
        for stars in (0, 6, "5", 1e9, 4.5, True, None):
            status, answer = server.decide({"key": key, "decision": RATED, "stars": stars})
            assert status == 400 and "1 to 5" in answer["error"], stars
        status, answer = server.decide({"key": key, "decision": "approved", "stars": 5})
        assert status == 400 and "rated" in answer["error"]
        assert not (out / REVIEW_FILE).exists()  # nothing written by a refusal
        status, answer = server.decide({"key": key, "decision": RATED, "stars": 4}, who="bob")
        assert (status, answer["stars"]) == (200, [4, "bob"])
        assert server.changes(-1)["stars"] == {key: [4, "bob"]}
        assert server.changes(-1)["decisions"] == {}  # not a decision


def test_export_csv_and_results_carry_the_stars(tmp_path: Path) -> None:
    out = review_folder(tmp_path, requests=3, redone=None)
    with (out / "results.csv").open(newline="") as fh:
        keys = [row["idempotency_key"] for row in csv.DictReader(fh) if row["status"] == "succeeded"]
    folder = FolderBackend(out)
    record_decision(folder, Decision(keys[0], 1, "approved", "", "alice"))
    record_decision(folder, Decision(keys[0], 1, RATED, "", "alice", stars=5))
    record_decision(folder, Decision(keys[0], 1, RATED, "", "bob", stars=2))
    record_decision(folder, Decision(keys[1], 1, RATED, "", "carol", stars=4))
    export(str(out), str(tmp_path / "dest"))
    with (tmp_path / "dest" / "export.csv").open(newline="") as fh:
        rows = {row["idempotency_key"]: row for row in csv.DictReader(fh)}
    assert [rows[k]["stars"] for k in keys] == ["2", "4", ""]
    assert (rows[keys[0]]["decision"], rows[keys[1]]["decision"]) == ("approved", "")
    decisions = imagebatch.results(out).decisions.set_index("key")
    assert decisions.loc[keys[0], "stars"] == 2 and decisions.loc[keys[0], "decision"] == "approved"
    assert decisions.loc[keys[1], "stars"] == 4 and pd.isna(decisions.loc[keys[1], "decision"])
    assert keys[2] not in decisions.index
