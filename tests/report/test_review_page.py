"""The review page as one person culls with it (issue 37), in a real headless Chromium at 1440 x 900: the
reference beside the image in the large view, notes that stay on the card they were typed on (and a note
without a decision saved as a comment), search and filters kept in the address, and compact cards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.review import chromium, open_page, press, recorded, review_folder, saved, shown, until

from imagebatch.report.review import ReviewServer
from imagebatch.storage.folder import FolderBackend
from imagebatch.work.decisions import Decision, History, decided, read_decisions, record_decision


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = chromium(tmp_path_factory.mktemp("chromium"), 1440, 900)
    yield driver
    driver.quit()


def js(browser: Any, script: str, *args: Any) -> Any:
    return browser.execute_script("return " + script, *args)


def viewing(browser: Any, key: str) -> None:
    until(browser, lambda d: js(d, "document.body.dataset.viewing") == key, "the large view")


def test_the_large_view_shows_the_reference_beside_the_image_at_its_size_zoomed_and_panned_with_it(
    browser: Any, tmp_path: Path
) -> None:
    out = review_folder(tmp_path, requests=3, redone=None, references=True, side=1600)
    with ReviewServer(FolderBackend(out), "alice") as server:
        order = open_page(browser, server.url)
        # The card's reference thumbnail opens the large view, the reference beside the image
        browser.find_element("css selector", f".card[data-key='{order[1]}'] .refs img").click()
        viewing(browser, order[1])
        img, ref = "document.querySelector('#vpanes .now img')", "document.querySelector('#vpanes .ref img')"
        loaded = f"{img}.complete && {img}.naturalWidth && {ref}.complete && {ref}.naturalWidth"
        until(browser, lambda d: js(d, loaded), "both loaded")
        assert js(browser, f"{ref}.naturalWidth") == 256  # the report's thumbnail of the manifest's file
        size = f"[{img}.clientWidth, {img}.clientHeight, {ref}.clientWidth, {ref}.clientHeight]"
        width, height, ref_width, ref_height = js(browser, size)
        assert 300 < width < 800 and (ref_width, ref_height) == (width, height)  # fit: the same size
        caption = js(browser, "document.querySelector('#vpanes .ref .vcap').innerText")
        assert caption == "reference 1, the request's"
        press(browser, "1")  # the image's own pixels: the reference drawn as large, and panned with it
        assert js(browser, size) == [1600, 1600, 1600, 1600]
        browser.execute_script(
            "const b = document.querySelector('#vpanes .now .vbox'); b.scrollLeft = 300; b.scrollTop = 200"
        )
        box = "document.querySelector('#vpanes .ref .vbox')"
        scrolled = f"[{box}.scrollLeft, {box}.scrollTop]"
        until(browser, lambda d: js(d, scrolled) == [300, 200], "panned together")
        press(browser, "+")
        assert js(browser, size) == [2000, 2000, 2000, 2000]
        press(browser, "j")  # the next card brings its own reference
        viewing(browser, order[2])
        assert js(browser, f"{ref}.src").endswith(f"/ref/{order[2]}/0")


def test_a_note_stays_on_the_card_it_was_typed_on_whatever_the_order_of_keys(
    browser: Any, tmp_path: Path
) -> None:
    out = review_folder(tmp_path, requests=6, redone=None)
    with ReviewServer(FolderBackend(out), "alice") as server:
        order = open_page(browser, server.url)
        # r then n: the note is the rejected card's (the next one is selected by then), never the next's
        press(browser, "r")
        press(browser, "n")
        until(browser, lambda d: d.find_element("id", "notebar").is_displayed(), "the note bar")
        assert browser.find_element("id", "notefor").text == "p000"
        press(browser, "handle missing\n")
        saved(browser, 2)
        assert recorded(out) == [
            (order[0], 1, "rejected", "", "alice"),
            (order[0], 1, "rejected", "handle missing", "alice"),
        ]
        assert shown(browser)[order[1]] == ("", "unreviewed")
        assert js(browser, "document.querySelector('.card.sel').dataset.key") == order[1]
        # n then r: the note typed before the decision is saved at once, as a comment, and the rejection
        # carries it
        press(browser, "n")
        assert browser.find_element("id", "notefor").text == "p001"
        press(browser, "too dark\n")
        saved(browser, 3)
        assert recorded(out)[-1] == (order[1], 1, "comment", "too dark", "alice")
        assert shown(browser)[order[1]] == ("", "unreviewed · comment by alice: too dark")
        press(browser, "r")
        saved(browser, 4)
        assert recorded(out)[-1] == (order[1], 1, "rejected", "too dark", "alice")
        # a move between a decision and `n`: the note is the selected card's
        press(browser, "k")
        press(browser, "j")
        press(browser, "n")
        assert browser.find_element("id", "notefor").text == "p002"
        press(browser, "lovely, keep for later\n")  # a comment, no decision: shown to everyone
        saved(browser, 5)
        browser.refresh()
        order = open_page(browser, server.url)
        cards = shown(browser)
        assert cards[order[2]] == ("", "unreviewed · comment by alice: lovely, keep for later")
        assert cards[order[1]] == ("rejected", "rejected by alice: too dark")
        assert cards[order[0]] == ("rejected", "rejected by alice: handle missing")
        assert browser.find_element("id", "count").text == "2 of 6 reviewed"
    # the comment is not a decision: nothing is redone or delivered for it
    assert set(decided(FolderBackend(out))) == {order[0], order[1]}
    assert read_decisions(FolderBackend(out))[order[2]].decision == "comment"


def test_a_comment_never_changes_the_decision_in_force_and_comes_back_when_an_undo_empties_it() -> None:
    history = History()
    for decision in (
        Decision("k1", 1, "comment", "check the handle", "bob"),
        Decision("k2", 1, "approved", "", "alice"),
        Decision("k2", 1, "comment", "second choice", "bob"),  # over an approval: it stays approved
        Decision("k1", 1, "rejected", "check the handle", "alice"),
    ):
        history.apply(decision)
    assert (history.in_force["k2"].decision, history.in_force["k2"].note) == ("approved", "")
    assert history.undo_stack("bob") == []  # a comment is not undone by `u`
    undo = history.undo("k1", "alice")
    assert (undo.decision, undo.note) == ("comment", "check the handle")  # the line says what comes back
    history.apply(undo)
    assert (history.in_force["k1"].decision, history.in_force["k1"].note) == ("comment", "check the handle")


def test_a_comment_on_a_decided_image_written_by_another_server_leaves_it_decided(tmp_path: Path) -> None:
    folder = FolderBackend(tmp_path)
    record_decision(folder, Decision("k1", 1, "rejected", "too dark", "alice"))
    record_decision(folder, Decision("k1", 1, "comment", "agreed", "bob"))
    assert (decided(folder)["k1"].decision, decided(folder)["k1"].note) == ("rejected", "too dark")


def test_search_and_column_filters_are_in_the_address_and_select_all_shown_approves_exactly_those(
    browser: Any, tmp_path: Path
) -> None:
    out = review_folder(tmp_path, requests=36, redone=None)  # SKU-1000..1017, two colourways each
    with ReviewServer(FolderBackend(out), "alice") as server:
        order = open_page(browser, server.url)
        search = browser.find_element("id", "search")
        search.send_keys("sku-1013")  # any case; found in the page's data, not in the document
        until(browser, lambda d: d.find_element("id", "shown").text == "2 shown", "the search")
        assert set(shown(browser)) == {order[26], order[27]}
        assert float(js(browser, "document.body.dataset.searchMs")) < 200
        assert js(browser, "location.hash") == "#q=sku-1013"
        search.clear()
        search.send_keys("p035")  # the row's id
        until(browser, lambda d: list(shown(d)) == [order[35]], "the id")
        search.clear()
        search.send_keys("\n")
        # A column filter (a list of its values) with the state filter: combined, and in the address
        from selenium.webdriver.support.ui import Select

        colour = browser.find_element("css selector", "#colfilters select[data-col='2']")
        Select(colour).select_by_value("sand")
        until(browser, lambda d: d.find_element("id", "shown").text == "6 shown", "colour sand")
        sand = [order[i] for i in range(2, 36, 6)]
        assert js(browser, "location.hash") == "#c.colour=sand"
        browser.find_element("id", "markshown").click()  # select all shown, then one bulk approve
        assert browser.find_element("id", "nmarked").text == "6 marked"
        press(browser, "A")
        saved(browser, 6)
        assert sorted(key for key, _, kind, _, _ in recorded(out) if kind == "approved") == sorted(sand)
        Select(browser.find_element("id", "filter")).select_by_value("open")
        until(browser, lambda d: d.find_element("id", "shown").text == "0 shown", "open and sand")
        assert js(browser, "location.hash") == "#filter=open&c.colour=sand"
        # The address is the view: loaded elsewhere (a shared link), the same cards
        url = js(browser, "location.href")
        browser.get(server.url)
        browser.get(url.replace("c.colour=sand", "c.colour=burgundy"))
        until(browser, lambda d: d.execute_script("return document.body.dataset.ready") == "1", "ready")
        assert browser.find_element("id", "shown").text == "6 shown"
        assert set(shown(browser)) == {order[i] for i in range(4, 36, 6)}
        assert Select(browser.find_element("id", "filter")).first_selected_option.text == "open (to judge)"
        press(browser, "u")  # the bulk approve undone as one
        saved(browser, 6)
        assert [kind for _, _, kind, _, _ in recorded(out)[-6:]] == ["cleared"] * 6


def test_compact_cards_fit_twenty_a_screen_and_show_every_shown_value_in_full(
    browser: Any, tmp_path: Path
) -> None:
    out = review_folder(tmp_path, requests=40, redone=3)
    long = "Color Eggshell White with a brushed graphite handle and a matte glaze"
    results = out / "results.csv"
    results.write_text(results.read_text().replace("burgundy", long))
    with ReviewServer(FolderBackend(out), "alice", show=["sku", "colour"]) as server:
        order = open_page(browser, server.url)
        visible = (
            "[...document.querySelectorAll('.card')].filter(c => { const r = c.getBoundingClientRect();"
            " return r.top >= document.querySelector('header').offsetHeight && r.bottom <= innerHeight"
            " && r.right <= innerWidth }).length"
        )
        assert js(browser, visible) < 20
        press(browser, "d")
        until(browser, lambda d: js(d, "document.body.classList.contains('compact')"), "compact")
        assert js(browser, visible) >= 20
        # every shown column's value whole, inside its card, in both densities
        inside = (
            "[...document.querySelectorAll('.card')].every(c => { const m = c.querySelector('.cols');"
            " return m.scrollHeight <= m.clientHeight + 1 && m.getBoundingClientRect().bottom"
            " <= c.querySelector('.rv').getBoundingClientRect().top + 1 })"
        )
        cols = "document.querySelector(`.card[data-key='${arguments[0]}'] .cols`).innerText"
        assert long in js(browser, cols, order[5])
        assert js(browser, inside)
        browser.refresh()  # the density is kept
        open_page(browser, server.url)
        assert js(browser, "document.body.classList.contains('compact')")
        press(browser, "d")
        assert js(browser, inside)
        # the labels say what happened: a variant of how many, no "#0", no status for a made image
        ident = "[...document.querySelector(`.card[data-key='${arguments[0]}'] .id`).children]"
        ident += ".map(e => e.innerText)"
        assert js(browser, ident, order[3]) == ["variant 2 of 2", "p003"]
        assert js(browser, ident, order[4]) == ["variant 1 of 2", "p003"]
        assert js(browser, ident, order[0]) == ["p000"]
        # and the large view's header says the long value in full
        select_key = "document.querySelector(`.card[data-key='${arguments[0]}'] .id`).click()"
        browser.execute_script(select_key, order[5])
        press(browser, "v")
        viewing(browser, order[5])
        assert long in browser.find_element("id", "vcols").text
        press(browser, "\ue00c")


def test_another_scripts_news_of_a_decision_re_renders_the_card_and_the_counts(
    browser: Any, tmp_path: Path
) -> None:
    out = review_folder(tmp_path, requests=4, redone=None)
    with ReviewServer(FolderBackend(out), "alice") as server:
        order = open_page(browser, server.url)
        news = {"decision": "rejected", "note": "wrong colour", "reviewer": "bob", "at": ""}
        browser.execute_script("window.reviewApplyDecision(arguments[0], arguments[1])", order[1], news)
        until(browser, lambda d: shown(d)[order[1]] == ("rejected", "rejected by bob: wrong colour"), "bob's")
        assert browser.find_element("id", "count").text == "1 of 4 reviewed"
        browser.execute_script("window.reviewApplyDecision(arguments[0], null)", order[1])
        until(browser, lambda d: shown(d)[order[1]] == ("", "unreviewed"), "taken back")


def test_a_pick_among_a_jobs_candidates_approves_one_and_export_delivers_only_it(
    browser: Any, tmp_path: Path
) -> None:
    from imagebatch.delivery.export import export
    from imagebatch.delivery.options import ExportOptions

    out = review_folder(tmp_path, requests=2, redone=None, count=3)  # p000 and p001, three candidates each
    with ReviewServer(FolderBackend(out), "alice") as server:
        order = open_page(browser, server.url)
        title = "document.querySelector(`.card[data-key='${arguments[0]}'] .id .t`).textContent"
        assert [js(browser, title, k) for k in order[:3]] == [
            "p000 request 1",
            "p000 request 2",
            "p000 request 3",
        ]
        press(browser, "s")  # the survey: the job's candidates side by side, large
        viewing(browser, order[0])
        captions = "[...document.querySelectorAll('#vpanes .vcap')].map(e => e.innerText)"
        assert js(browser, captions) == [
            "p000 request 1 (this card) · unreviewed",
            "p000 request 2 · unreviewed",
            "p000 request 3 · unreviewed",
        ]
        press(browser, "j")  # the next candidate, in the same survey
        viewing(browser, order[1])
        assert js(browser, "document.querySelector('#vpanes .now .vcap').innerText").startswith(
            "p000 request 2"
        )
        press(browser, "p")  # picked: one key
        saved(browser, 3)
        assert sorted((key, kind) for key, _, kind, _, _ in recorded(out)) == sorted(
            [(order[0], "not_chosen"), (order[1], "approved"), (order[2], "not_chosen")]
        )
        until(browser, lambda d: js(d, captions)[0] == "p000 request 1 · not chosen by alice", "the captions")
        press(browser, "\ue00c")
        assert shown(browser)[order[2]] == ("not_chosen", "not chosen by alice")
        assert "1 approved · 2 not chosen" in browser.find_element("id", "tally").text
    dest = tmp_path / "delivered"
    export(str(out), str(dest), ExportOptions(approved_only=True))
    delivered = [p for p in dest.rglob("*.png")]
    assert (
        len(delivered) == 1
        and delivered[0].read_bytes()
        == next((out / "images" / "p000").glob(f"*{order[1][-12:]}.png")).read_bytes()
    )
    with ReviewServer(FolderBackend(out), "alice") as server:  # and one u takes the pick back
        open_page(browser, server.url)
        press(browser, "u")
        saved(browser, 3)
        assert [kind for _, _, kind, _, _ in recorded(out)[-3:]] == ["cleared"] * 3
