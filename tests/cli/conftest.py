"""The flow tests: each runs in the session's Prefect test harness (`prefect_harness`, started at the
first), with the loggers `run` quiets restored after it (`restore_logging`); both are in tests/conftest.py,
which tests/report uses too."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _flow_test(prefect_harness: str, restore_logging: None) -> None:
    """Every test here: the harness, and the loggers restored."""
