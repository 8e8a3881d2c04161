"""The review server under hostile bodies and many reviewers (issue 29 #8, #11): every malformed decision
is a 400 with a reason (never a dropped connection and a traceback), the listen backlog queues a crowd of
connections, and 24 reviewers posting at once each get every decision answered and recorded."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.review import request, review_folder
from helpers.runs import read_jsonl

from imagebatch.report.review import LISTEN_BACKLOG, MAX_BODY, TOKEN_HEADER, ReviewServer
from imagebatch.storage.folder import FolderBackend

BOUND = 60.0
"""Seconds a client waits for the server (a loaded 2-core machine)."""


def headers(server: ReviewServer) -> dict[str, str]:
    return {
        "Host": f"127.0.0.1:{server.port}",
        "Origin": f"http://127.0.0.1:{server.port}",
        "Content-Type": "application/json",
        TOKEN_HEADER: server.token,
        "Sec-Fetch-Site": "same-origin",
    }


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return review_folder(tmp_path, requests=24, redone=None)


def test_every_malformed_body_is_a_400_with_a_reason_and_nothing_is_written(
    out: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with ReviewServer(FolderBackend(out), "alice") as server:
        key = next(iter(server.cards))
        bodies = {
            "a lone surrogate in the note": b'{"key": "%s", "decision": "approved", "note": "\\ud800"}'
            % key.encode(),
            "a lone surrogate in the name": b'{"key": "%s", "decision": "approved", "reviewer": "\\udfff x"}'
            % key.encode(),
            "an 8000-deep array": b"[" * 8000 + b"]" * 8000,
            "a deep object": b'{"a":' * 2500 + b"1" + b"}" * 2500,
            "not UTF-8": b'{"key": "\xff\xfe"}',
            "not JSON": b'{"key": ',
            "not an object": b'["approved"]',
        }
        for why, body in bodies.items():
            assert len(body) <= MAX_BODY, why
            status, raw = request(server.url, "POST", "/api/decision", body, headers(server))
            assert status == 400, why
            assert json.loads(raw)["error"].startswith("the body "), why
        page_own = json.dumps({"key": key, "decision": "approved"}).encode()
        status, _ = request(server.url, "POST", "/api/decision", page_own, headers(server))
        assert status == 200  # the server is still there, and answers the page's own decision
    assert len(read_jsonl(out / "review.jsonl")) == 1
    assert "Traceback" not in capfd.readouterr().err


def test_a_crowd_of_connections_waits_in_the_listen_backlog(out: Path) -> None:
    """64 connections made while the server is not yet accepting: each completes at once (the kernel
    queues up to the backlog; with the default of 5 the seventh connect waited on SYN retries)."""
    server = ReviewServer(FolderBackend(out), "alice")
    crowd: list[socket.socket] = []
    try:
        for _ in range(64):
            crowd.append(socket.create_connection(("127.0.0.1", server.port), timeout=BOUND / 4))
        assert LISTEN_BACKLOG >= 64
        server.start()
        key = next(iter(server.cards))
        body = json.dumps({"key": key, "decision": "approved"}).encode()
        head = "".join(f"{k}: {v}\r\n" for k, v in headers(server).items())
        for conn in crowd:
            conn.settimeout(BOUND)
            start = f"POST /api/decision HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\n"
            conn.sendall(f"{start}Connection: close\r\n\r\n".encode() + body)
        for conn in crowd:
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 ")
    finally:
        for conn in crowd:
            conn.close()
        server.stop()
    assert len(read_jsonl(out / "review.jsonl")) == 64


def test_24_reviewers_deciding_at_once_get_every_decision_answered(out: Path) -> None:
    reviewers, each = 24, 20
    with ReviewServer(FolderBackend(out), "alice") as server:
        keys = list(server.cards)
        start = threading.Barrier(reviewers)
        answers: list[Any] = []
        lock = threading.Lock()

        def reviewer(n: int) -> None:
            start.wait(BOUND)
            for i in range(each):
                decision = {"key": keys[(n + i) % len(keys)], "decision": "approved", "reviewer": f"r{n}"}
                try:
                    status, _ = request(server.url, "POST", "/api/decision", json.dumps(decision).encode(),
                                        headers(server))  # fmt: skip
                except OSError as exc:  # a reset connection: what the issue saw, 1 in 800
                    status = repr(exc)
                with lock:
                    answers.append(status)

        threads = [threading.Thread(target=reviewer, args=(n,)) for n in range(reviewers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND * 4)
        assert not any(t.is_alive() for t in threads)
    assert answers == [200] * (reviewers * each)
    assert len(read_jsonl(out / "review.jsonl")) == reviewers * each
