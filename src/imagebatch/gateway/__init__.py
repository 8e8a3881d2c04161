"""The service's wire: constants, models, request builders, the HTTP client, its results and errors, and
the emulator. Nothing here knows Prefect or manifests.

    from imagebatch.gateway import GatewayClient, requests

    with GatewayClient(base_url, api_key) as client:
        result = client.send(requests.native("native-image-2.1", "a red kite"), idempotency_key=key)
"""

from . import requests
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
    "requests",
]
