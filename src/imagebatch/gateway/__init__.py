"""The service's wire: constants, models, request builders, the HTTP client, its results and errors.
Nothing here knows Prefect or manifests, nor the emulator (`imagebatch.emulator`, the room above).

    from imagebatch.gateway import GatewayClient, requests

    with GatewayClient(base_url, api_key) as client:
        result = client.send(requests.native("native-image-2.1", "a red kite"), idempotency_key=key)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import GatewayClient, normalise_base_url
    from .results import (
        AttemptEvent,
        AttemptFinished,
        AttemptObserver,
        AttemptStarted,
        GeneratedImage,
        GenerationResult,
        ImageResult,
        ImageUpload,
        NoImageResult,
        TextResult,
    )

# Imported when first used, not with the package: a module that needs only the constants (the command's
# parser, the options model) does not load the client and httpx (bench/README.md, "Redesign").
_WHERE = {
    "GatewayClient": ".client",
    "normalise_base_url": ".client",
    "AttemptEvent": ".results",
    "AttemptFinished": ".results",
    "AttemptObserver": ".results",
    "AttemptStarted": ".results",
    "GeneratedImage": ".results",
    "GenerationResult": ".results",
    "ImageResult": ".results",
    "ImageUpload": ".results",
    "NoImageResult": ".results",
    "TextResult": ".results",
}


def __getattr__(name: str) -> Any:
    """The package's names, each imported from its module when first asked for."""
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AttemptEvent",
    "AttemptFinished",
    "AttemptObserver",
    "AttemptStarted",
    "GatewayClient",
    "GeneratedImage",
    "GenerationResult",
    "ImageResult",
    "ImageUpload",
    "NoImageResult",
    "TextResult",
    "normalise_base_url",
]
