"""imagebatch: drive an image-generation gateway in bulk from CSV/JSON manifests with Prefect."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("imagebatch")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"
