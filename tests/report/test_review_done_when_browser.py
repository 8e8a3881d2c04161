"""Issue 37's "Done when", each item driven in a real headless Chromium at 1440 x 900 (Debian's, through
Selenium and its chromedriver) on one 10,000-card catalog set, written once for the module by the project's
own writers (`helpers.review.catalog_folder`): the reference beside the image in the large view; a note
saved on the card it was typed on in both orders, and as a comment without a decision; one SKU found in
under 200 ms; a column filter and "mark all shown" approving exactly what is shown; two reviewers with
their own tokens on `--host 127.0.0.2` seeing each other's decisions within 5 s, a request without a token
refused; a 3-candidate job picked in one key and export delivering the pick only; report.html reflecting a
decision within a minute; compact density showing at least 20 cards.

The tests share the set and, but for the team's and the report's, one server: each works on cards of its
own (its own SKUs, found by the search) and checks what changed, not the whole record."""

from __future__ import annotations

import csv
import re
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.review import (
    CANDIDATES,
    catalog_folder,
    chromium,
    js,
    open_page,
    press,
    recorded,
    request,
    saved,
    until,
)

from imagebatch.delivery.export import export
from imagebatch.delivery.options import ExportOptions
from imagebatch.report import build_report
from imagebatch.report.review import ReviewServer
from imagebatch.storage.folder import FolderBackend
from imagebatch.work.decisions import decided

pytestmark = pytest.mark.slow
CARDS = 10_000
TEAM = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef"}
LIVE = 5.0
"""Seconds within which one reviewer's page shows the other's decision (the issue's bound)."""
SEARCH_MS = 200.0
"""The issue's bound on finding one SKU among the cards."""
REPORT_WITHIN = 60.0
"""The issue's bound on report.html reflecting a decision."""


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return catalog_folder(tmp_path_factory.mktemp("catalog"), CARDS)


@pytest.fixture(scope="module")
def server(big: Path) -> Iterator[ReviewServer]:
    with ReviewServer(FolderBackend(big), "carol", refresh_interval=0) as running:
        yield running


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = chromium(tmp_path_factory.mktemp("chromium"), 1440, 900)
    yield driver
    driver.quit()


def show(browser: Any, url: str, view: str) -> list[str]:
    """The page at `url` with the view `view` in its address (`q=SKU-10001`): the keys shown, in order.
    The count of decisions saved starts again at 0 (a fresh page)."""
    browser.get("about:blank")
    open_page(browser, f"{url}#{view}")
    return list(js(browser, "view.map(i => cards[i].k)"))


def titles(browser: Any) -> list[str]:
    return list(js(browser, "view.map(i => cards[i].t)"))


def test_the_large_view_shows_the_reference_beside_the_image(browser: Any, server: ReviewServer) -> None:
    keys = show(browser, server.url, "q=p04321")
    assert len(js(browser, "cards")) == CARDS and len(keys) == 1
    press(browser, "v")
    until(browser, lambda d: js(d, "document.body.dataset.viewing") == keys[0], "the large view")
    captions = js(browser, "[...document.querySelectorAll('#vpanes .vcap')].map(e => e.innerText)")
    assert captions == ["variant 1 (this card) · unreviewed", "reference 1, the request's"]
    ref, img = "document.querySelector('#vpanes .ref img')", "document.querySelector('#vpanes .now img')"
    until(browser, lambda d: js(d, f"{ref}.naturalWidth > 0 && {img}.naturalWidth > 0"), "both loaded")
    until(browser, lambda d: js(d, f"{ref}.clientWidth === {img}.clientWidth"), "drawn at the image's size")
    assert js(browser, f"{ref}.getBoundingClientRect().left > {img}.getBoundingClientRect().right")
    press(browser, "\ue00c")


def test_a_note_stays_on_the_card_it_was_typed_on_in_either_order(browser: Any, server: ReviewServer) -> None:
    keys = show(browser, server.url, "q=SKU-12000")  # three colourways
    assert titles(browser) == ["p06000", "p06001", "p06002"]
    out = server.location.root
    before = len(recorded(out)) if (out / "review.jsonl").exists() else 0
    press(browser, "r")  # r then n: the note is the rejected card's, not the next one's
    saved(browser, 1)
    press(browser, "n")
    assert browser.find_element("id", "notefor").text == "p06000"
    press(browser, "handle missing\n")
    saved(browser, 2)
    press(browser, "n")  # n then r, on the second card: a comment at once, which the rejection carries
    assert browser.find_element("id", "notefor").text == "p06001"
    press(browser, "too dark\n")
    saved(browser, 3)
    press(browser, "r")
    saved(browser, 4)
    press(browser, "jn")  # and a note on the third card, never decided (`j` first: not the card just decided)
    assert browser.find_element("id", "notefor").text == "p06002"
    press(browser, "is the strap right?\n")
    saved(browser, 5)
    assert [r[:4] for r in recorded(out)[before:]] == [
        (keys[0], 1, "rejected", ""), (keys[0], 1, "rejected", "handle missing"),
        (keys[1], 1, "comment", "too dark"), (keys[1], 1, "rejected", "too dark"),
        (keys[2], 1, "comment", "is the strap right?"),
    ]  # fmt: skip
    line = "document.querySelector(`.card[data-key='${arguments[0]}'] .rv`).textContent"
    until(
        browser, lambda d: js(d, line, keys[2]) == "unreviewed · comment by carol: is the strap right?", "it"
    )


SEARCH = (
    "(() => { const box = document.getElementById('search'); box.value = arguments[0];"
    " box.dispatchEvent(new Event('input'));"
    " return [+document.body.dataset.searchMs, view.map(i => cards[i].m[0])]; })()"
)
"""A SKU pasted into the search box: the page's own time from the input to the cards laid out, and the
SKUs then shown."""


def test_a_sku_is_found_in_under_200_ms(browser: Any, server: ReviewServer) -> None:
    show(browser, server.url, "")
    until(browser, lambda d: js(d, "hay !== null"), "the search's text made")  # 50 ms after the first cards
    took = []
    for sku in ("SKU-10042", "SKU-11717", "SKU-13300"):
        found = js(browser, SEARCH, sku)
        took.append(found[0])
        assert found[1] == [sku] * 3, sku
        assert js(browser, "document.querySelectorAll('.card').length") == 3
    assert statistics.median(took) < SEARCH_MS, took


def test_a_column_filter_and_mark_all_shown_approve_exactly_what_is_shown(
    browser: Any, server: ReviewServer
) -> None:
    folder = FolderBackend(server.location.root)
    before = {k for k, d in decided(folder).items() if d.decision == "approved"}
    keys = show(browser, server.url, "q=SKU-1001&c.colour=sand")  # SKU-10010 to SKU-10019, sand only
    assert 3 <= len(keys) <= 10
    shown = js(browser, "view.map(i => [cards[i].m[0], cards[i].m[2]])")
    assert all(sku.startswith("SKU-1001") and colour == "sand" for sku, colour in shown)
    press(browser, "X")
    assert browser.find_element("id", "nmarked").text == f"{len(keys)} marked"
    press(browser, "A")
    saved(browser, len(keys))
    after = {k for k, d in decided(folder).items() if d.decision == "approved"}
    assert after - before == set(keys)


def test_two_reviewers_with_their_own_tokens_see_each_others_decisions_within_5_s(
    browser: Any, big: Path, tmp_path: Path
) -> None:
    bob = chromium(tmp_path / "chromium-bob", 1440, 900)
    try:
        with ReviewServer(FolderBackend(big), "host", host="127.0.0.2", reviewers=TEAM) as team:
            status, body = request(team.url, path="/api/changes?since=-1", headers={"Host": team.url[7:-1]})
            assert status == 401 and b"decisions" not in body  # no token: refused, nothing of the review
            browser.delete_all_cookies()
            browser.get(team.url)
            assert "needs a reviewer's sign-in link" in browser.find_element("tag name", "body").text
            pages = {"alice": browser, "bob": bob}
            for name, page in pages.items():
                open_page(page, f"{team.url}?token={TEAM[name]}#q=SKU-12500")
            first, second = js(browser, "view.map(i => cards[i].k)")[:2]
            line = "document.querySelector(`.card[data-key='${arguments[0]}'] .rv`).textContent"
            press(browser, "a")
            saved(browser, 1)
            until_within(bob, lambda d: js(d, line, first) == "approved by alice", LIVE, "alice's, at bob's")
            press(bob, "jr")
            saved(bob, 1)
            until_within(
                browser, lambda d: js(d, line, second) == "rejected by bob", LIVE, "bob's, at alice's"
            )
            assert team.refused >= 2
    finally:
        bob.quit()
        browser.delete_all_cookies()


def until_within(browser: Any, check: Any, bound: float, what: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, bound, poll_frequency=0.05).until(check, message=what)


def test_a_3_candidate_job_is_picked_in_one_key_and_export_delivers_the_pick_only(
    browser: Any, server: ReviewServer, tmp_path: Path
) -> None:
    keys = show(browser, server.url, f"q={CANDIDATES}")
    assert titles(browser) == [f"{CANDIDATES} request {n}" for n in (1, 2, 3)]
    press(browser, "jp")  # the second candidate: picked, the two others not chosen
    saved(browser, 3)
    folder = FolderBackend(server.location.root)
    assert {k: decided(folder)[k].decision for k in keys} == {
        keys[0]: "not_chosen",
        keys[1]: "approved",
        keys[2]: "not_chosen",
    }
    dest = tmp_path / "dest"
    export(str(server.location.root), str(dest), ExportOptions(approved_only=True))
    with (dest / "export.csv").open(newline="") as fh:
        rows = [row for row in csv.DictReader(fh) if row["job_id"] == CANDIDATES]
    assert [(row["idempotency_key"], row["status"]) for row in rows if row["status"] == "delivered"] == [
        (keys[1], "delivered")
    ]
    assert len([p for p in dest.rglob("*.png") if CANDIDATES in str(p)]) <= 1


def test_report_html_reflects_a_decision_within_a_minute(browser: Any, big: Path) -> None:
    with ReviewServer(
        FolderBackend(big), "dana", refresh_interval=0, rebuild=lambda: build_report(big), report_interval=1.0
    ) as keeper:
        open_page(browser, f"{keeper.url}#q=p09876")
        press(browser, "a")
        saved(browser, 1)
        card = re.compile(r'<div class="id">p09876 .*?<div class="rv rv-(\w+)">([^<]*)', re.DOTALL)

        def reflected(_: Any) -> bool:
            pages = sorted(big.glob("report*.html"))
            found = [m for page in pages if (m := card.search(page.read_text()))]
            return bool(found) and found[0].groups() == ("approved", "approved by dana")

        until_within(browser, reflected, REPORT_WITHIN, "report.html says approved")


def test_compact_density_shows_at_least_20_cards(browser: Any, server: ReviewServer) -> None:
    show(browser, server.url, "")
    visible = (
        "[...document.querySelectorAll('.card')].filter(c => { const r = c.getBoundingClientRect();"
        " return r.top >= document.querySelector('header').offsetHeight && r.bottom <= innerHeight"
        " && r.right <= innerWidth }).length"
    )
    if js(browser, "document.body.classList.contains('compact')"):
        press(browser, "d")
    assert js(browser, visible) < 20
    press(browser, "d")
    until(browser, lambda d: js(d, "document.body.classList.contains('compact')"), "compact")
    assert js(browser, visible) >= 20
    press(browser, "d")  # back to comfortable, kept in this browser for the next test
