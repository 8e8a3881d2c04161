"""Two reviewers, two Chromium sessions (Debian's, through Selenium), one `review --host 127.0.0.2` with a
token each: a browser without one is refused, a sign-in link's token is exchanged for a cookie and gone
from the address bar, each sees the other's decisions within 5 s without a reload, and the card shows
their disagreement."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.review import chromium, open_page, press, recorded, review_folder, saved

from imagebatch.report.review import ReviewServer
from imagebatch.storage.folder import FolderBackend

pytestmark = pytest.mark.slow
TEAM = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef"}
LIVE = 5.0
"""Seconds within which one reviewer's page shows the other's decision (the page polls every 2 s)."""


@pytest.fixture(scope="module")
def browsers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """alice's and bob's browsers: two profiles, so two cookie jars."""
    running: dict[str, Any] = {}
    try:
        for name in TEAM:
            running[name] = chromium(tmp_path_factory.mktemp(f"chromium-{name}"))
        yield running
    finally:
        for driver in running.values():
            driver.quit()


@pytest.fixture
def team(tmp_path: Path) -> Iterator[tuple[ReviewServer, Path]]:
    out = review_folder(tmp_path, requests=4, redone=None)
    with ReviewServer(
        FolderBackend(out), "host", host="127.0.0.2", reviewers=TEAM, refresh_interval=0
    ) as server:
        yield server, out


def within(browser: Any, check: Any, what: str, bound: float) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, bound, poll_frequency=0.05).until(check, message=what)


def card_line(browser: Any, key: str, selector: str) -> str:
    return str(
        browser.execute_script(
            'const c = document.querySelector(`.card[data-key="${arguments[0]}"] ${arguments[1]}`);'
            "return c ? c.textContent : '';",
            key,
            selector,
        )
    )


def test_two_reviewers_see_each_others_decisions_and_their_conflict(
    browsers: dict[str, Any], team: tuple[ReviewServer, Path]
) -> None:
    server, out = team
    alice, bob = browsers["alice"], browsers["bob"]
    for browser in (alice, bob):  # no token, no page: the sign-in refusal, nothing of the review
        browser.delete_all_cookies()
        browser.get(server.url)
        assert "needs a reviewer's sign-in link" in browser.find_element("tag name", "body").text
        assert browser.execute_script("return document.getElementById('data')") is None
    keys = []
    for name, browser in browsers.items():
        keys = open_page(browser, f"{server.url}?token={TEAM[name]}")
        assert browser.current_url == server.url  # the token is gone from the address bar
        assert browser.find_element("id", "reviewer").get_attribute("value") == name
        assert browser.execute_script("return document.cookie") == ""  # HttpOnly: no script reads it
    first = keys[0]

    press(alice, "a")  # alice approves the first card
    saved(alice, 1)
    within(
        bob, lambda d: card_line(d, first, ".rv").startswith("approved by alice"), "alice's approval", LIVE
    )

    press(bob, "r")  # bob rejects the same card: his decision is in force, and both are on the card
    saved(bob, 1)
    conflict = "alice approved, bob rejected"
    within(alice, lambda d: card_line(d, first, ".rv").startswith("rejected by bob"), "bob's rejection", LIVE)
    within(alice, lambda d: card_line(d, first, ".views.conflict") == conflict, "the conflict", LIVE)
    within(bob, lambda d: card_line(d, first, ".views.conflict") == conflict, "the conflict", LIVE)
    assert [(r[2], r[4]) for r in recorded(out)] == [("approved", "alice"), ("rejected", "bob")]
    assert server.refused >= 2  # the two browsers without a token
