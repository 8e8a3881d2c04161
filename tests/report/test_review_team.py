"""A review for a team, over real HTTP: beyond loopback only with named reviewers (a reviewers file only its
owner can read), every route refused without a reviewer's token, each decision under the token's name
(never the one a page sends), both reviewers' decisions on an image in `GET /api/changes`, and report.html
rebuilt after decisions."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.review import recorded, request, review_folder
from helpers.runs import cli

from imagebatch.report.location import write_report
from imagebatch.report.review import TOKEN_HEADER, ReviewServer
from imagebatch.report.review_auth import load_reviewers
from imagebatch.report.review_data import ReviewError, load_cards
from imagebatch.storage.folder import FolderBackend
from imagebatch.work.decisions import Decision, record_decision
from imagebatch.work.store import OutputStore

TEAM = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef"}
HOST = "127.0.0.2"
"""Loopback, but not 127.0.0.1: the server treats it as beyond loopback (reviewers needed)."""
BOUND = 30.0


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return review_folder(tmp_path, requests=4, redone=None)


@pytest.fixture
def team(out: Path) -> Iterator[ReviewServer]:
    with ReviewServer(FolderBackend(out), "host", refresh_interval=0, host=HOST, reviewers=TEAM) as server:
        yield server


def call(
    server: ReviewServer, method: str, path: str, body: dict[str, Any] | None = None, **headers: str
) -> tuple[int, Any]:
    """A request as the page sends it (Host, and for a POST Origin, JSON and the page's token) plus
    `headers`; the status and the answer (JSON where it is)."""
    sent = {"Host": f"{HOST}:{server.port}"}
    if method == "POST":
        sent |= {"Origin": f"http://{HOST}:{server.port}", "Content-Type": "application/json"}
        sent[TOKEN_HEADER] = server.token
    sent |= headers
    raw_body = None if body is None else json.dumps(body).encode()
    status, raw = request(server.url, method, path, raw_body, sent)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TEAM[name]}"}


def test_a_host_beyond_loopback_without_reviewers_is_refused_in_one_line(
    out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "review", str(out), "--host", HOST)
    assert code == 2
    assert (
        err == f"imagebatch review: --host {HOST} is beyond loopback: name the reviewers (--reviewers FILE)\n"
    )


def test_a_reviewers_file_others_can_read_is_refused_as_ssh_refuses_a_key(
    tmp_path: Path, out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "team"
    path.write_text("".join(f"{name} {token}\n" for name, token in TEAM.items()))
    path.chmod(0o644)
    code, _, err = cli(capsys, "review", str(out), "--host", HOST, "--reviewers", str(path))
    assert code == 2
    assert err.count("\n") == 1 and "others may read it (mode 644" in err and f"chmod 600 {path}" in err
    assert "alice-token" not in err
    path.chmod(0o600)
    assert load_reviewers(path) == TEAM


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("alice short\n", "alice's token must be at least 16"),
        ("alice a-token-of-enough-length with-spaces\n", "expected NAME TOKEN, found 3 words"),
        ("alice a-token-of-enough-length\nalice another-token-long-enough\n", "given twice"),
        ("# nobody yet\n\n", "names no reviewer"),
        ("alice tok;en=with;cookie;chars\n", "alice's token must be"),
    ],
)
def test_a_reviewers_file_line_that_is_not_name_and_token_is_refused(
    tmp_path: Path, text: str, why: str
) -> None:
    path = tmp_path / "team"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ReviewError, match=why):
        load_reviewers(path)


def test_every_route_refuses_a_request_without_a_reviewers_token(team: ReviewServer, out: Path) -> None:
    key = next(iter(team.cards))
    paths = ["/", "/api/changes?since=-1", "/api/decisions", "/api/undo", "/favicon.ico", "/nothing"]
    paths += [f"/{route}/{key}/0" for route in ("thumb", "image", "ref")]
    wrong = [{}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Cookie": f"{team.gate.cookie}=wrong"}]
    for path in paths:
        for headers in wrong:
            status, _ = call(team, "GET", path, **headers)
            assert status == 401, (path, headers)
    for path in ("/api/decision", "/api/undo"):
        status, answer = call(team, "POST", path, {"key": key, "decision": "approved"})
        assert (status, answer) == (401, {"error": "refused: sign in with your link"})
    assert not (out / "review.jsonl").exists()
    # A reviewer's token does not lift the Host check: another name for the address is still refused.
    status, _ = request(
        team.url, "GET", "/", None, {"Host": f"rebound.example:{team.port}", **bearer("alice")}
    )
    assert status == 403
    assert call(team, "GET", f"/thumb/{key}/0", **bearer("alice"))[0] == 200


def test_a_sign_in_link_sets_an_httponly_strict_cookie_and_moves_on_without_the_token(
    team: ReviewServer,
) -> None:
    import http.client

    conn = http.client.HTTPConnection(HOST, team.port, timeout=BOUND)
    conn.request("GET", f"/?token={TEAM['bob']}", headers={"Host": f"{HOST}:{team.port}"})
    answer = conn.getresponse()
    page, cookie = answer.read().decode(), answer.getheader("Set-Cookie") or ""
    conn.close()
    assert answer.status == 200
    assert cookie == (f"{team.gate.cookie}={TEAM['bob']}; Path=/; Max-Age=604800; HttpOnly; SameSite=Strict")
    assert '<meta http-equiv="refresh" content="0; url=/">' in page and TEAM["bob"] not in page
    status, body = call(team, "GET", "/", Cookie=f"{team.gate.cookie}={TEAM['bob']}")
    assert status == 200 and '"reviewer":"bob","signedIn":true' in body
    assert call(team, "GET", "/?token=not-a-token-of-the-team")[0] == 401
    # signed in as bob, alice's link signs the browser in as alice (never the page, the token in view)
    status, page = call(team, "GET", f"/?token={TEAM['alice']}", Cookie=f"{team.gate.cookie}={TEAM['bob']}")
    assert status == 200 and "Signed in as alice" in page


def test_behind_a_tls_proxy_its_name_is_accepted_as_host_and_origin_and_the_cookie_is_secure(
    out: Path,
) -> None:
    import http.client

    proxy = "https://review.example.com"
    with ReviewServer(FolderBackend(out), "host", reviewers=TEAM, origins=[proxy]) as server:
        key = next(iter(server.cards))
        named = {"Host": "review.example.com", **bearer("alice")}
        assert call(server, "GET", "/api/changes", **named)[0] == 200
        body = {"key": key, "decision": "approved"}
        status, _ = call(server, "POST", "/api/decision", body, Origin=proxy, **named)
        assert status == 200
        status, answer = call(
            server, "POST", "/api/decision", body, Origin="https://elsewhere.example", **named
        )
        assert (status, answer) == (403, {"error": "refused: not from this review page (Origin)"})
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=BOUND)
        proxied = {"Host": "review.example.com", "X-Forwarded-Proto": "https"}
        conn.request("GET", f"/?token={TEAM['alice']}", headers=proxied)
        answer_ = conn.getresponse()
        answer_.read()
        conn.close()
        assert (answer_.getheader("Set-Cookie") or "").endswith("; HttpOnly; SameSite=Strict; Secure")


def test_the_reviewers_file_may_come_from_the_environment(
    tmp_path: Path, out: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "team"
    path.write_text("alice short\n")
    path.chmod(0o600)
    monkeypatch.setenv("IMAGEBATCH_REVIEWERS", str(path))
    code, _, err = cli(capsys, "review", str(out), "--host", HOST)
    assert code == 2 and err.startswith(f"imagebatch review: the reviewers file {path} line 1: alice's token")


def test_a_decision_carries_the_signed_in_reviewer_whatever_name_the_page_sends(
    team: ReviewServer, out: Path
) -> None:
    key = next(iter(team.cards))
    body = {"key": key, "decision": "rejected", "note": "too dark", "reviewer": "mallory"}
    status, answer = call(team, "POST", "/api/decision", body, **bearer("bob"))
    assert status == 200 and answer["decision"]["reviewer"] == "bob"
    assert recorded(out) == [(key, 1, "rejected", "too dark", "bob")]
    # alice cannot undo bob's decision by saying she is bob
    status, answer = call(team, "POST", "/api/undo", {"key": key, "reviewer": "bob"}, **bearer("alice"))
    assert status == 409 and answer["error"].startswith("cannot undo: nothing of yours")
    assert call(team, "GET", "/api/undo?reviewer=bob", **bearer("alice"))[1] == {"undo": []}
    assert call(team, "GET", "/api/undo?reviewer=alice", **bearer("bob"))[1] == {
        "undo": [{"k": key, "b": ""}]
    }


def test_changes_since_a_version_gives_both_reviewers_decisions_on_an_image(team: ReviewServer) -> None:
    first, second = list(team.cards)[:2]
    status, start = call(team, "GET", "/api/changes?since=-1", **bearer("alice"))
    assert (status, start["decisions"]) == (200, {})
    call(team, "POST", "/api/decision", {"key": first, "decision": "approved"}, **bearer("alice"))
    status, after = call(team, "GET", f"/api/changes?since={start['version']}", **bearer("bob"))
    assert list(after["decisions"]) == [first] and after["decisions"][first]["views"] == []
    call(team, "POST", "/api/decision", {"key": first, "decision": "rejected"}, **bearer("bob"))
    call(team, "POST", "/api/decision", {"key": second, "decision": "approved"}, **bearer("bob"))
    status, later = call(team, "GET", f"/api/changes?since={after['version']}", **bearer("alice"))
    assert set(later["decisions"]) == {first, second}
    assert later["decisions"][first]["decision"] == "rejected"  # the latest is in force...
    assert later["decisions"][first]["views"] == [["alice", "approved"], ["bob", "rejected"]]  # ...both shown
    assert (
        call(team, "GET", f"/api/changes?since={later['version']}", **bearer("alice"))[1]["decisions"] == {}
    )
    # bob takes his back: alice's approval is in force again, and no one disagrees any more
    call(team, "POST", "/api/undo", {"key": first}, **bearer("bob"))
    undone = call(team, "GET", f"/api/changes?since={later['version']}", **bearer("alice"))[1]["decisions"]
    assert undone[first]["decision"] == "approved" and undone[first]["views"] == []
    page = call(team, "GET", "/", **bearer("alice"))[1]
    assert '"views":{}' in page


def test_report_html_is_rebuilt_after_decisions(out: Path) -> None:
    write_report(OutputStore(out))
    before = (out / "report.html").read_text()
    built = threading.Event()

    def rebuild() -> None:
        write_report(OutputStore(out))
        built.set()

    folder = FolderBackend(out)
    with ReviewServer(folder, "alice", refresh_interval=0, rebuild=rebuild, report_interval=0.05) as server:
        key = next(iter(server.cards))
        here = {"Host": f"127.0.0.1:{server.port}", "Origin": f"http://127.0.0.1:{server.port}"}
        status, _ = call(server, "POST", "/api/decision", {"key": key, "decision": "approved"}, **here)
        assert status == 200
        assert built.wait(BOUND), "report.html was not rebuilt"
        after = (out / "report.html").read_text()
        assert "approved by alice" not in before and "approved by alice" in after
        assert server.report is not None and server.report.rebuilds == 1


def test_a_report_older_than_the_record_is_rebuilt_when_the_review_starts(out: Path) -> None:
    write_report(OutputStore(out))
    key = next(iter(load_cards(FolderBackend(out)).cards))
    record_decision(
        FolderBackend(out), Decision(key, 1, "rejected", "too dark", "carol")
    )  # not in the report
    built = threading.Event()

    def rebuild() -> None:
        write_report(OutputStore(out))
        built.set()

    with ReviewServer(FolderBackend(out), "alice", rebuild=rebuild, report_interval=0.05):
        assert built.wait(BOUND), "report.html was not rebuilt"
        assert "rejected by carol" in (out / "report.html").read_text()


@pytest.mark.slow  # a process of its own
def test_the_command_serves_the_team_says_no_token_and_leaves_the_report_true(
    tmp_path: Path, out: Path
) -> None:
    path = tmp_path / "team"
    path.write_text("".join(f"{name} {token}\n" for name, token in TEAM.items()))
    path.chmod(0o600)
    write_report(OutputStore(out))
    command = [sys.executable, "-m", "imagebatch.cli.main", "review", str(out), "--host", HOST]
    command += ["--reviewers", str(path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            assert line.startswith(f"imagebatch review: http://{HOST}:") and "reviewers alice, bob" in line, (
                line
            )
            url = line.split()[2]
            port = int(url.rstrip("/").rsplit(":", 1)[1])
            assert request(url)[0] == 401
            key = next(iter(load_cards(FolderBackend(out)).cards))
            sent = {"Origin": f"http://{HOST}:{port}", "Content-Type": "application/json", **bearer("alice")}
            page = request(url, "GET", "/", None, bearer("alice"))[1].decode()
            sent[TOKEN_HEADER] = page.split('name="review-token" content="', 1)[1].split('"', 1)[0]
            body = json.dumps({"key": key, "decision": "approved"}).encode()
            assert request(url, "POST", "/api/decision", body, sent)[0] == 200
            proc.send_signal(signal.SIGTERM)  # before the report's first look (15 s): built as it stops
            assert proc.wait(timeout=BOUND) == 0
            stdout, stderr = proc.communicate()
        finally:
            if proc.poll() is None:
                proc.kill()
    assert all(token not in line + stdout + stderr for token in TEAM.values())
    assert "approved by alice" in (out / "report.html").read_text()
