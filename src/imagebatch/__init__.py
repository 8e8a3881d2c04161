"""imagebatch: drive an image-generation gateway in bulk from CSV/JSON/XLSX/Parquet manifests with Prefect.

`imagebatch.results(OUT)` gives a notebook an output location's results, usage and review decisions as
pandas DataFrames (`imagebatch.tasks.frames`); it is imported on first use, so `import imagebatch` (and
every command) does not import pandas.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from imagebatch.tasks.frames import Results, results

try:
    __version__ = version("imagebatch")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = ["Results", "__version__", "results"]


def __getattr__(name: str) -> Any:
    """`results` and `Results`, imported when first asked for (they import pandas)."""
    if name in ("results", "Results"):
        from imagebatch.tasks import frames

        return getattr(frames, name)
    raise AttributeError(f"module 'imagebatch' has no attribute {name!r}")
