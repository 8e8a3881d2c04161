"""A page's DOM after its scripts ran, in the system's headless Chromium (the test skips without it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def dom(page: Path, profile: Path, fragment: str = "") -> str:
    """The DOM of `page` (opened as `file://...` + `fragment`) once its scripts ran, in a window tall
    enough for lazy images to load; `profile`: a fresh folder for Chromium's profile."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run does)")
    done = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1400,6000",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri() + fragment],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
