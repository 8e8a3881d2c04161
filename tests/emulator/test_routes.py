"""Emulator over real HTTP: paths (404/405), auth per route (401), check order, request id, error body."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from helpers.emulator import VALID_BODIES, assert_error, auth_headers, edit_files, http, path_of, png, post

from imagebatch.emulator import EmulatorServer, EmulatorSettings, create_app
from imagebatch.gateway.constants import COMPAT_VERSION_HEADER, DEFAULT_COMPAT_VERSION, NATIVE_MODELS, Route

JSON_ROUTES = [r for r in Route if r is not Route.IMAGES_EDITS]


# --- 404 / 405 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/v1/images/generation",  # typo
        "/v1beta/images/generations",  # wrong prefix
        "/v2/chat/completions",
        "/v1/v1/chat/completions",  # base URL that already ends in /v1
        "/v1/models/native-image-2:generateContent",  # wrong version prefix
        "/v1beta/v1beta/models/native-image-2:generateContent",
        "/v1beta/models/native-image-3:generateContent",  # model outside the public set
        "/v1beta/models/compat-image-2:generateContent",
        "/v1beta/models/NATIVE-IMAGE-2:generateContent",
        "/v1beta/models/native-image-2:streamGenerateContent",  # streaming is not served
        "/v1beta/models/native-image-2",
        "/v1beta/models/native-image-2:generateContent/extra",
        "/v1/messages/",
    ],
)
def test_unknown_paths_get_404_in_the_spec_error_body(emulator: EmulatorServer, path: str) -> None:
    # Correct credentials for every route: the 404 must not depend on them.
    headers = {**auth_headers(emulator, Route.NATIVE), **auth_headers(emulator, Route.CHAT)}
    response = http().post(emulator.url + path, headers=headers, json=VALID_BODIES[Route.NATIVE])
    body = assert_error(response, 404)
    assert body["error"]["type"] == "not_found_error"
    assert emulator.ledger() == []


def test_unknown_model_in_the_path_is_model_not_found(emulator: EmulatorServer) -> None:
    response = post(emulator, Route.NATIVE, model="native-image-3")
    assert "native-image-3" in assert_error(response, 404, "model_not_found")["error"]["message"]


def test_404_comes_before_auth(emulator: EmulatorServer) -> None:
    response = post(emulator, Route.NATIVE, model="native-image-9", auth=False)
    assert_error(response, 404, "model_not_found")


@pytest.mark.parametrize("route", list(Route))
def test_wrong_method_is_405_in_the_spec_error_body(emulator: EmulatorServer, route: Route) -> None:
    response = http().get(emulator.url + path_of(route), headers=auth_headers(emulator, route))
    assert_error(response, 405, "method_not_allowed")


def test_service_has_no_docs_pages(emulator: EmulatorServer) -> None:
    for path in ("/docs", "/openapi.json", "/redoc"):
        assert_error(http().get(emulator.url + path), 404)


# --- 401 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", JSON_ROUTES)
@pytest.mark.parametrize("variant", ["missing", "wrong", "other provider"])
def test_missing_or_wrong_key_is_401(emulator: EmulatorServer, route: Route, variant: str) -> None:
    if variant == "missing":
        headers = {COMPAT_VERSION_HEADER: DEFAULT_COMPAT_VERSION} if route is Route.MESSAGES else {}
    else:
        key = "wrong-key" if variant == "wrong" else "sk-ant-api03-another-providers-key"
        headers = {name: (key if value == emulator.api_key else value.replace(emulator.api_key, key))
                   for name, value in auth_headers(emulator, route).items()}  # fmt: skip
    response = post(emulator, route, headers=headers, auth=False)
    body = assert_error(response, 401)
    assert body["error"]["type"] == "authentication_error"
    assert body["error"]["code"] == ("missing_api_key" if variant == "missing" else "invalid_api_key")
    assert "another-providers-key" not in response.text  # a rejected key is never echoed back
    assert emulator.ledger() == []


def test_edits_route_needs_bearer(emulator: EmulatorServer) -> None:
    files = edit_files(png())
    data = {"prompt": "make it blue"}
    assert_error(post(emulator, Route.IMAGES_EDITS, files=files, data=data, auth=False), 401)
    wrong = {"x-native-api-key": emulator.api_key}
    assert_error(post(emulator, Route.IMAGES_EDITS, files=files, data=data, auth=False, headers=wrong), 401)
    assert post(emulator, Route.IMAGES_EDITS, files=files, data=data).status_code == 200


def test_native_accepts_either_header_but_not_both(emulator: EmulatorServer) -> None:
    bearer = {"Authorization": f"Bearer {emulator.api_key}"}
    native = {"x-native-api-key": emulator.api_key}
    assert post(emulator, Route.NATIVE, auth=False, headers=bearer).status_code == 200
    assert post(emulator, Route.NATIVE, auth=False, headers=native).status_code == 200
    assert_error(post(emulator, Route.NATIVE, auth=False, headers={**bearer, **native}), 401)


@pytest.mark.parametrize("route", [Route.CHAT, Route.IMAGES_GENERATIONS, Route.RESPONSES])
@pytest.mark.parametrize("header", ["x-native-api-key", "x-api-key"])
def test_bearer_routes_refuse_other_key_headers(emulator: EmulatorServer, route: Route, header: str) -> None:
    assert_error(post(emulator, route, auth=False, headers={header: emulator.api_key}), 401)


def test_bearer_scheme_is_required(emulator: EmulatorServer) -> None:
    headers = {"Authorization": f"Basic {emulator.api_key}"}
    assert_error(post(emulator, Route.CHAT, auth=False, headers=headers), 401)


def test_messages_route_wants_x_api_key_and_compat_version_and_no_bearer(emulator: EmulatorServer) -> None:
    key = {"x-api-key": emulator.api_key}
    version = {COMPAT_VERSION_HEADER: DEFAULT_COMPAT_VERSION}
    bearer = {"Authorization": f"Bearer {emulator.api_key}"}
    assert post(emulator, Route.MESSAGES, auth=False, headers={**key, **version}).status_code == 200
    assert_error(post(emulator, Route.MESSAGES, auth=False, headers=key), 401, "missing_compat_version")
    assert_error(post(emulator, Route.MESSAGES, auth=False, headers={**bearer, **version}), 401)
    assert_error(post(emulator, Route.MESSAGES, auth=False, headers={**key, **version, **bearer}), 401)


@pytest.mark.parametrize("route", list(Route))
def test_query_key_is_400_beside_a_header_and_401_alone(emulator: EmulatorServer, route: Route) -> None:
    # Credentials are checked before the query string (README row 1): a `?key=` never stands in for the
    # header, so without the header the answer is 401; beside a valid header the query string is a 400.
    url = emulator.url + path_of(route) + f"?key={emulator.api_key}"
    if route is Route.IMAGES_EDITS:
        extra = {"files": edit_files(png()), "data": {"prompt": "make it blue"}}
    else:
        extra = {"json": VALID_BODIES[route]}
    with_header = http().post(url, headers=auth_headers(emulator, route), **extra)
    assert "key" in assert_error(with_header, 400, "invalid_request")["error"]["message"]
    only_query = {COMPAT_VERSION_HEADER: DEFAULT_COMPAT_VERSION} if route is Route.MESSAGES else {}
    response = http().post(url, headers=only_query, **extra)
    assert_error(response, 401, "missing_api_key")
    assert emulator.api_key not in response.text
    assert emulator.ledger() == []


# --- check order -----------------------------------------------------------------------------------


def test_auth_comes_before_headers_and_body(emulator: EmulatorServer) -> None:
    headers = {"X-Service-Max-Images": "9", "Content-Type": "application/json"}
    response = http().post(emulator.url + path_of(Route.NATIVE), headers=headers, content=b"{not json")
    assert_error(response, 401)


def test_header_check_comes_before_body(emulator: EmulatorServer) -> None:
    response = post(emulator, Route.NATIVE, {"nonsense": True}, headers={"X-Service-Max-Images": "0"})
    assert "X-Service-Max-Images" in assert_error(response, 400)["error"]["message"]


def test_body_check_comes_before_faults(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[[503]])
    assert_error(post(emulator, Route.NATIVE, {"contents": []}, key="k1"), 400)
    assert emulator.attempts() == {}  # refused requests are not attempts
    assert_error(post(emulator, Route.NATIVE, key="k1"), 503)


# --- request id ------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", JSON_ROUTES)
def test_every_answer_has_a_request_id(emulator: EmulatorServer, route: Route) -> None:
    ok = post(emulator, route)
    assert ok.status_code == 200, ok.text
    unauthorised = post(emulator, route, auth=False)
    assert unauthorised.status_code == 401
    ids = {ok.headers["x-request-id"], unauthorised.headers["x-request-id"]}
    assert len(ids) == 2
    ledger = emulator.ledger()
    assert [e["request_id"] for e in ledger] == [ok.headers["x-request-id"]]
    logged = {r["request_id"]: r["status"] for r in emulator.requests()}
    assert logged == {ok.headers["x-request-id"]: 200, unauthorised.headers["x-request-id"]: 401}


def test_request_id_on_404_and_405(emulator: EmulatorServer) -> None:
    assert http().get(emulator.url + "/nowhere").headers["x-request-id"].startswith("req_")
    assert http().get(emulator.url + "/v1/responses").headers["x-request-id"].startswith("req_")


@pytest.mark.parametrize("model", NATIVE_MODELS)
def test_each_native_model_is_served(emulator: EmulatorServer, model: str) -> None:
    response = post(emulator, Route.NATIVE, model=model)
    assert response.status_code == 200
    assert response.json()["modelVersion"] == model


# --- the app factory ---------------------------------------------------------------------------------


def test_apps_have_separate_state_and_bugs_answer_500_in_the_spec_body() -> None:
    first = create_app(EmulatorSettings(api_key="one"))
    second = create_app(EmulatorSettings(api_key="two"))
    assert first.emulator is not second.emulator

    async def broken() -> None:
        raise RuntimeError("boom")

    first.add_api_route("/broken", broken, methods=["POST"])

    async def call() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=first, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://emulator") as client:
            responses = [await client.post("/broken")]
            responses.append(await client.post("/v1/responses", headers={"Authorization": "Bearer two"}))
            return responses

    broken_answer, wrong_key = asyncio.run(call())
    assert_error(broken_answer, 500, "internal_error")
    assert_error(wrong_key, 401)  # the key of the other app is not this app's key
    assert [r["status"] for r in first.emulator.requests()] == [500, 401]
    assert second.emulator.requests() == []
