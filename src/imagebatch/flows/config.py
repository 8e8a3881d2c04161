"""Run configuration read from options and the environment, checked before Prefect or any request starts.

Kept free of Prefect imports so that the command can refuse a bad configuration at once.
"""

from __future__ import annotations

import os

from imagebatch.gateway.client import normalise_base_url
from imagebatch.gateway.errors import ConfigurationError

MAX_CONCURRENCY = 32
DEFAULT_CONCURRENCY = 4
ENV_BASE_URL = "IMAGEBATCH_BASE_URL"
ENV_API_KEY = "IMAGEBATCH_API_KEY"


class UsageError(Exception):
    """The run cannot start as asked (configuration, options); nothing was sent."""


def check_api_key(key: str) -> str:
    """A key that cannot go into an HTTP header is refused before anything is sent (never echoed)."""
    if not key or not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise UsageError(
            "the API key is empty or holds spaces, line breaks or non-ASCII characters; check how it was set"
        )
    return key


def resolve_api_key(secret_block: str | None) -> str | None:
    """The key from the named Prefect Secret block, else from the environment; never a flow parameter.

    A block named explicitly wins over the environment, so a stale variable cannot bill another account.
    """
    if secret_block:
        from prefect.blocks.system import Secret

        try:
            value = Secret.load(secret_block).get()
        except Exception as exc:  # Prefect raises ValueError for a missing block, others for bad ones
            raise UsageError(
                f"could not read the Prefect Secret block {secret_block!r}: {type(exc).__name__}"
            ) from None
        return check_api_key(str(value))
    key = os.environ.get(ENV_API_KEY)
    return check_api_key(key) if key else None


def resolve_base_url(base_url: str | None) -> str | None:
    """The service root from the option or `IMAGEBATCH_BASE_URL`, checked; None means the emulator."""
    url = base_url or os.environ.get(ENV_BASE_URL) or None
    if url is None:
        return None
    try:
        return normalise_base_url(url)
    except ConfigurationError as exc:
        raise UsageError(exc.message) from None
