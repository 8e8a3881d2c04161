"""The `imagebatch emulator` command, run as a real process: one URL line, clean exit on SIGTERM/SIGINT,
API key handling, options, and a port already taken."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from imagebatch.cli.emulator import PORT, emulator_arguments, main, settings_from_args
from imagebatch.emulator import EmulatorSettings
from imagebatch.emulator.serve import CannotServe, serve

URL_LINE = re.compile(r"^imagebatch emulator listening on (http://127\.0\.0\.1:\d+)$")
NATIVE = "/v1beta/models/native-image-2:generateContent"
BODY = {"contents": [{"parts": [{"text": "a harbour"}]}]}


@contextmanager
def running(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start `python -m imagebatch.cli.emulator --port 0 ARGS`; yield (process, URL)."""
    full_env = {k: v for k, v in os.environ.items() if k != "IMAGEBATCH_API_KEY"} | (env or {})
    process = subprocess.Popen(
        [sys.executable, "-m", "imagebatch.cli.emulator", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().rstrip("\n")
        match = URL_LINE.match(line)
        assert match, (
            f"unexpected first line {line!r}; stderr: {process.stderr.read() if process.stderr else ''}"
        )
        yield process, match.group(1)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def finish(process: subprocess.Popen[str], sig: int) -> tuple[int, str, str]:
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=60)  # a clean exit, however loaded the machine
    return process.returncode, stdout, stderr


@pytest.mark.slow  # a process of its own
def test_serves_with_the_key_from_the_environment_then_exits_cleanly_on_sigterm() -> None:
    secret = "env-secret-key-123"
    with running("--script", "503", env={"IMAGEBATCH_API_KEY": secret}) as (process, url):
        headers = {"x-native-api-key": secret, "Idempotency-Key": "cli-1"}
        assert httpx.post(url + NATIVE, headers=headers, json=BODY, timeout=30).status_code == 503
        assert httpx.post(url + NATIVE, headers=headers, json=BODY, timeout=30).status_code == 200
        assert len(httpx.get(url + "/emulator/ledger").json()) == 1
        code, stdout, stderr = finish(process, signal.SIGTERM)
    assert code == 0, stderr
    assert stdout == ""  # the URL line was the only line
    assert "Traceback" not in stderr
    assert secret not in stdout + stderr  # a key from the environment is never printed


@pytest.mark.slow  # a process of its own
def test_without_a_key_a_throwaway_key_is_printed_on_stderr_and_sigint_stops_cleanly() -> None:
    with running() as (process, url):
        assert process.stderr is not None
        # Printed (and flushed) before the URL line, so it is already there to read.
        match = re.search(r"throwaway key (\S+)$", process.stderr.readline().strip())
        assert match
        body = {"model": "t", "input": "hi"}
        headers = {"Authorization": f"Bearer {match.group(1)}"}
        assert httpx.post(url + "/v1/responses", headers=headers, json=body, timeout=30).status_code == 200
        code, stdout, stderr = finish(process, signal.SIGINT)
    assert code == 0, stderr
    assert stdout == "" and "Traceback" not in stderr


@pytest.mark.slow  # a process of its own
def test_port_already_taken_fails_with_status_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "imagebatch.cli.emulator", "--port", str(port), "--api-key", "k"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    assert result.stdout == ""
    assert "cannot listen" in result.stderr


def build_parser() -> argparse.ArgumentParser:
    """The emulator's own parser, as `python -m imagebatch.cli.emulator` builds it."""
    parser = argparse.ArgumentParser(prog="emulator")
    emulator_arguments(parser)
    return parser


def test_options_and_defaults() -> None:
    defaults = build_parser().parse_args([])
    assert (defaults.host, defaults.port, defaults.api_key) == ("127.0.0.1", PORT, None)
    args = build_parser().parse_args(
        ["--seed", "7", "--latency", "0.5", "--jpeg-rate", "1",
         "--fault", "503:0.1", "--fault", "drop:0.05", "--script", "429,ok@cat",
         "--max-images-policy", "cap", "--slow-seconds", "3"]
    )  # fmt: skip
    settings = settings_from_args(args, "k")
    assert (settings.seed, settings.latency, settings.jpeg_rate, settings.slow_seconds) == (7, 0.5, 1.0, 3.0)
    assert settings.faults.rates == {"503": 0.1, "drop": 0.05}
    assert settings.faults.scripts[0].outcomes == ["429", "ok"] and settings.faults.scripts[0].match == "cat"
    assert settings.max_images_policy == "cap"


@pytest.mark.parametrize("bad", [["--fault", "503"], ["--fault", "teapot:0.1"], ["--script", "503,nope"]])
def test_bad_fault_options_are_usage_errors(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(bad)
    assert exit_info.value.code == 2


def test_settings_the_emulator_refuses_are_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--port", "0", "--api-key", "k", "--jpeg-rate", "5"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.splitlines() == [
        "imagebatch emulator: invalid option --jpeg-rate: Input should be less than or equal to 1"
    ]


def test_serve_answers_until_stopped_then_puts_the_signal_handlers_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stop = threading.Event()
    answers: list[int] = []

    def listening(url: str) -> None:
        headers = {"x-native-api-key": "k"}
        answers.append(httpx.post(url + NATIVE, headers=headers, json=BODY, timeout=30).status_code)
        stop.set()

    serve(EmulatorSettings(api_key="k", seed=0), port=0, on_listening=listening, stop=stop)
    assert answers == [200]
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_serve_on_a_port_already_taken_raises_cannot_serve() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CannotServe, match=r"cannot listen on 127\.0\.0\.1"):
            serve(EmulatorSettings(api_key="k"), port=port, stop=threading.Event())
