"""What a deployment's run may ask beyond what its deployment was made with, and where its worker lets it
write and send: decided before anything is read or sent (docs/security.md, "Deployment runs").

Anyone who can reach the Prefect API can start a deployment's run with any parameters. The worker that
runs it holds the service's key and writes where its machine can, so the run is checked against two
things the API cannot change: the deployment's own stored parameters, and the worker's environment.

- **Options only a person at a terminal decides** (`options.RUN_ONLY`: `force`, `retry_unknown`, which
  pay again for what is done or may have been billed) must be what the deployment was made with.
- **`role`** (a sharded run's part) must be the deployment's own, or a shard's role on a run that the
  sharded run's parent started (a sub-run of a Running parent whose shard deployment is this one).
- **`out`** must lie inside one of the worker's `IMAGEBATCH_ALLOWED_OUT` roots (folders, symlinks and
  `..` resolved; or an object store's prefixes); with none set, it must be the deployment's own.
- **`base_url`** must be one of the worker's `IMAGEBATCH_ALLOWED_BASE_URLS` (`embedded` names the emulator);
  with none set, it must be the deployment's own: the worker's key goes only where its deployment said.

`imagebatch run` on a terminal is its operator's and none of this applies to it. The decisions are pure
functions of their inputs (`refusal`); `policy_from_environment` reads the worker's lists.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from imagebatch.errors import UsageError
from imagebatch.gateway.client import normalise_base_url
from imagebatch.gateway.errors import ConfigurationError
from imagebatch.options import RunOptions, ShardRole, cli_of, fields
from imagebatch.run.preflight import EMBEDDED, output_location
from imagebatch.storage.location import is_object_url
from imagebatch.storage.objectstore import split_url

ENV_ALLOWED_OUT = "IMAGEBATCH_ALLOWED_OUT"
"""The worker's output roots, comma separated: absolute folders, or object store prefixes (s3://b/p)."""
ENV_ALLOWED_BASE_URLS = "IMAGEBATCH_ALLOWED_BASE_URLS"
"""The service roots the worker's key may go to, comma separated (`embedded`: the embedded emulator)."""

REFUSED = "imagebatch refused: "
"""How a refused run's state message begins (never `final_state.PREFIX`: a refused shard did not run)."""


class Refused(UsageError):
    """A deployment's run asks what its deployment or its worker does not allow; nothing was read or sent."""


@dataclass(frozen=True)
class Asked:
    """The parameters of a run (or of its deployment), validated: what the checks compare."""

    out: str
    options: RunOptions
    role: ShardRole


@dataclass(frozen=True)
class Policy:
    """The worker's allow-lists (None: not set, so a run keeps its deployment's own value)."""

    out_roots: tuple[str, ...] | None = None
    base_urls: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Parent:
    """The flow run that started a shard's run, as the shard finds it on the server."""

    asked: Asked
    state: str | None
    """Its state type (`RUNNING`)."""


def run_only_fields() -> tuple[str, ...]:
    """The options a deployment's run may not change from its deployment's (`options.RUN_ONLY`)."""
    return tuple(name for name, info in fields().items() if cli_of(info).commands == frozenset({"run"}))


def resend_refusal(asked: Asked, stored: Asked, deployment: str) -> str | None:
    """A run-only option (`force`, `retry_unknown`) the run sets otherwise than its deployment."""
    for name in run_only_fields():
        value, own = _flat(asked.options)[name], _flat(stored.options)[name]
        if value != own:
            return (
                f"options {name}={_shown(value)} but deployment {deployment} was made with {name}="
                f"{_shown(own)}: it resends what may already be paid for, which only `imagebatch run` on a "
                "terminal decides"
            )
    return None


def role_refusal(asked: Asked, stored: Asked, deployment: str, parent: Parent | None) -> str | None:
    """`role` set otherwise than the deployment's, unless a shard's, on a run its Running parent started."""
    role = asked.role
    if role == stored.role:
        return None
    hand_set = (
        f"role {role.model_dump(exclude_none=True)} is set by imagebatch for a sharded run's parts, never by "
        f"hand; this run of {deployment} was not started by a sharded run"
    )
    if role.shard is None or role.shard_deployment is not None or stored.role.shard is not None:
        return hand_set
    if parent is None or parent.asked.role.shard_deployment != deployment:
        return hand_set
    if parent.state != "RUNNING":
        return f"role shard {role.shard}: the sharded run that started it is {parent.state}, not running"
    shards = parent.asked.options.sharding.shards
    if asked.options.sharding.shards != shards or not 0 <= role.shard < shards:
        return f"role shard {role.shard} is not one of its sharded run's {shards} shards"
    return None


def out_refusal(out: str, own: str, roots: tuple[str, ...] | None) -> str | None:
    """`out` outside the worker's roots, or (with none) not the deployment's own output."""
    if roots is None:
        if _place(out) == _place(own):
            return None
        return (
            f"out {out} is not the output of its deployment ({own}); a deployment's run writes elsewhere "
            f"only inside its worker's {ENV_ALLOWED_OUT}"
        )
    if any(_inside(_place(out), _place(root)) for root in roots):
        return None
    return f"out {out} is outside this worker's output roots ({ENV_ALLOWED_OUT}={','.join(roots)})"


def base_url_refusal(
    base_url: str | None, own: str | None, worker_url: str | None, allowed: tuple[str, ...] | None
) -> str | None:
    """The service the run would send to (its `base_url`, else the worker's `IMAGEBATCH_BASE_URL`) not in
    the worker's list, or (with none) a `base_url` other than the deployment's own."""
    if allowed is None:
        if _service(base_url) == _service(own):
            return None
        return (
            f"base_url {base_url or '(none)'} is not the service of its deployment ({own or 'none'}): this "
            f"worker's API key goes elsewhere only to its {ENV_ALLOWED_BASE_URLS}"
        )
    target = _service(base_url or worker_url)
    if target is None or target in {_service(url) for url in allowed}:
        return None  # no service at all is `preflight`'s to refuse
    shown = base_url or worker_url
    return (
        f"base_url {shown} is not one of this worker's services ({ENV_ALLOWED_BASE_URLS}={','.join(allowed)})"
    )


def refusal(
    asked: Asked,
    stored: Asked,
    deployment: str,
    policy: Policy,
    parent: Parent | None = None,
    worker_url: str | None = None,
) -> str | None:
    """Why a run of `deployment` (stored parameters `stored`) may not start as `asked`, or None.
    `worker_url`: the worker's own `IMAGEBATCH_BASE_URL`."""
    try:
        return (
            role_refusal(asked, stored, deployment, parent)
            or resend_refusal(asked, stored, deployment)
            or out_refusal(asked.out, stored.out, policy.out_roots)
            or base_url_refusal(
                asked.options.service.base_url, stored.options.service.base_url, worker_url, policy.base_urls
            )
        )
    except ConfigurationError as exc:  # a base URL that is no service root
        return f"base_url: {exc.message}"
    except ValueError as exc:  # an output that is no folder nor object store prefix
        return f"out: {exc}"


def policy_from_environment(environ: Mapping[str, str] = os.environ) -> Policy:
    """The worker's allow-lists from its environment; `Refused` naming the variable for a bad entry."""
    return Policy(_entries(environ, ENV_ALLOWED_OUT), _entries(environ, ENV_ALLOWED_BASE_URLS))


def check_entry(variable: str, entry: str) -> None:
    """An allow-list entry: an absolute folder or an object store prefix; a service root or `embedded`.
    ValueError saying what is wrong with it."""
    try:
        if variable == ENV_ALLOWED_BASE_URLS:
            _service(entry)
        elif not is_object_url(entry) and not Path(entry).expanduser().is_absolute():
            raise ValueError("not an absolute folder nor an object store prefix (s3://bucket/prefix)")
        else:
            _place(entry)
    except ConfigurationError as exc:
        raise ValueError(exc.message) from None


def _entries(environ: Mapping[str, str], variable: str) -> tuple[str, ...] | None:
    text = environ.get(variable, "").strip()
    if not text:
        return None
    entries = tuple(e.strip() for e in text.split(",") if e.strip())
    for entry in entries:
        try:
            check_entry(variable, entry)
        except ValueError as exc:
            raise Refused(f"this worker's {variable}: {entry!r}: {exc}") from None
    return entries


def _place(out: str) -> tuple[str, ...]:
    """An output location as comparable segments: a folder's real path (symlinks and `..` resolved, as the
    run would write it), or (scheme, bucket, prefix segments); ValueError for a `.` or `..` in a key."""
    where = output_location(out)
    if isinstance(where, Path):
        return ("file", *Path(os.path.realpath(where.expanduser())).parts)
    scheme, bucket, prefix = split_url(where)
    segments = prefix.split("/") if prefix else []
    if any(s in ("", ".", "..") for s in segments):
        raise ValueError(f"{out}: an object key with an empty, '.' or '..' segment")
    return (scheme, bucket, *segments)


def _inside(place: tuple[str, ...], root: tuple[str, ...]) -> bool:
    return place[: len(root)] == root


def _service(url: str | None) -> str | None:
    """A service root as compared: normalised, scheme and host in lower case; `embedded` as itself."""
    if url is None or not url.strip():
        return None
    if url.strip().lower() == EMBEDDED:
        return EMBEDDED
    root = normalise_base_url(url)
    scheme, rest = root.split("://", 1)
    host, _, path = rest.partition("/")
    return f"{scheme.lower()}://{host.lower()}" + (f"/{path}" if path else "")


def _flat(options: RunOptions) -> dict[str, object]:
    return options.flat()


def _shown(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
