"""Run configuration read from options and the environment, checked before Prefect or any request starts.

`preflight` is the one set of checks both the command (before Prefect's start-up) and the flow (when it
runs on its own, from a script or a deployment) make. Kept free of Prefect imports (a Secret block is read
only when one is named) so that the command can refuse a bad configuration at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebatch.errors import UsageError
from imagebatch.gateway.client import normalise_base_url
from imagebatch.gateway.constants import ENV_API_KEY, ENV_PRICES
from imagebatch.gateway.environment import api_key_from_environment, base_url_or_environment
from imagebatch.gateway.errors import ConfigurationError
from imagebatch.manifest import Job, Manifest, load_manifest
from imagebatch.options import RunOptions
from imagebatch.storage.bounded import RecordError
from imagebatch.storage.location import is_object_url, shown_url
from imagebatch.work.prices import PriceError, PriceTable
from imagebatch.work.store import OutputLockedError, OutputStore

EMBEDDED = "embedded"
"""The service address that names the embedded emulator (`--base-url embedded`,
`IMAGEBATCH_BASE_URL=embedded`): how a deployment asks for it, since one without an address is refused."""
NO_SERVICE = (
    "no service address for a deployment's runs: deploy with --base-url URL (or set IMAGEBATCH_BASE_URL "
    "where it runs); the embedded emulator only when named: --base-url embedded"
)


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
            block: Any = Secret.load(secret_block)  # the sync form: a block, not a coroutine, here
            value = block.get()
        except Exception as exc:  # Prefect raises ValueError for a missing block, others for bad ones
            raise UsageError(
                f"could not read the Prefect Secret block {secret_block!r}: {type(exc).__name__}"
            ) from None
        return check_api_key(str(value))
    key = api_key_from_environment()
    return check_api_key(key) if key else None


def resolve_base_url(base_url: str | None, *, deployed: bool = False) -> str | None:
    """The service root from the option or `IMAGEBATCH_BASE_URL`, checked; None means the emulator.

    Outside a deployment no address means the emulator (the quick start); in one (`deployed`), the
    emulator only when named `embedded`: a scheduled run on placeholders is refused (`NO_SERVICE`)."""
    url = base_url_or_environment(base_url)
    if url is None and deployed:
        raise UsageError(NO_SERVICE)
    if url is None or url.strip().lower() == EMBEDDED:
        return None
    try:
        return normalise_base_url(url)
    except ConfigurationError as exc:
        raise UsageError(exc.message) from None


def key_source(secret_block: str | None) -> str:
    """Where the key is read from, as a message names it (never the key itself)."""
    return f"the Prefect Secret block {secret_block!r}" if secret_block else ENV_API_KEY


def locked(exc: OutputLockedError) -> UsageError:
    return UsageError(f"{exc}: wait for it to finish (two runs into one folder would send twice)")


def out_text(out: Path | str) -> str:
    """The output location as run.json and a shard's parameters name it: a folder's absolute path, or the
    object store's URL."""
    return out if isinstance(out, str) else str(out.resolve())


def output_location(out: str | Path) -> Path | str:
    """`--out` as the run keeps it: an object store's URL (`s3://bucket/prefix`) as text, else a path."""
    text = str(out)
    return text.rstrip("/") if is_object_url(text) else Path(text.removeprefix("file://"))


def check_output(out: Path | str, lock: bool = True) -> None:
    """The output location can be used: a bucket exists and takes these credentials (a listing), a
    folder can be made and written and holds no record that is not a file, its run.json (if any) is one
    its model reads, and (`lock`) no live run holds it: its hold is taken and let go (a shard's run does
    not look: its parent and the other shards hold it). One line naming the place and the cause, never a
    credential (they come from the store's standard chain)."""
    try:
        store = OutputStore(out)
    except ValueError as exc:
        raise UsageError(f"--out {shown_url(str(out))}: {exc}") from None
    except Exception as exc:  # obstore refuses its configuration (an unknown region, a bad variable)
        cause = f"the store's configuration is refused ({type(exc).__name__})"
        raise UsageError(f"--out {shown_url(str(out))}: {cause}") from None
    if why := store.backend.check():
        raise UsageError(f"--out {store.where}: {why}")
    try:
        store.backend.make_ready()
        store.read_run()  # a run.json its model refuses: refused here, before Prefect starts
        if lock:
            with store.backend.hold():
                pass
    except OutputLockedError as exc:
        raise locked(exc) from None
    except RecordError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--out {store.where} cannot be written: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class Preflight:
    """What the checks made before a run found: the loaded manifest and the service root (None: emulator)."""

    manifest: Manifest
    out: Path | str
    """The output folder, or an object store's URL (`s3://bucket/prefix`)."""
    base_url: str | None
    prices: PriceTable | None = None


def check_redo(options: RunOptions) -> None:
    """`--edit` only with `--redo`, and `--redo` never with `--force`, which remakes every first sample
    instead (the kinds `--redo` takes are checked by the model: `work.variants.redo_kinds`)."""
    resend = options.resend
    if resend.edit and resend.redo is None:
        raise UsageError("--edit makes the variants of --redo rejected as edits: give --redo rejected too")
    if resend.redo is not None and resend.force:
        raise UsageError("--redo and --force cannot go together: --force makes every request again")


def preflight(
    manifest: str | Path,
    out: str | Path,
    options: RunOptions,
    *,
    shard: bool = False,
    deployed: bool = False,
    keep: Callable[[Job], bool] | None = None,
) -> Preflight:
    """Every check that needs neither Prefect nor the service: the manifest and its files (inside the
    manifest's folder or `files_root`), the options beyond their own bounds (the model's), the output
    folder, the base URL and the key's presence and form. Raises `ManifestError` or `UsageError`.
    `deployed`: a deployment's run (or the deploying command), which needs an address (`resolve_base_url`).
    `keep`: the jobs the run holds (a shard's: `run.shards.shard_keeps`), every row checked all the same."""
    roots = options.inputs.files_root
    loaded = load_manifest(manifest, files_root=roots, keep=keep)  # a path, or an object's URL
    check_redo(options)
    budgets, block = options.budgets, options.service.api_key_secret_block
    try:
        table = PriceTable.from_option(budgets.prices)
    except PriceError as exc:
        raise UsageError(str(exc)) from None
    if budgets.max_spend is not None and table is None:
        raise UsageError(
            f"--max-spend {budgets.max_spend:g} needs a price table (--prices FILE or ${ENV_PRICES})"
        )
    url = resolve_base_url(options.service.base_url, deployed=deployed)
    if url and not block:
        key = api_key_from_environment()
        if not key:
            raise UsageError(f"{url} needs an API key: set {ENV_API_KEY} (or --api-key-block NAME)")
        check_api_key(key)
    where = output_location(out)
    check_output(where, lock=not shard)
    return Preflight(loaded, where, url, table)
