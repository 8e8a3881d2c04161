"""Undo in a shared review: decisions are a history, not a stack. An undo takes back only the undoer's own
decision, and only while it is still the one in force; a bulk approve's undo, each image still in force.
Three reviewers in a real headless Chromium (Debian's, through Selenium), each with `imagebatch review` on
one folder, and the same through the HTTP API and `export --approved-only`; and the server's answer to raw
bytes in an image's path."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.review import chromium, open_page, press, recorded, request, review_folder, saved, shown, until
from helpers.runs import cli

from imagebatch.report.review import TOKEN_HEADER, ReviewServer
from imagebatch.storage.csvcells import read_csv
from imagebatch.storage.folder import FolderBackend
from imagebatch.work.decisions import decided, read_decisions

HANDLE = "handle missing: redo"
ISSUE = (("alice", "approved", ""), ("bob", "rejected", ""), ("carol", "rejected", HANDLE))
"""A approves, B rejects, C rejects with a note (then B presses `u`)."""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = chromium(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return review_folder(tmp_path, requests=6, redone=None)


@pytest.fixture
def servers(out: Path) -> Iterator[dict[str, ReviewServer]]:
    """alice's, bob's and carol's `imagebatch review` on the same folder."""
    running = {
        name: ReviewServer(FolderBackend(out), name, refresh_interval=0).start()
        for name in ("alice", "bob", "carol")
    }
    yield running
    for server in running.values():
        server.stop()


def api(server: ReviewServer, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A POST as the server's page sends it."""
    sent = {
        "Host": f"127.0.0.1:{server.port}",
        "Origin": f"http://127.0.0.1:{server.port}",
        "Content-Type": "application/json",
        TOKEN_HEADER: server.token,
    }
    status, raw = request(server.url, "POST", path, json.dumps(body).encode(), sent)
    return status, json.loads(raw)


def tab(browser: Any, server: ReviewServer) -> tuple[str, list[str]]:
    """A new tab on `server`'s page: its handle and the cards' keys."""
    browser.switch_to.new_window("tab")
    return browser.current_window_handle, open_page(browser, server.url)


def status_is(browser: Any, text: str) -> None:
    """Wait until the page's status line ends with `text` (a refusal starts with the card's title)."""
    until(browser, lambda d: d.find_element("id", "status").text.endswith(text), text)


def test_an_undo_never_brings_back_a_decision_over_another_reviewers_later_one(
    browser: Any, servers: dict[str, ReviewServer], out: Path
) -> None:
    alice, order = tab(browser, servers["alice"])
    press(browser, "a")  # alice approves the first card
    saved(browser, 1)
    bob, _ = tab(browser, servers["bob"])
    press(browser, "r")  # bob rejects it
    saved(browser, 1)
    carol, _ = tab(browser, servers["carol"])
    press(browser, "n")
    until(browser, lambda d: d.find_element("id", "notebar").is_displayed(), "the note bar open")
    press(browser, HANDLE + "\n")  # carol rejects it, with her note
    saved(browser, 1)

    browser.switch_to.window(bob)
    press(browser, "u")  # bob's rejection is no longer the one in force: refused, and the page says why
    status_is(browser, f"cannot undo: carol decided it since you did (rejected: {HANDLE}), and that stands")
    assert len(recorded(out)) == 3  # nothing written
    assert shown(browser)[order[0]] == ("rejected", f"rejected by carol: {HANDLE}")
    (now,) = decided(FolderBackend(out)).values()
    assert (now.decision, now.reviewer, now.note) == ("rejected", "carol", HANDLE)

    browser.switch_to.window(carol)
    press(browser, "u")  # carol takes hers back: bob's rejection is in force again...
    saved(browser, 2)
    assert read_decisions(FolderBackend(out))[order[0]].reviewer == "bob"
    browser.switch_to.window(bob)
    browser.refresh()
    open_page(browser, servers["bob"].url)
    press(browser, "u")  # ...so bob may take his back now: alice's approval returns, as she made it
    saved(browser, 1)
    assert shown(browser)[order[0]] == ("approved", "approved by alice")
    assert [r[2:] for r in recorded(out)] == [
        ("approved", "", "alice"), ("rejected", "", "bob"), ("rejected", HANDLE, "carol"),
        ("rejected", "", "carol"), ("approved", "", "bob"),
    ]  # fmt: skip
    for handle in (alice, carol):
        browser.switch_to.window(handle)
        browser.close()
    browser.switch_to.window(bob)


def test_a_bulk_approves_undo_takes_back_only_the_images_still_in_force(
    browser: Any, servers: dict[str, ReviewServer], out: Path
) -> None:
    _, order = tab(browser, servers["carol"])
    carol = browser.current_window_handle
    alice, _ = tab(browser, servers["alice"])
    press(browser, "xjxjx")  # the first three cards marked
    press(browser, "A")
    saved(browser, 3)
    browser.switch_to.window(carol)
    press(browser, "jr")  # carol rejects the second since
    saved(browser, 1)
    browser.switch_to.window(alice)
    press(browser, "u")
    status_is(
        browser,
        "undid the approval of 2 images; 1 not: carol decided it since you did (rejected), and that stands",
    )
    assert {k: (d.decision, d.reviewer) for k, d in decided(FolderBackend(out)).items()} == {
        order[1]: ("rejected", "carol")
    }
    assert [(r[0], r[2]) for r in recorded(out)[-2:]] == [(order[2], "cleared"), (order[0], "cleared")]
    assert shown(browser)[order[1]] == ("rejected", "rejected by carol")
    browser.close()
    browser.switch_to.window(carol)


def test_the_api_refuses_an_undo_over_a_later_decision_with_409_and_the_reason(
    servers: dict[str, ReviewServer], out: Path
) -> None:
    server = servers["alice"]
    k1, k2, k3 = list(server.cards)[:3]
    for who, kind, note in ISSUE:
        assert (
            api(server, "/api/decision", {"key": k1, "decision": kind, "note": note, "reviewer": who})[0]
            == 200
        )
    status, answer = api(server, "/api/undo", {"key": k1, "reviewer": "bob"})
    assert status == 409
    assert (
        answer["error"]
        == f"cannot undo: carol decided it since you did (rejected: {HANDLE}), and that stands"
    )
    assert answer["decisions"][k1]["reviewer"] == "carol" and answer["undone"] == 0
    # an undo is the server's to work out: a decision line marked as one is refused
    assert api(server, "/api/decision", {"key": k1, "decision": "approved", "undo": True})[0] == 400
    assert len(recorded(out)) == 3
    for who, back in (
        ("carol", ("rejected", "bob")),
        ("bob", ("approved", "alice")),
        ("alice", ("cleared", "alice")),
    ):
        status, answer = api(servers[who], "/api/undo", {"key": k1, "reviewer": who})
        assert (
            status == 200
            and (answer["decisions"][k1]["decision"], answer["decisions"][k1]["reviewer"]) == back
        )
    status, answer = api(server, "/api/undo", {"key": k1, "reviewer": "alice"})
    assert status == 409 and "nothing of yours to undo" in answer["error"]

    for key in (k1, k2, k3):
        api(server, "/api/decision", {"key": key, "decision": "approved", "reviewer": "alice", "batch": "b1"})
    api(servers["carol"], "/api/decision", {"key": k2, "decision": "rejected", "reviewer": "carol"})
    status, answer = api(server, "/api/undo", {"batch": "b1", "reviewer": "alice"})
    assert status == 200 and (answer["undone"], answer["refused"]) == (2, 1)
    assert answer["reason"].startswith("carol decided it since you did")
    assert {k: d.decision for k, d in read_decisions(FolderBackend(out)).items()} == {
        k1: "cleared",
        k2: "rejected",
        k3: "cleared",
    }
    status, answer = api(server, "/api/undo", {"batch": "b1", "reviewer": "alice"})
    assert status == 409 and answer["undone"] == 0  # nothing of the batch left in force


def raw(server: ReviewServer, head: bytes) -> bytes:
    """The status line the server answers a request whose first lines are `head`, bytes as given."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        host = f"Host: 127.0.0.1:{server.port}\r\n".encode()
        conn.sendall(head + b"\r\n" + host + b"Connection: close\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def test_raw_bytes_in_an_images_path_are_a_404_not_a_traceback(
    out: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with ReviewServer(FolderBackend(out), "alice") as server:
        key = next(iter(server.cards)).encode()
        for route in (b"image", b"thumb", b"ref"):
            for path in (b"/%s/%s/\xb2" % (route, key), b"/%s/\xb2\xff/0" % route):
                assert raw(server, b"GET %s HTTP/1.1" % path) == b"HTTP/1.1 404 Not Found", path
        assert raw(server, b"GET /image/%s/0 HTTP/1.1" % key) == b"HTTP/1.1 200 OK"  # the route works
        page = (
            f"Origin: http://127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"{TOKEN_HEADER}: {server.token}"
        ).encode()
        post = b"POST /api/decision HTTP/1.1\r\n" + page + b"\r\nContent-Length: \xb2"
        assert raw(server, post) == b"HTTP/1.1 400 Bad Request"  # a length that is no number
    assert "Traceback" not in capfd.readouterr().err
    assert not (out / "review.jsonl").exists()


def test_the_issues_record_ships_nothing_under_approved_only(
    servers: dict[str, ReviewServer], out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A approves, B rejects, C rejects with a note, B presses `u`: C's rejection stands, and the export
    of approved images does not ship the image."""
    key = next(iter(servers["alice"].cards))
    for who, kind, note in ISSUE:
        assert api(servers[who], "/api/decision", {"key": key, "decision": kind, "note": note})[0] == 200
    assert api(servers["bob"], "/api/undo", {"key": key})[0] == 409
    code, _, err = cli(capsys, "export", str(out), "--to", str(tmp_path / "deliver"), "--approved-only")
    assert code == 0, err
    listed = {r["idempotency_key"]: r for r in read_csv(tmp_path / "deliver" / "export.csv")}
    assert (listed[key]["status"], listed[key]["decision"]) == ("missing", "rejected")
    assert sorted(p.name for p in (tmp_path / "deliver").rglob("*") if p.is_file()) == ["export.csv"]
