"""Emulator over real HTTP: scripted and probabilistic faults, slow answers, dropped connections, answers
without an image, latency, the billing ledger, the request log and the admin routes."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from helpers.emulator import (
    VALID_BODIES,
    assert_error,
    chat_images,
    edit_files,
    final_images,
    http,
    native_body,
    png,
    post,
)
from starlette.requests import Request

from imagebatch.emulator import EmulatorServer, EmulatorSettings, FaultConfig
from imagebatch.emulator.admin import loopback_only
from imagebatch.emulator.chance import choose_fault
from imagebatch.emulator.errors import ServiceError
from imagebatch.emulator.settings import STATUS_FAULTS, ScriptedFault, parse_rate, parse_script
from imagebatch.gateway.constants import Route

ALL_JSON_ROUTES = [r for r in Route if r is not Route.IMAGES_EDITS]
LEDGER_FIELDS = {
    "seq", "time", "route", "model", "images", "usage", "idempotency_key", "request_id", "status", "fault",
    "attempt", "prompt",
}  # fmt: skip


# --- status faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [int(s) for s in STATUS_FAULTS])
def test_scripted_status_faults_answer_with_the_spec_error_body(
    emulator: EmulatorServer, status: int
) -> None:
    emulator.set_faults(scripts=[[status]])
    response = post(emulator, Route.NATIVE, key="k")
    assert_error(response, status)
    assert emulator.ledger() == []  # nothing generated, nothing billed
    [record] = emulator.requests()
    assert (record["status"], record["fault"], record["attempt"]) == (status, str(status), 1)
    assert post(emulator, Route.NATIVE, key="k").status_code == 200  # the script covered attempt 1 only


@pytest.mark.parametrize("route", ALL_JSON_ROUTES)
def test_faults_apply_to_every_route(emulator: EmulatorServer, route: Route) -> None:
    emulator.set_faults(scripts=[[429]])
    assert_error(post(emulator, route, key="k"), 429, "rate_limit_exceeded")
    assert post(emulator, route, key="k").status_code == 200


def test_faults_apply_to_edits(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[[502]])
    send = lambda: post(  # noqa: E731
        emulator, Route.IMAGES_EDITS, files=edit_files(png()), data={"prompt": "x"}, key="edit-key"
    )
    assert_error(send(), 502)
    assert send().status_code == 200


def test_script_counts_attempts_per_idempotency_key(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[[503, 503]])
    statuses = {
        key: [post(emulator, Route.IMAGES_GENERATIONS, key=key).status_code for _ in range(3)] for key in "ab"
    }
    assert statuses == {"a": [503, 503, 200], "b": [503, 503, 200]}
    assert [(e["idempotency_key"], e["attempt"]) for e in emulator.ledger()] == [("a", 3), ("b", 3)]
    assert emulator.attempts() == {"a": 3, "b": 3}


def test_requests_without_a_key_are_counted_by_body(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[[503]])
    assert post(emulator, Route.IMAGES_GENERATIONS).status_code == 503
    assert post(emulator, Route.IMAGES_GENERATIONS).status_code == 200  # same body: attempt 2
    other = {**VALID_BODIES[Route.IMAGES_GENERATIONS], "prompt": "another"}
    assert post(emulator, Route.IMAGES_GENERATIONS, other).status_code == 503


def test_script_with_ok_and_a_filter(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[{"outcomes": [503, "ok", 500], "match": "flaky"}])
    assert [post(emulator, Route.NATIVE, key="flaky-1").status_code for _ in range(4)] == [503, 200, 500, 200]
    assert post(emulator, Route.NATIVE, key="steady-1").status_code == 200
    # The filter also matches the prompt.
    assert post(emulator, Route.NATIVE, native_body("a flaky prompt"), key="k9").status_code == 503


def test_script_limited_to_routes(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[{"outcomes": [402], "routes": ["chat"]}])
    assert post(emulator, Route.NATIVE, key="r1").status_code == 200
    assert_error(post(emulator, Route.CHAT, key="r2"), 402, "insufficient_funds")


def test_first_matching_script_wins(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[{"outcomes": [409], "match": "x"}, [425, 425]])
    assert [post(emulator, Route.NATIVE, key="x1").status_code for _ in range(3)] == [409, 425, 200]
    assert [post(emulator, Route.NATIVE, key="y1").status_code for _ in range(3)] == [425, 425, 200]


# --- slow, drop, no_image ------------------------------------------------------------------------------


def test_slow_answer_times_out_the_client_and_is_billed(emulator: EmulatorServer) -> None:
    """The slow wait is held until the client has timed out (a loaded machine may take longer than the
    session's 0.5 s to notice a 0.2 s timeout: with a real wait the answer could come first)."""
    slow = emulator.state.settings.slow_seconds
    held, release = threading.Event(), threading.Event()

    async def hold_the_slow_wait(seconds: float) -> None:
        if seconds == slow:
            held.set()
            await asyncio.to_thread(release.wait, 120)

    emulator.configure(sleep=hold_the_slow_wait)
    emulator.set_faults(scripts=[["slow"]])
    try:
        with pytest.raises(httpx.ReadTimeout):
            post(emulator, Route.NATIVE, key="slow-1", timeout=0.2)
        assert held.is_set() and not release.is_set()  # timed out while the answer was still held
        [entry] = emulator.ledger()  # billed before the wait: visible while the answer is still pending
    finally:
        release.set()
    assert (entry["fault"], entry["status"], entry["images"]) == ("slow", 200, 1)
    assert post(emulator, Route.NATIVE, key="slow-1").status_code == 200  # attempt 2: normal
    assert len(emulator.ledger(idempotency_key="slow-1")) == 2


def test_slow_waits_slow_seconds_with_the_injected_sleep(emulator: EmulatorServer) -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    emulator.configure(sleep=fake_sleep, slow_seconds=700.0, latency=2.5)
    emulator.set_faults(scripts=[["slow"]])
    assert post(emulator, Route.CHAT, key="s").status_code == 200
    assert slept == [2.5, 700.0]  # latency, then the slow wait


def test_latency_is_slept_per_generation(emulator: EmulatorServer) -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:  # recorded, not timed: a loaded machine is slow anyway
        slept.append(seconds)

    emulator.configure(latency=0.15, sleep=fake_sleep)
    assert post(emulator, Route.RESPONSES).status_code == 200
    assert slept == [0.15]
    assert_error(post(emulator, Route.RESPONSES, auth=False), 401)  # refused requests are not delayed
    assert slept == [0.15]


@pytest.mark.parametrize("route", ALL_JSON_ROUTES)
def test_drop_closes_the_connection_without_an_answer_and_is_billed(
    emulator: EmulatorServer, route: Route
) -> None:
    emulator.set_faults(scripts=[["drop"]])
    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        post(emulator, route, key="drop-1")
    [entry] = emulator.ledger()
    assert (entry["status"], entry["fault"], entry["attempt"]) == ("drop", "drop", 1)
    [record] = emulator.requests()
    assert record["status"] == "drop"
    assert post(emulator, route, key="drop-1").status_code == 200  # the client reconnects


def test_no_image_native_is_a_200_with_safety_and_text(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[["no_image"]])
    response = post(emulator, Route.NATIVE, key="n", headers={"X-Service-Max-Images": "3"})
    assert response.status_code == 200
    candidate = response.json()["candidates"][0]
    assert candidate["finishReason"] == "SAFETY"
    assert final_images(response.json()) == []
    assert any("text" in p and not p.get("thought") for p in candidate["content"]["parts"])
    [entry] = emulator.ledger()
    assert (entry["images"], entry["fault"], entry["status"]) == (0, "no_image", 200)


def test_no_image_chat_is_text_without_a_data_url(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[["no_image"]])
    answer = post(emulator, Route.CHAT, key="n").json()
    assert chat_images(answer) == []
    assert "data:image" not in answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] == "content_filter"
    assert emulator.ledger()[0]["images"] == 0


def test_no_image_on_images_route_is_a_content_policy_400(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[["no_image"]])
    assert_error(post(emulator, Route.IMAGES_GENERATIONS, key="n"), 400, "content_policy_violation")
    assert emulator.ledger() == []


def test_no_image_leaves_text_routes_alone(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[["no_image"]])
    assert post(emulator, Route.MESSAGES, key="n").status_code == 200


# --- probabilistic faults ----------------------------------------------------------------------------


def _outcomes(server: EmulatorServer, keys: list[str]) -> list[int]:
    return [post(server, Route.MESSAGES, key=key).status_code for key in keys]


def test_probabilistic_faults_are_deterministic_per_seed_key_and_attempt(emulator: EmulatorServer) -> None:
    emulator.set_faults(rates={503: 0.3, 429: 0.2})
    keys = [f"p-{i}" for i in range(30)]
    first = _outcomes(emulator, keys)
    assert set(first) == {200, 429, 503}
    expected = [
        choose_fault(
            emulator.state.settings.faults, seed=0, route=Route.MESSAGES, key=k, prompt="", attempt=1
        )
        for k in keys
    ]
    assert first == [200 if e is None else int(e) for e in expected]
    emulator.reset()
    emulator.set_faults(rates={503: 0.3, 429: 0.2})
    # Concurrency does not change any outcome: each is a function of (seed, key, attempt).
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda k: post(emulator, Route.MESSAGES, key=k).status_code, keys)) == first
    second = _outcomes(emulator, keys)  # attempt 2 of every key: a fresh draw
    assert second != first


def test_another_seed_draws_other_faults() -> None:
    faults = FaultConfig(rates={"503": 0.5})
    draws = {
        seed: [
            choose_fault(faults, seed=seed, route=Route.NATIVE, key=f"k{i}", prompt="", attempt=1)
            for i in range(40)
        ]
        for seed in (0, 1)
    }
    assert draws[0] != draws[1]
    assert 8 <= draws[0].count("503") <= 32


def test_rates_cover_every_outcome(emulator: EmulatorServer) -> None:
    emulator.set_faults(rates={"drop": 1.0})
    with pytest.raises(httpx.RemoteProtocolError):
        post(emulator, Route.RESPONSES, key="any")


def test_fault_config_is_validated() -> None:
    with pytest.raises(ValueError):
        FaultConfig(rates={"503": 0.7, "429": 0.7})
    with pytest.raises(ValueError):
        FaultConfig(rates={"404": 0.1})
    with pytest.raises(ValueError):
        ScriptedFault(outcomes=[])
    assert parse_rate("503:0.1") == ("503", 0.1)
    assert parse_script("503,ok,drop@cat") == ScriptedFault(outcomes=["503", "ok", "drop"], match="cat")
    with pytest.raises(ValueError):
        parse_rate("503")


def test_faults_given_at_startup_survive_reset() -> None:
    settings = EmulatorSettings(api_key="k", faults=FaultConfig(scripts=[ScriptedFault(outcomes=["500"])]))
    with EmulatorServer(settings) as server:
        assert post(server, Route.RESPONSES, key="a").status_code == 500
        server.set_faults(None)
        assert post(server, Route.RESPONSES, key="b").status_code == 200
        server.reset()
        assert post(server, Route.RESPONSES, key="b").status_code == 500


# --- ledger and request log --------------------------------------------------------------------------


def test_ledger_entry_fields(emulator: EmulatorServer) -> None:
    response = post(emulator, Route.NATIVE, native_body("a kite"), key="ledger-1")
    [entry] = emulator.ledger()
    assert set(entry) == LEDGER_FIELDS
    assert entry["route"] == "native" and entry["model"] == "native-image-2"
    assert entry["idempotency_key"] == "ledger-1"
    assert entry["request_id"] == response.headers["x-request-id"]
    assert entry["status"] == 200 and entry["fault"] is None and entry["attempt"] == 1
    assert entry["prompt"] == "a kite"
    assert entry["images"] == len(final_images(response.json()))
    assert entry["usage"]["totalTokenCount"] > 0
    assert time.time() - 60 < entry["time"] <= time.time()


def test_refused_requests_are_logged_but_not_billed(emulator: EmulatorServer) -> None:
    post(emulator, Route.CHAT, auth=False, key="refused")
    post(emulator, Route.CHAT, {"model": "native-image-2"}, key="refused")
    http().get(emulator.url + "/nowhere")
    assert emulator.ledger() == []
    log = emulator.requests()
    assert [(r["route"], r["status"], r["attempt"]) for r in log] == [
        ("chat", 401, None),
        ("chat", 400, None),
        (None, 404, None),
    ]
    assert [r["idempotency_key"] for r in log] == ["refused", "refused", None]


def test_nothing_sent_means_an_empty_request_log(emulator: EmulatorServer) -> None:
    http().get(emulator.url + "/emulator/ledger")  # admin routes are not service requests
    assert emulator.requests() == [] and emulator.ledger() == []


# --- admin routes ----------------------------------------------------------------------------------


def test_admin_routes_over_http(emulator: EmulatorServer) -> None:
    admin = emulator.url + "/emulator"
    faults = {"rates": {}, "scripts": [{"outcomes": ["503"], "match": None, "routes": None}]}
    assert http().put(admin + "/faults", json={"scripts": [{"outcomes": [503]}]}).json() == faults
    assert http().get(admin + "/faults").json() == faults
    assert post(emulator, Route.NATIVE, key="adm").status_code == 503
    assert post(emulator, Route.NATIVE, key="adm").status_code == 200
    ledger = http().get(admin + "/ledger").json()
    assert [e["attempt"] for e in ledger] == [2]
    assert http().get(admin + "/ledger", params={"idempotency_key": "other"}).json() == []
    assert [r["status"] for r in http().get(admin + "/requests").json()] == [503, 200]
    assert http().get(admin + "/attempts").json() == {"adm": 2}
    settings = http().patch(admin + "/settings", json={"jpeg_rate": 1.0}).json()
    assert settings["jpeg_rate"] == 1.0 and "api_key" not in settings
    assert emulator.api_key not in http().get(admin + "/settings").text
    assert http().post(admin + "/reset").status_code == 200
    assert emulator.ledger() == [] and emulator.requests() == []
    assert http().get(admin + "/faults").json() == {"rates": {}, "scripts": []}
    assert http().get(admin + "/settings").json()["jpeg_rate"] == 0.25


@pytest.mark.parametrize(
    "body",
    [{"rates": {"503": 2}}, {"scripts": [{"outcomes": ["teapot"]}]}, {"other": 1}, {"rates": {"999": 0.1}}],
)
def test_admin_rejects_bad_fault_configs(emulator: EmulatorServer, body: dict[str, Any]) -> None:
    assert_error(http().put(emulator.url + "/emulator/faults", json=body), 400)


def test_admin_refuses_to_change_the_key(emulator: EmulatorServer) -> None:
    assert_error(http().patch(emulator.url + "/emulator/settings", json={"api_key": "x"}), 400)
    assert_error(http().patch(emulator.url + "/emulator/settings", json={"jpeg_rate": 3}), 400)


def test_admin_routes_need_no_key_but_a_loopback_client() -> None:
    def request_from(host: str) -> Request:
        return Request(
            {"type": "http", "method": "GET", "path": "/emulator/ledger", "headers": [], "client": (host, 1)}
        )

    loopback_only(request_from("127.0.0.1"))
    loopback_only(request_from("::1"))
    with pytest.raises(ServiceError) as caught:
        loopback_only(request_from("10.1.2.3"))
    assert caught.value.status == 404
