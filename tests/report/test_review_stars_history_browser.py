"""A changed row's history and the star rating (issue 37), in a real headless Chromium at 1440 x 900
(Debian's, through Selenium and its chromedriver): the image approved for a row's earlier prompt beside its
new request, on the card and in the large view; stars given by key, shown, filtered (in the address), the
latest rating counting, and the large view's own keys left as they were."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.review import (
    approved_before,
    chromium,
    js,
    open_page,
    press,
    review_folder,
    select,
    until,
)
from helpers.runs import read_jsonl
from selenium.webdriver.support.ui import Select

from imagebatch.report.review import ReviewServer
from imagebatch.storage.folder import FolderBackend
from imagebatch.work.decisions import RATED, Decision, record_decision

BEFORE = "approved before, for the earlier prompt"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = chromium(tmp_path_factory.mktemp("chromium"), 1440, 900)
    yield driver
    driver.quit()


def test_a_changed_row_shows_the_image_approved_for_its_earlier_prompt(browser: Any, tmp_path: Path) -> None:
    out = review_folder(tmp_path, requests=6, redone=None)
    earlier = approved_before(tmp_path, out, "p002", reviewer="maria")
    with ReviewServer(FolderBackend(out), "carol") as server:
        order = open_page(browser, server.url)
        key = next(k for k, card in server.cards.items() if card.shown["t"] == "p002")
        card = f".card[data-key='{key}']"
        # On the card: its own image, and beside it the one approved before, labelled
        thumbs = js(browser, f'[...document.querySelectorAll("{card} .media img")].map(i => i.src)')
        assert [t.split("/")[-2:] for t in thumbs] == [[key, "0"], [earlier, "0"]]
        assert js(browser, f'document.querySelector("{card} .media .tag").textContent') == "approved before"
        assert browser.find_element("css selector", f"{card} .earlier").text == f"{BEFORE} (by maria)"
        loaded = f'document.querySelector("{card} a.before img").naturalWidth'
        until(browser, lambda d: js(d, loaded) > 0, "the earlier image's thumbnail")
        # Only that row's card has it
        assert len(browser.find_elements("css selector", ".card .earlier")) == 1
        assert order.index(key) == 2
        # In the large view: a pane of its own, the image loaded, beside the card's
        select(browser, key)
        press(browser, "v")
        until(browser, lambda d: js(d, "document.body.dataset.viewing") == key, "the large view")
        captions = js(browser, "[...document.querySelectorAll('#vpanes .vcap')].map(e => e.innerText)")
        assert captions == ["variant 1 (this card) · unreviewed", f"{BEFORE} (by maria)"]
        img = "document.querySelector('#vpanes .before img')"
        until(browser, lambda d: js(d, f"{img}.complete && {img}.naturalWidth") == 256, "the earlier image")
        assert js(browser, f"{img}.src").endswith(f"/image/{earlier}/0")
        press(browser, "j")  # the next card has no history: no such pane
        until(browser, lambda d: js(d, "document.body.dataset.viewing") == order[3], "the next card")
        assert not browser.find_elements("css selector", "#vpanes .before")
        press(browser, "\ue00c")


def stars_of(browser: Any) -> dict[str, str]:
    script = "[...document.querySelectorAll('.card')].map(c => [c.dataset.key, c.querySelector('.stars')])"
    return {key: "" if e is None else e.text for key, e in js(browser, script)}


def view_keys(browser: Any) -> list[str]:
    return list(js(browser, "view.map(i => cards[i].k)"))


def test_stars_by_key_shown_filtered_in_the_address_and_the_latest_rating_counts(
    browser: Any, tmp_path: Path
) -> None:
    out = review_folder(tmp_path, requests=6, redone=None)
    with ReviewServer(FolderBackend(out), "carol", refresh_interval=0) as server:
        order = open_page(browser, server.url)
        for n, keys in enumerate(("5", "j3", "j4", "j1")):
            press(browser, keys)
            until(
                browser, lambda d, n=n: js(d, "document.body.dataset.rated") == str(n + 1), f"rating {n + 1}"
            )
        # A rating does not move the selection, nor decide
        assert js(browser, "document.querySelector('.card.sel').dataset.key") == order[3]
        assert not (out / "review.jsonl").read_text().count('"approved"')
        lines = read_jsonl(out / "review.jsonl")
        assert [(d["key"], d["decision"], d["stars"], d["reviewer"]) for d in lines] == [
            (order[0], "rated", 5, "carol"), (order[1], "rated", 3, "carol"),
            (order[2], "rated", 4, "carol"), (order[3], "rated", 1, "carol"),
        ]  # fmt: skip
        shown = stars_of(browser)
        assert [shown[k] for k in order[:5]] == ["★★★★★", "★★★☆☆", "★★★★☆", "★☆☆☆☆", ""]
        # The filter: at least 4 stars, kept in the address; a reload of that address shows the same
        Select(browser.find_element("id", "starfilter")).select_by_value("4")
        until(browser, lambda d: view_keys(d) == [order[0], order[2]], "four stars or more")
        assert "stars=4" in browser.current_url
        browser.refresh()
        until(browser, lambda d: js(d, "document.body.dataset.ready") == "1", "reloaded")
        assert view_keys(browser) == [order[0], order[2]]
        # Another reviewer's later rating counts (the last, as for decisions), and reaches this page
        record_decision(FolderBackend(out), Decision(order[0], 1, RATED, "", "bob", stars=2))
        browser.execute_script("window.dispatchEvent(new Event('focus'))")
        until(browser, lambda d: view_keys(d) == [order[2]], "bob's rating")
        Select(browser.find_element("id", "starfilter")).select_by_value("none")
        until(browser, lambda d: view_keys(d) == order[4:], "unrated")
        Select(browser.find_element("id", "starfilter")).select_by_value("")
        until(browser, lambda d: len(view_keys(d)) == len(order), "every card")
        title = js(browser, f"document.querySelector(`.card[data-key='{order[0]}'] .stars`).title")
        assert title == "2 of 5 stars by bob (keys 1-5)"
        # In the large view, 1 is still 100 %, and 2-5 do nothing
        select(browser, order[5])
        press(browser, "v")
        until(browser, lambda d: js(d, "document.body.dataset.viewing") == order[5], "the large view")
        press(browser, "41")
        until(browser, lambda d: js(d, "document.body.dataset.zoom") == "1", "100 %")
        press(browser, "\ue00c")
        assert stars_of(browser)[order[5]] == "" and len(read_jsonl(out / "review.jsonl")) == 5
