"""The emulator's bounds (issue 21), over real HTTP against servers with small limits: a body over the
limit is refused (by its Content-Length before it is read, a chunked one once it passes it), a slow body
gets 408, a connection that sends no request head is closed, one over the connection cap gets a 503 (also
when the process is short of file descriptors: no "Too many open files"), and a long prompt costs time in
proportion. Timeouts are tiny and the tests wait for the server's answer or close, never for a time."""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from imagebatch.emulator import EmulatorServer, EmulatorSettings
from imagebatch.emulator.render import prompt_lines
from imagebatch.emulator.settings import ServerLimits

KEY = "limits-key"
GENERATE = b"POST /v1/images/generations HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + KEY.encode()
GENERATE += b"\r\ncontent-type: application/json\r\n"
BOUND = 30.0
"""Seconds a test waits for the server's answer or close: generous, only reached if the bound is missing."""


@pytest.fixture
def small() -> Iterator[EmulatorServer]:
    """A server with a 1000-byte body limit, 0.2 s header, body and idle timeouts and 3 connections."""
    limits = ServerLimits(
        max_body_bytes=1000, header_timeout=0.2, body_timeout=0.2, idle_timeout=0.2, max_connections=3
    )
    with EmulatorServer(EmulatorSettings(api_key=KEY), limits=limits) as server:
        yield server


def connect(server: EmulatorServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=BOUND)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout after BOUND if never)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def answer(data: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def test_a_content_length_over_the_limit_is_refused_before_the_body_is_sent(small: EmulatorServer) -> None:
    sock = connect(small)
    sock.sendall(GENERATE + b"content-length: 1001\r\n\r\n")  # the head only: no body byte is needed
    status, headers, body = answer(read_until_closed(sock))
    assert status == 413 and headers["connection"] == "close" and headers["x-request-id"].startswith("req_")
    assert body["error"] == {  # type: ignore[comparison-overlap]
        "message": "the request body is larger than the emulator's limit of 1000 bytes",
        "type": "invalid_request_error",
        "code": "request_too_large",
    }
    assert [r["status"] for r in small.requests()] == [413] and small.ledger() == []


def test_a_chunked_body_is_refused_once_it_passes_the_limit_and_no_more_is_read(
    small: EmulatorServer,
) -> None:
    sock = connect(small)
    sock.sendall(GENERATE + b"transfer-encoding: chunked\r\n\r\n")
    for _ in range(3):  # 1200 bytes, never finished: the server answers without the end of the body
        sock.sendall(b"190\r\n" + b"a" * 400 + b"\r\n")
    status, headers, _ = answer(read_until_closed(sock))
    assert status == 413 and headers["connection"] == "close"
    # httpx streaming a larger body gets the answer too; within the limit a body is read as ever.
    chunks = (b"x" * 500 for _ in range(1000))
    refused = httpx.post(small.url + "/v1/images/generations", content=chunks, headers=auth(), timeout=BOUND)
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "request_too_large"
    within = httpx.post(small.url + "/v1/images/generations", json={"prompt": "a"}, headers=auth())
    assert within.status_code == 200
    assert [r["status"] for r in small.requests()] == [413, 413, 200]


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}


def test_a_body_slower_than_the_body_timeout_gets_408_and_the_connection_is_closed(
    small: EmulatorServer,
) -> None:
    sock = connect(small)
    sock.sendall(GENERATE + b'content-length: 100\r\n\r\n{"prompt": ')  # and then nothing more
    status, headers, body = answer(read_until_closed(sock))
    assert status == 408 and headers["connection"] == "close"
    assert body["error"] == {  # type: ignore[comparison-overlap]
        "message": "the request body did not arrive within 0.2 s",
        "type": "timeout_error",
        "code": "request_timeout",
    }
    assert [r["status"] for r in small.requests()] == [408] and small.ledger() == []


@pytest.mark.parametrize("sent", [b"", b"POST /v1/images/generations HTTP/1.1\r\nhost: x\r\n"])
def test_a_connection_without_a_whole_request_head_is_closed_after_the_header_timeout(
    small: EmulatorServer, sent: bytes
) -> None:
    sock = connect(small)
    sock.sendall(sent)
    assert read_until_closed(sock) == b""  # closed without an answer (before: open for ever)
    assert small.requests() == []


def test_a_kept_alive_connection_is_closed_after_the_idle_timeout_and_a_slow_next_head_too(
    small: EmulatorServer,
) -> None:
    sock = connect(small)
    sock.sendall(b"GET /emulator/ledger HTTP/1.1\r\nhost: x\r\n\r\n")
    assert read_until_closed(sock).startswith(b"HTTP/1.1 200 OK")  # then idle: closed
    sock = connect(small)
    sock.sendall(b"GET /emulator/ledger HTTP/1.1\r\nhost: x\r\n\r\nGET /emulator/led")
    assert read_until_closed(sock).count(b"HTTP/1.1 200 OK") == 1  # the second head never finished


def test_a_connection_over_the_cap_gets_503_at_once_without_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = ServerLimits(max_connections=2, header_timeout=BOUND * 4, idle_timeout=BOUND * 4)
    caplog.set_level(logging.INFO)
    with EmulatorServer(EmulatorSettings(api_key=KEY), limits=limits) as server:
        held = [connect(server) for _ in range(2)]
        for sock in held:  # each answered, so each is open on the server's side
            sock.sendall(b"GET /emulator/ledger HTTP/1.1\r\nhost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
        refused = httpx.post(server.url + "/v1/images/generations", json={"prompt": "a"}, headers=auth())
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"] == {
            "message": "the emulator has 2 connections open; retry later",
            "type": "server_error",
            "code": "service_unavailable",
        }
        assert server.requests() == []  # not read, not logged as a request
        held.pop().close()
        deadline = time.monotonic() + BOUND
        while server.open_connections > 1 and time.monotonic() < deadline:
            time.sleep(0.005)  # the server's side of the close: an event, waited for with a bound
        served = httpx.post(server.url + "/v1/images/generations", json={"prompt": "a"}, headers=auth())
        assert served.status_code == 200
        held[0].close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.slow  # a process of its own
def test_short_of_file_descriptors_the_command_answers_503_instead_of_too_many_open_files() -> None:
    """`ulimit -n 512` and 2000 idle connections: the cap comes down to (512 - 64 - 4 x 64) / 2 = 96, so
    every connection is accepted and the ones over it refused (before: EMFILE on accept, logged with a
    traceback each time, and a request never answered)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 512:
        pytest.skip(f"the hard limit of file descriptors ({hard}) is below 512")
    command = f"ulimit -n 512 && exec {sys.executable} -m imagebatch.cli.emulator --port 0 --api-key {KEY}"
    process = subprocess.Popen(
        ["bash", "-c", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    idle: list[socket.socket] = []
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split()[-1]
        port = int(url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port), timeout=BOUND) for _ in range(2000)]
        refused = httpx.post(
            url + "/v1/images/generations", json={"prompt": "a"}, headers=auth(), timeout=BOUND
        )
        assert refused.status_code == 503
        assert "96 connections open" in refused.json()["message"]
    finally:
        for sock in idle:
            sock.close()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=BOUND)
    assert "Too many open files" not in stderr and "out of system resource" not in stderr, stderr[-2000:]


def test_a_long_prompt_without_spaces_costs_time_in_proportion(emulator: EmulatorServer) -> None:
    """A 10 MB prompt took over 100 s: textwrap breaking one long word is quadratic. Now only the lines
    drawn are wrapped: 8 MB is answered in about a second (before: about 150 s)."""
    prompt = "x" * 8_000_000
    started = time.monotonic()
    answered = httpx.post(
        emulator.url + "/v1/images/generations",
        json={"model": "compat-image-2", "prompt": prompt},
        headers={"Authorization": f"Bearer {emulator.api_key}"},
        timeout=120,
    )
    assert answered.status_code == 200
    assert time.monotonic() - started < 60  # linear: ~1 s here; quadratic: minutes
    assert prompt_lines(prompt, 40, 3) == ["x" * 40] * 3
