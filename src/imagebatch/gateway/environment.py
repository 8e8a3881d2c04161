"""The service's settings read from the environment, each in one place: the API key and the service
root (the variables' names are `constants`'). An option given on the command line or in a deployment
comes first; the key is never an option (it must not reach a parameter, a log or Prefect's database).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .constants import ENV_API_KEY, ENV_BASE_URL


def api_key_from_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """The API key in `IMAGEBATCH_API_KEY`, or None when it is unset or empty."""
    return (os.environ if environ is None else environ).get(ENV_API_KEY) or None


def base_url_or_environment(option: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The service root: `option` (`--base-url`), else `IMAGEBATCH_BASE_URL`, else None (unset or empty)."""
    return option or (os.environ if environ is None else environ).get(ENV_BASE_URL) or None
