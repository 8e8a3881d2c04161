"""tests/work: `h`, a `Harness` (tests/helpers/units.py) in the test's tmp folder, its clients closed
after the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.units import Harness


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.close()
