"""Helpers for the emulator tests: request builders per route, tiny images, answer decoding."""

from __future__ import annotations

import atexit
import base64
import functools
import re
from typing import Any

import httpx

from imagebatch.emulator import EmulatorServer, EmulatorSettings
from imagebatch.gateway.constants import COMPAT_VERSION_HEADER, DEFAULT_COMPAT_VERSION, Route

from .images import b64, jpeg, open_image, png

__all__ = ["b64", "jpeg", "open_image", "png"]

API_KEY = "test-emulator-key"
SLOW_SECONDS = 0.5
"""How long a `slow` fault waits on the session server; use a client timeout well below it (e.g. 0.2 s)."""


def emulator_settings(**changes: Any) -> EmulatorSettings:
    """The tests' emulator settings: the session server's (tests/conftest.py: `API_KEY`, seed 0, a `slow`
    fault of `SLOW_SECONDS`, the default image mix, no faults), with `changes`. A second server that must
    answer like the session's (a twin) or unlike it (another seed) is built from these too."""
    return EmulatorSettings(**{"api_key": API_KEY, "seed": 0, "slow_seconds": SLOW_SECONDS, **changes})


def run_emulator_settings(api_key: str, **changes: Any) -> EmulatorSettings:
    """The settings of an emulator of its own for runs of the flow (deployments, workers): its own key, PNG
    images only (`jpeg_rate=0`), with `changes` (a latency, faults)."""
    return EmulatorSettings(**{"api_key": api_key, "seed": 0, "jpeg_rate": 0.0, **changes})


NATIVE_PATH = "/v1beta/models/{model}:generateContent"
PATHS = {route: route.path for route in Route}
DATA_URL = re.compile(r"data:(image/(?:png|jpeg));base64,([A-Za-z0-9+/=]+)")


@functools.cache
def http() -> httpx.Client:
    """One client for all emulator tests: creating an httpx client costs ~50 ms (its SSL context)."""
    client = httpx.Client(timeout=30.0)
    atexit.register(client.close)
    return client


def auth_headers(server: EmulatorServer, route: Route) -> dict[str, str]:
    """The credentials the spec asks for on `route`."""
    if route is Route.NATIVE:
        return {"x-native-api-key": server.api_key}
    if route is Route.MESSAGES:
        return {"x-api-key": server.api_key, COMPAT_VERSION_HEADER: DEFAULT_COMPAT_VERSION}
    return {"Authorization": f"Bearer {server.api_key}"}


def native_body(
    prompt: str = "a red bicycle", size: str | None = None, ratio: str | None = None
) -> dict[str, Any]:
    image_config: dict[str, str] = {}
    if size:
        image_config["imageSize"] = size
    if ratio:
        image_config["aspectRatio"] = ratio
    config: dict[str, Any] = {"responseModalities": ["IMAGE"]}
    if image_config:
        config["imageConfig"] = image_config
    return {"contents": [{"role": "user", "parts": [{"text": prompt}]}], "generationConfig": config}


VALID_BODIES: dict[Route, dict[str, Any]] = {
    Route.NATIVE: native_body(),
    Route.CHAT: {"model": "native-image-2", "messages": [{"role": "user", "content": "a red bicycle"}]},
    Route.IMAGES_GENERATIONS: {"model": "compat-image-2", "prompt": "a red bicycle"},
    Route.MESSAGES: {
        "model": "text-model-1",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
    },
    Route.RESPONSES: {"model": "text-model-2", "input": "hi"},
}


def path_of(route: Route, model: str = "native-image-2") -> str:
    return NATIVE_PATH.format(model=model) if route is Route.NATIVE else route.path


def post(
    server: EmulatorServer,
    route: Route,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    model: str = "native-image-2",
    key: str | None = None,
    auth: bool = True,
    timeout: float = 30.0,
    files: Any = None,
    data: Any = None,
) -> httpx.Response:
    """POST to `route` with its credentials (unless `auth=False`); JSON body, or multipart for edits."""
    all_headers = dict(auth_headers(server, route)) if auth else {}
    if key is not None:
        all_headers["Idempotency-Key"] = key
    all_headers.update(headers or {})
    url = server.url + path_of(route, model)
    if route is Route.IMAGES_EDITS or files is not None:
        return http().post(url, headers=all_headers, files=files, data=data, timeout=timeout)
    if body is None:
        body = VALID_BODIES[route]
    return http().post(url, headers=all_headers, json=body, timeout=timeout)


def edit_files(*images: bytes, mask: bytes | None = None, field: str = "image") -> list[tuple[str, Any]]:
    files: list[tuple[str, Any]] = [
        (field, (f"img{i}.png", data, "image/png")) for i, data in enumerate(images)
    ]
    if mask is not None:
        files.append(("mask", ("mask.png", mask, "image/png")))
    return files


def final_images(answer: dict[str, Any]) -> list[tuple[str, bytes]]:
    """(mime type, bytes) of every final image of a native answer (thought parts skipped)."""
    parts = answer["candidates"][0]["content"]["parts"]
    return [
        (p["inlineData"]["mimeType"], base64.b64decode(p["inlineData"]["data"]))
        for p in parts
        if "inlineData" in p and not p.get("thought")
    ]


def chat_images(answer: dict[str, Any]) -> list[tuple[str, bytes]]:
    content = answer["choices"][0]["message"]["content"]
    return [(m.group(1), base64.b64decode(m.group(2))) for m in DATA_URL.finditer(content)]


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """Check the spec's error body and the request id header; return the body."""
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert set(body) == {"error", "message"}
    assert set(body["error"]) == {"message", "type", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["message"] == body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body
    assert response.headers["x-request-id"].startswith("req_")
    return body
