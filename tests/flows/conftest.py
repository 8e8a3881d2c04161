"""Fixtures for the flow tests: one Prefect test harness for the session, manifests in tmp folders."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import imagebatch.flows  # noqa: F401 - sets Prefect's environment defaults before Prefect is imported

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"


@pytest.fixture(scope="session", autouse=True)
def prefect_harness() -> Iterator[str]:
    """One temporary Prefect server and database for the whole session (it takes ~10 s to start)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield str(PREFECT_API_URL.value())


@pytest.fixture
def service_env(emulator: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point runs at the session emulator, with its key in the environment (never a flow parameter)."""
    monkeypatch.setenv("IMAGEBATCH_BASE_URL", emulator.url)
    monkeypatch.setenv("IMAGEBATCH_API_KEY", emulator.api_key)
    emulator.configure(jpeg_rate=0.0, thought_image_rate=0.3)
    return emulator


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """A copy of manifests/examples in a tmp folder (tests may edit it)."""
    dest = tmp_path / "examples"
    shutil.copytree(EXAMPLES, dest)
    return dest


QUIETED_LOGGERS = ("prefect.task_runs", "prefect.flow_runs", "prefect", "httpx", "uvicorn")


@pytest.fixture(autouse=True)
def _restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`run` quiets Prefect's loggers for the terminal; undo that so other tests' caplog still sees INFO."""
    levels = {name: logging.getLogger(name).level for name in QUIETED_LOGGERS}
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING"))
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
