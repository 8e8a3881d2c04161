"""The end-to-end flow tests: each runs with the session's Prefect harness and the loggers `run` quiets
restored after it (the `prefect` fixture, tests/conftest.py), so each is `slow`."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _flow_test(prefect: str) -> None:
    """Every test here runs the flow."""
