"""The manifest tests' folder: good and bad reference images under images/ (helpers.manifests)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.manifests import manifest_folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return manifest_folder(tmp_path)
