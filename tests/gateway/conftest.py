"""Fixtures of the gateway tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.fake_gateway import FakeService


@pytest.fixture
def service() -> Iterator[FakeService]:
    """The fake service, its client closed after the test."""
    fake = FakeService()
    yield fake
    fake.close()
