"""GatewayClient's configuration (against the shared fake service): the base URL it accepts and the fix it
names when it refuses one, the key it needs and never shows, and each route's timeouts."""

from __future__ import annotations

import pytest
from helpers.fake_gateway import (
    ALL_ROUTES,
    BASE,
    KEY,
    ROUTES,
    FakeService,
)

from imagebatch.gateway import (
    GatewayClient,
)
from imagebatch.gateway.constants import Route
from imagebatch.gateway.errors import (
    ConfigurationError,
)

# === base URL and configuration ==========================================================================


@pytest.mark.parametrize(
    ("base_url", "suffix", "fix"),
    [
        ("http://gw.test/v1", "/v1", "http://gw.test"),
        ("http://gw.test/v1/", "/v1", "http://gw.test"),
        ("http://gw.test/v1beta", "/v1beta", "http://gw.test"),
        ("https://gw.test/api/v1beta/", "/v1beta", "https://gw.test/api"),
    ],
)
def test_base_url_with_version_suffix_is_refused_naming_the_fix(base_url: str, suffix: str, fix: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        GatewayClient(base_url, KEY)
    assert f"without {suffix}" in str(info.value)
    assert repr(fix) in str(info.value)


@pytest.mark.parametrize("base_url", ["ftp://gw.test", "gw.test", "localhost:8000", "", "  ", "http://[::1"])
def test_base_url_must_be_http(base_url: str) -> None:
    with pytest.raises(ConfigurationError, match="http"):
        GatewayClient(base_url, KEY)


@pytest.mark.parametrize(
    "base_url",
    [
        "http://user:s3cret@gw.test",
        "https://user@gw.test/relay",
        "user:s3cret@gw.test",
        "ftp://u:s3cret@gw/v1",
    ],
)
def test_base_url_with_userinfo_is_refused_without_echoing_it(base_url: str) -> None:
    with pytest.raises(ConfigurationError, match="user name or password") as info:
        GatewayClient(base_url, KEY)
    assert "s3cret" not in str(info.value) and "robot" not in str(info.value)


def test_an_at_sign_in_the_path_is_no_userinfo() -> None:
    assert GatewayClient("http://gw.test/a@b", KEY).base_url == "http://gw.test/a@b"


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("http://gateway.test/", "http://gateway.test/v1/responses"),
        ("http://gateway.test", "http://gateway.test/v1/responses"),
        ("https://gateway.test/relay/", "https://gateway.test/relay/v1/responses"),
    ],
)
def test_base_url_trailing_slash_and_prefix_are_kept_right(
    service: FakeService, base_url: str, expected: str
) -> None:
    ROUTES["responses"](service.reply(ROUTES["responses"].ok).client(base_url=base_url))
    assert str(service.request.url) == expected


def test_api_key_is_required() -> None:
    with pytest.raises(ConfigurationError, match="API key"):
        GatewayClient(BASE, "")


def test_client_repr_hides_the_key(service: FakeService) -> None:
    assert KEY not in repr(service.client())


# === timeouts ============================================================================================

DEFAULT_READ_TIMEOUT = {
    "native": 650,
    "chat": 650,
    "images_generations": 650,
    "images_edits": 650,
    "messages": 3000,
    "responses": 3000,
}


@pytest.mark.parametrize("name", ALL_ROUTES)
def test_default_timeouts(service: FakeService, name: str) -> None:
    ROUTES[name](service.reply(ROUTES[name].ok).client())
    timeout = service.request.extensions["timeout"]
    expected = DEFAULT_READ_TIMEOUT[name]
    assert timeout["read"] == timeout["write"] == timeout["pool"] == expected
    assert 0 < timeout["connect"] <= expected


@pytest.mark.parametrize("name", ALL_ROUTES)
def test_timeouts_are_configurable(service: FakeService, name: str) -> None:
    client = service.reply(ROUTES[name].ok).client(image_timeout=12.5, text_timeout=99.0)
    ROUTES[name](client)
    expected = 99.0 if ROUTES[name].route in (Route.MESSAGES, Route.RESPONSES) else 12.5
    assert service.request.extensions["timeout"]["read"] == expected
