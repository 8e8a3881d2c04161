"""imagebatch: drive an image-generation gateway in bulk from CSV/JSON/XLSX/Parquet manifests with Prefect.

`imagebatch.results(OUT)` gives a notebook an output location's results, usage and review decisions as
pandas DataFrames (`imagebatch.delivery.frames`); it is imported on first use, so `import imagebatch` (and
every command) does not import pandas.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from imagebatch.delivery.frames import Results, results

# Prefect's telemetry is off unless the user turns it on (set the variables to true / 0). Two reasons:
# the ephemeral server's telemetry heartbeat writes to its SQLite database while the server is starting
# and loses the race for the lock ("database is locked" tracebacks on the user's terminal), and the
# client-side telemetry prints a notice over our progress bar and reports to a host these machines
# cannot reach. These must be set before Prefect reads its settings, hence in the package's root,
# which every module of ours imports first.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

# The version is pyproject.toml's, read from the installed metadata: one place to write it.
try:
    __version__ = version("imagebatch")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = ["Results", "__version__", "results"]


def __getattr__(name: str) -> Any:
    """`results` and `Results`, imported when first asked for (they import pandas)."""
    if name in ("results", "Results"):
        from imagebatch.delivery import frames

        return getattr(frames, name)
    raise AttributeError(f"module 'imagebatch' has no attribute {name!r}")
