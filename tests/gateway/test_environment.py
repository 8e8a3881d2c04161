"""The one reading of the API key and the service root from the environment (`gateway.environment`)."""

from __future__ import annotations

import pytest

from imagebatch.gateway.constants import ENV_API_KEY, ENV_BASE_URL
from imagebatch.gateway.environment import api_key_from_environment, base_url_or_environment


def test_the_key_is_read_from_its_variable_and_an_empty_one_is_none() -> None:
    assert api_key_from_environment({ENV_API_KEY: "sk-1"}) == "sk-1"
    assert api_key_from_environment({ENV_API_KEY: ""}) is None
    assert api_key_from_environment({}) is None


def test_the_process_environment_is_read_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_API_KEY, "sk-2")
    monkeypatch.setenv(ENV_BASE_URL, "https://gw.example")
    assert api_key_from_environment() == "sk-2"
    assert base_url_or_environment(None) == "https://gw.example"


def test_the_option_comes_before_the_variable_and_neither_is_none() -> None:
    env = {ENV_BASE_URL: "https://env.example"}
    assert base_url_or_environment("https://option.example", env) == "https://option.example"
    assert base_url_or_environment(None, env) == "https://env.example"
    assert base_url_or_environment("", env) == "https://env.example"
    assert base_url_or_environment(None, {ENV_BASE_URL: ""}) is None
    assert base_url_or_environment(None, {}) is None
