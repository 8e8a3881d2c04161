"""A changed row's history and the star rating (issue 37), in a real headless Chromium at 1440 x 900
(Debian's, through Selenium and its chromedriver): the image approved for a row's earlier prompt beside its
new request, on the card and in the large view."""

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

from imagebatch.report.review import ReviewServer
from imagebatch.storage.location import LocalFolder

BEFORE = "approved before, for the earlier prompt"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = chromium(tmp_path_factory.mktemp("chromium"), 1440, 900)
    yield driver
    driver.quit()


def test_a_changed_row_shows_the_image_approved_for_its_earlier_prompt(browser: Any, tmp_path: Path) -> None:
    out = review_folder(tmp_path, requests=6, redone=None)
    earlier = approved_before(tmp_path, out, "p002", reviewer="maria")
    with ReviewServer(LocalFolder(out), "carol") as server:
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
