"""`imagebatch review`: the review page in a real headless Chromium (Debian's, driven by Selenium through its
chromedriver; one browser for the module), over a folder laid out as a run leaves it (tests/helpers/
review.py), with the decisions read back from `review.jsonl`; its refusals over plain HTTP and from a page
on another origin; a bucket on moto; the command itself; and report.html showing the decisions."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.review import (
    BOUND,
    chromium,
    open_page,
    press,
    recorded,
    request,
    review_folder,
    saved,
    shown,
    until,
)
from helpers.runs import cli

from imagebatch.report import build_report
from imagebatch.report.review import TOKEN_HEADER, ReviewServer
from imagebatch.report.review_data import load_cards
from imagebatch.storage.folder import FolderBackend
from imagebatch.storage.kinds import open_location
from imagebatch.work.decisions import Decision, decided, read_decisions, record_decision

SCREENSHOT = os.environ.get("IMAGEBATCH_REVIEW_SCREENSHOT")
"""Where the keyboard test saves its screenshot of the page too (the README's docs/review.png)."""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = chromium(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return review_folder(tmp_path)


@pytest.fixture
def server(out: Path) -> Iterator[ReviewServer]:
    with ReviewServer(FolderBackend(out), "alice") as running:
        yield running


def test_a_reviewer_rejects_with_a_note_and_approves_by_keyboard_and_both_persist(
    browser: Any, server: ReviewServer, out: Path, tmp_path: Path
) -> None:
    order = open_page(browser, server.url)
    assert browser.find_element("id", "count").text == "0 of 13 reviewed"
    assert "1 request without an image not shown" in browser.page_source
    # The second card is the redone request's variant 2, shown before its variant 1.
    assert [
        c["v"]
        for c in browser.execute_script(
            "return JSON.parse(document.getElementById('data').textContent).cards"
        )[1:3]
    ] == [2, 1]

    press(browser, "j")  # the second card
    press(browser, "n")
    until(browser, lambda d: d.find_element("id", "notebar").is_displayed(), "the note bar open")
    press(browser, "handle missing on the left\n")  # saved at once, as a comment
    press(browser, "r")  # rejected with its note; the third card is selected
    press(browser, "a")
    saved(browser, 3)
    assert recorded(out) == [
        (order[1], 2, "comment", "handle missing on the left", "alice"),
        (order[1], 2, "rejected", "handle missing on the left", "alice"),
        (order[2], 1, "approved", "", "alice"),
    ]
    if SCREENSHOT:
        browser.save_screenshot(SCREENSHOT)

    browser.refresh()
    assert open_page(browser, server.url) == order
    cards = shown(browser)
    assert cards[order[1]] == ("rejected", "rejected by alice: handle missing on the left")
    assert cards[order[2]] == ("approved", "approved by alice")
    assert cards[order[0]] == ("", "unreviewed")
    assert browser.find_element("id", "count").text == "2 of 13 reviewed"


def test_undo_records_the_cards_previous_decision_then_cleared(
    browser: Any, server: ReviewServer, out: Path
) -> None:
    order = open_page(browser, server.url)
    press(browser, "a")  # approve the first card, then go back and reject it instead
    press(browser, "k")
    press(browser, "r")
    press(browser, "u")  # the rejection undone: approved again
    press(browser, "u")  # the approval undone: nothing, recorded as `cleared`
    saved(browser, 4)
    assert [(d[0], d[2]) for d in recorded(out)] == [
        (order[0], kind) for kind in ("approved", "rejected", "approved", "cleared")
    ]
    assert decided(FolderBackend(out)) == {}
    assert shown(browser)[order[0]] == ("", "unreviewed")
    assert browser.find_element("id", "count").text == "0 of 13 reviewed"


def test_the_filter_shows_unreviewed_approved_or_rejected_cards(
    browser: Any, server: ReviewServer, out: Path
) -> None:
    from selenium.webdriver.support.ui import Select

    order = open_page(browser, server.url + "#filter=unreviewed")
    # 12: the redone request's variant 1 is not unreviewed but replaced (order[2], its variant 2 before it)
    assert browser.find_element("id", "shown").text == "12 shown"
    assert order[2] not in shown(browser)
    assert order[0] in shown(browser)  # (only the cards in and near the window are in the document)
    press(browser, "a")  # the first card leaves the unreviewed ones; the next takes its place
    saved(browser, 1)
    assert browser.find_element("id", "shown").text == "11 shown"
    assert order[0] not in shown(browser) and all(decision == "" for decision, _ in shown(browser).values())
    assert browser.execute_script("return document.querySelector('.card.sel').dataset.key") == order[1]
    Select(browser.find_element("id", "filter")).select_by_value("approved")
    assert browser.find_element("id", "shown").text == "1 shown"
    assert list(shown(browser)) == [order[0]] and browser.current_url.endswith("#filter=approved")


def test_two_browser_sessions_deciding_at_once_lose_nothing(
    browser: Any, server: ReviewServer, out: Path
) -> None:
    first = browser.current_window_handle
    order = open_page(browser, server.url)
    browser.switch_to.new_window("window")
    second = browser.current_window_handle
    try:
        open_page(browser, server.url)  # both pages loaded before either decides
        press(browser, "jr")
        saved(browser, 1)
        browser.switch_to.window(first)
        press(browser, "a")
        saved(browser, 1)
        assert {(key, kind) for key, _, kind, _, _ in recorded(out)} == {
            (order[0], "approved"),
            (order[1], "rejected"),
        }
        # Each page shows the other's decision once it looks again (on focus, or every 3 s).
        browser.execute_script("window.dispatchEvent(new Event('focus'))")
        until(browser, lambda d: shown(d)[order[1]][0] == "rejected", "the other page's decision")
        browser.switch_to.window(second)
        browser.execute_script("window.dispatchEvent(new Event('focus'))")
        until(browser, lambda d: shown(d)[order[0]][0] == "approved", "the other page's decision")
        assert browser.find_element("id", "count").text == "2 of 13 reviewed"
    finally:
        browser.switch_to.window(second)
        browser.close()
        browser.switch_to.window(first)


def test_two_servers_on_one_folder_see_each_others_decisions(out: Path) -> None:
    """Two reviewers, each with `imagebatch review` on the same folder, deciding at once."""
    with (
        ReviewServer(FolderBackend(out), "alice", refresh_interval=0) as a,
        ReviewServer(FolderBackend(out), "bob", refresh_interval=0) as b,
    ):
        keys = list(a.cards)

        def decide(server: ReviewServer, share: list[str], kind: str) -> None:
            for key in share:
                assert post(server, {"key": key, "decision": kind})[0] == 200

        threads = [threading.Thread(target=decide, args=(a, keys[::2], "approved")),
                   threading.Thread(target=decide, args=(b, keys[1::2], "rejected"))]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for server in (a, b):
            status, body = request(server.url, path="/api/decisions?since=-1")
            seen = {key: d["decision"] for key, d in json.loads(body)["decisions"].items()}
            assert status == 200 and seen == {
                k: "approved" if i % 2 == 0 else "rejected" for i, k in enumerate(keys)
            }
    assert {d.reviewer for d in read_decisions(FolderBackend(out)).values()} == {"alice", "bob"}
    assert len(recorded(out)) == len(keys)


def post(server: ReviewServer, body: dict[str, Any], **headers: str) -> tuple[int, dict[str, Any]]:
    """A decision POSTed as the page sends it; `headers` replace the page's (None-valued: removed)."""
    sent = {
        "Host": f"127.0.0.1:{server.port}",
        "Origin": f"http://127.0.0.1:{server.port}",
        "Content-Type": "application/json",
        TOKEN_HEADER: server.token,
        "Sec-Fetch-Site": "same-origin",
    }
    sent.update({k.replace("_", "-"): v for k, v in headers.items()})
    status, raw = request(
        server.url, "POST", "/api/decision", json.dumps(body).encode(), {k: v for k, v in sent.items() if v}
    )
    return status, json.loads(raw)


def test_a_decision_not_from_the_page_is_refused_and_nothing_is_written(
    server: ReviewServer, out: Path
) -> None:
    key = next(iter(server.cards))
    decision = {"key": key, "decision": "rejected", "note": "x"}
    port = server.port
    refusals = {
        "no token": {TOKEN_HEADER.replace("-", "_"): ""},
        "a wrong token": {TOKEN_HEADER.replace("-", "_"): "guess"},
        "another origin": {"Origin": "http://evil.example"},
        "another port of this host": {"Origin": f"http://127.0.0.1:{port + 1}"},
        "no origin": {"Origin": ""},
        "a cross-site fetch": {"Sec_Fetch_Site": "cross-site"},
        "a form's content type": {"Content_Type": "application/x-www-form-urlencoded"},
        "a rebound name (DNS rebinding)": {"Host": f"evil.example:{port}"},
        "the right name on another port": {"Host": f"localhost:{port + 1}"},
    }
    for why, headers in refusals.items():
        status, answer = post(server, decision, **headers)
        assert status == 403, why
        assert "refused" in answer["error"], why
    assert not (out / "review.jsonl").exists()
    # A page reached under a rebound name gets neither the page nor its token.
    status, page = request(server.url, headers={"Host": f"attacker.example:{port}"})
    assert status == 403 and server.token.encode() not in page
    # Bad fields are refused too, with nothing written.
    assert post(server, {"key": "ib1-nope", "decision": "approved"})[0] == 400
    assert post(server, {"key": key, "decision": "maybe"})[0] == 400
    assert post(server, {"key": key, "decision": "approved", "note": "x" * 2001})[0] == 400
    assert not (out / "review.jsonl").exists()
    # The page's own request is accepted (so the refusals above were for their reason), under localhost too.
    assert post(server, decision)[0] == 200
    assert post(server, decision, Host=f"localhost:{port}", Origin=f"http://localhost:{port}")[0] == 200
    assert len(recorded(out)) == 2


class _Page(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_page_on_another_site_cannot_post_a_decision_even_with_the_token(
    browser: Any, server: ReviewServer, out: Path
) -> None:
    key = next(iter(server.cards))
    body = json.dumps({"key": key, "decision": "rejected", "note": "from elsewhere"})
    _Page.body = f"""<!doctype html><title>elsewhere</title><script>
const target = {json.dumps(server.url + "api/decision")}, body = {json.dumps(body)};
Promise.allSettled([
  fetch(target, {{method: 'POST', mode: 'no-cors', body, headers: {{'Content-Type': 'text/plain'}}}}),
  fetch(target, {{method: 'POST', body, headers: {{'Content-Type': 'application/json',
                                                 '{TOKEN_HEADER}': {json.dumps(server.token)}}}}}),
]).then(r => {{ document.title = 'done ' + r.map(x => x.status).join(' '); }});
</script>""".encode()
    elsewhere = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=elsewhere.serve_forever)
    thread.start()
    try:
        browser.get(f"http://localhost:{elsewhere.server_address[1]}/")
        until(browser, lambda d: d.title.startswith("done"), "the other site's attempts settled")
        # Both fail in the page: the simple (no-cors) POST reached the server and was refused (and its
        # answer is not readable elsewhere: Cross-Origin-Resource-Policy), the one with the token needed a
        # preflight, which the server does not grant, so the browser never sent it.
        assert browser.title == "done rejected rejected"
    finally:
        elsewhere.shutdown()
        elsewhere.server_close()
        thread.join()
    assert server.refused == 1  # the no-cors POST only
    assert not (out / "review.jsonl").exists()


def test_nothing_outside_the_output_folder_is_served(server: ReviewServer, out: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG not for the reviewer")
    card = next(iter(server.cards.values()))
    assert request(server.url, path=f"/image/{card.key}/0") == (200, (out / card.images[0]).read_bytes())
    assert request(server.url, path=f"/thumb/{card.key}/0")[0] == 200
    for path in ("/../secret.png", "/image/../../secret.png", f"/image/{card.key}/..%2f..%2fsecret.png",
                 f"/image/{card.key}/1", f"/image/{card.key}/-1", "/thumb/..%2F..%2Fsecret.png/0",
                 "/results.csv", "/review.jsonl", "/run.json"):  # fmt: skip
        status, body = request(server.url, path=path)
        assert status == 404 and b"not for the reviewer" not in body, path

    # results.csv naming a path out of images/, or a symlink out of the folder: never served.
    (out / "images" / "p000" / "link.png").symlink_to(secret)
    lines = (out / "results.csv").read_text().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","), strict=True)) for line in lines[1:3]]
    rows[0]["paths"], rows[1]["paths"] = "images/../../secret.png", "images/p000/link.png"
    rows[0]["idempotency_key"], rows[1]["idempotency_key"] = "ib1-dotdot", "ib1-symlink"
    with (out / "results.csv").open("a") as fh:
        fh.writelines(",".join(row[c] for c in header) + "\n" for row in rows)
    status, page = request(server.url)  # the page reads results.csv again
    assert status == 200 and b"1 image name outside images/ not served" in page
    for path in ("/image/ib1-dotdot/0", "/image/ib1-symlink/0", "/thumb/ib1-symlink/0"):
        status, body = request(server.url, path=path)
        assert status == 404 and b"not for the reviewer" not in body, path
    assert not list((out / "thumbs").glob("*link*"))
    # A thumbnail that is a symlink out of the folder (older than its image): not written through.
    link = out / "thumbs" / f"{card.images[0].removeprefix('images/').replace('/', '__')}.jpg"
    link.unlink()
    link.symlink_to(secret)
    os.utime(secret, (0, 0), follow_symlinks=True)
    assert request(server.url, path=f"/thumb/{card.key}/0")[0] == 404
    assert secret.read_bytes() == b"\x89PNG not for the reviewer"
    # thumbs/ itself a symlink out of the folder: no thumbnail is made there, nor served from there.
    shutil.rmtree(out / "thumbs")
    (tmp_path / "elsewhere").mkdir()
    (out / "thumbs").symlink_to(tmp_path / "elsewhere")
    assert request(server.url, path=f"/thumb/{card.key}/0")[0] == 404
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_the_report_shows_the_decisions_read_only(browser: Any, out: Path) -> None:
    folder = FolderBackend(out)
    keys = [
        card.key for card in load_cards(folder).cards.ordered()
    ]  # p000, p001 variant 2, p001 variant 1, p002
    record_decision(folder, Decision(keys[0], 1, "rejected", "handle <missing>", "alice"))
    record_decision(folder, Decision(keys[1], 2, "approved", "", "bob"))
    record_decision(folder, Decision(keys[2], 1, "rejected", "too dark", "bob"))
    record_decision(folder, Decision(keys[3], 1, "approved", "", "bob"))
    record_decision(folder, Decision(keys[3], 1, "cleared", "", "bob"))
    page = build_report(out)
    text = page.read_text()
    assert 'rv-rejected">rejected by alice: <span class="note">handle &lt;missing&gt;</span>' in text
    assert 'rv-approved">approved by bob<' in text
    assert 'rv-redone">rejected, redone by bob: <span class="note">too dark</span>' in text
    # 13 images: 1 rejected and open, 1 approved, 1 rejected and redone (counted apart), 10 unreviewed (a
    # cleared decision leaves its image unreviewed again)
    assert text.count('class="rv rv-unreviewed"') == 10
    assert "review: 11 open (10 unreviewed, 1 rejected) · 1 approved · 1 redone" in text
    assert "<button" not in text and "fetch(" not in text  # read-only
    browser.get(page.as_uri() + "#review=rejected")
    visible = browser.execute_script(
        "return [...document.querySelectorAll('.card')].filter(c => !c.hidden).map(c => c.dataset.review)"
    )
    assert visible == ["rejected"]


def test_a_bucket_is_reviewed_through_its_location(s3: Any, tmp_path: Path) -> None:
    from imagebatch.report.location import report_in

    local = review_folder(tmp_path, requests=3, redone=None)
    build_report(local)  # its thumbnails, as a run into a bucket uploads them
    url = f"s3://{s3.bucket()}/catalog"
    location = open_location(url)
    for path in local.rglob("*"):
        if path.is_file() and not path.name.startswith("report"):
            location.put(path.relative_to(local).as_posix(), path.read_bytes())
    with ReviewServer(location, "alice", refresh_interval=0) as server:
        key, card = next(iter(server.cards.items()))
        status, answer = post(server, {"key": key, "decision": "approved", "note": "good"})
        assert status == 200 and answer["decision"]["decision"] == "approved"
        thumb = location.get(f"thumbs/{card.images[0].removeprefix('images/').replace('/', '__')}.jpg")
        assert request(server.url, path=f"/thumb/{key}/0") == (200, thumb)
        assert request(server.url, path=f"/image/{key}/0") == (200, location.get(card.images[0]))
        # A thumbnail the run did not make: the image itself, and none is made in the bucket.
        last = list(server.cards.values())[-1]
        made = f"thumbs/{last.images[0].removeprefix('images/').replace('/', '__')}.jpg"
        location.delete(made)
        assert request(server.url, path=f"/thumb/{last.key}/0") == (200, location.get(last.images[0]))
        assert location.get(made) is None
        # Another reviewer's decision, recorded straight into the bucket, reaches the page.
        other = list(server.cards)[1]
        record_decision(location, Decision(other, 1, "rejected", "", "bob"))
        status, body = request(server.url, path="/api/decisions?since=-1")
        assert {k: d["decision"] for k, d in json.loads(body)["decisions"].items()} == {
            key: "approved",
            other: "rejected",
        }
    assert location.list("review/") and read_decisions(location)[key].note == "good"
    assert "review.jsonl" not in location.list("")
    report_in(location)
    assert b'rv-approved">approved by alice' in (location.get("report.html") or b"")


@pytest.mark.slow  # a process of its own
def test_the_command_serves_until_ctrl_c(
    out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**os.environ, "IMAGEBATCH_REVIEWER": "carol"}
    command = [sys.executable, "-m", "imagebatch.cli.main", "review", str(out), "--port", "0"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            assert line.startswith("imagebatch review: http://127.0.0.1:") and "reviewer carol" in line, line
            url = line.split()[2]
            status, page = request(url)
            assert status == 200 and b'"reviewer":"carol"' in page
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=BOUND) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    code, _, err = cli(capsys, "review", str(tmp_path / "nothing"))
    assert code == 2 and "has no results.csv" in err


def test_the_runs_prefect_artifact_counts_the_review(out: Path) -> None:
    from imagebatch.run.report_artifact import report_markdown, review_line
    from imagebatch.storage.csvcells import read_csv
    from imagebatch.work.store import RequestRecord

    records = [
        RequestRecord(r["job_id"], int(r["request_index"]), int(r["turn_index"]), r["status"], r["model"],  # type: ignore[arg-type]
                      r["route"], r["idempotency_key"], [p for p in r["paths"].split(";") if p])
        for r in read_csv(out / "results.csv")
    ]  # fmt: skip
    keys = [r.idempotency_key for r in records if r.paths]
    record_decision(FolderBackend(out), Decision(keys[0], 1, "rejected", "too dark"))
    record_decision(FolderBackend(out), Decision(keys[1], 2, "approved"))
    record_decision(FolderBackend(out), Decision(keys[2], 3, "rejected", "wrong colour"))
    redone = next(r for r in records if r.idempotency_key == keys[2])
    records.append(dataclasses.replace(redone, variant=2, idempotency_key="ib1-" + "e" * 32))  # its redo
    line = review_line(str(out), records)
    # The redone rejection is neither open nor rejected any more; its new variant is unreviewed.
    assert line.startswith("**Review:** 12 open (11 unreviewed, 1 rejected) · 1 approved · 1 redone"), line
    assert f"`imagebatch review {out}`" in line
    info = {"out": str(out), "counts": {"succeeded": 13, "failed": 1}}
    assert line in report_markdown(info, None, [], line)
