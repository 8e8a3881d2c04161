"""The service a run sends to: the configured address with its API key, or, with no address configured, the
embedded emulator on 127.0.0.1 with a key made for this run alone."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

from prefect.logging import get_run_logger

from imagebatch.errors import UsageError
from imagebatch.run.hooks import RunHooks
from imagebatch.run.preflight import key_source, resolve_api_key


@contextlib.contextmanager
def service(base_url: str | None, secret_block: str | None, hooks: RunHooks) -> Iterator[tuple[str, str]]:
    """Yield (base_url, api_key): the configured service, or the embedded emulator (no base URL), served
    while the block runs."""
    if base_url:
        key = resolve_api_key(secret_block)
        if not key:
            why = f"set {key_source(None)} or name a Prefect Secret block"
            raise UsageError(f"no API key for {base_url}: {why}")
        yield base_url, key
        return
    # Imported only here: a run with an address never loads the emulator's server (FastAPI, uvicorn).
    from imagebatch.emulator import EmulatorServer, EmulatorSettings

    key = "emulator-" + secrets.token_hex(16)
    with EmulatorServer(EmulatorSettings(api_key=key, **hooks.emulator_settings)) as server:
        get_run_logger().info(
            "No service address configured: using the embedded emulator at %s; "
            "its images are placeholders, not real generations.",
            server.url,
        )
        yield server.url, key
