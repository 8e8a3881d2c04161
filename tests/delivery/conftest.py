"""tests/export: `make_out(name)` gives an `OutMaker` (tests/helpers/exports.py) in the test's tmp folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.exports import OutMaker


@pytest.fixture
def make_out(tmp_path: Path) -> Callable[..., OutMaker]:
    def make(name: str = "out", metadata: tuple[str, ...] = ("sku", "colour")) -> OutMaker:
        return OutMaker(tmp_path / name, list(metadata))

    return make
