"""The shards' flow runs of a sharded run, created on Prefect's server by its parent (`run.shard_runs`
watches them to their end): each under an idempotency key, asked again while the server stalls."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from imagebatch.run.shards import shard_name


def create_shard_runs(
    deployment: str,
    parameters: dict[int, dict[str, Any]],
    shards: int,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    stopped: Callable[[], str | None] = lambda: None,
) -> dict[int, Any]:
    """The ids of the shard runs of `deployment`, by shard, one for each shard in `parameters` (its flow
    parameters: `run.shards.shard_parameters`), created as sub-runs of this one (none started yet), each
    under an idempotency key of this run and its shard: a creation asked again after an answer that did
    not come (Prefect's client, or `created` below, for a server stalled under load) gives back the same
    run, never a second run of the shard that nobody tracks and a worker would start once this run has
    ended."""
    from prefect.context import FlowRunContext
    from prefect.deployments import run_deployment

    context = FlowRunContext.get()
    parent = context.flow_run.id if context is not None and context.flow_run is not None else None
    started = {}
    for i, shard in parameters.items():
        name = f"shard {shard_name(i, shards)}"
        key = f"imagebatch-shard:{parent}:{i}" if parent else None
        ask = partial(
            run_deployment, deployment, parameters=shard, timeout=0, as_subflow=True, flow_run_name=name,
            idempotency_key=key,
        )  # fmt: skip
        started[i] = created(ask, name, clock, sleep, stopped, CREATE_PATIENCE if key else 0.0)
    return {i: run.id for i, run in started.items()}


CREATE_PATIENCE = 600.0
"""Seconds the parent goes on asking Prefect's server to create a shard's run while it answers with a
server error or not at all (each ask is Prefect's client's, which has retried for about a minute): a
server stalled for minutes by a busy night (SQLite answering 503 while its database is locked) delays the
run rather than failing it before it sends anything."""


def created(
    ask: Callable[[], Any],
    name: str,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    stopped: Callable[[], str | None],
    patience: float = CREATE_PATIENCE,
) -> Any:
    """`ask()`'s answer, asked again (5 s, 10 s, ... up to a minute apart) after a server error (5xx) or no
    answer, for `patience` seconds; anything else, a stop (`stopped()`), or the end of patience raises.
    Only for a creation that is safe to ask again: one under an idempotency key."""
    import httpx
    from prefect.logging import get_run_logger

    deadline, wait = clock() + patience, 5.0
    while True:
        try:
            return ask()
        except (httpx.HTTPStatusError, httpx.TransportError) as exc:
            status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
            if (status is not None and status < 500) or stopped() or clock() + wait > deadline:
                raise
            get_run_logger().warning(
                "%s: Prefect's server did not create its run (%s); asking again in %g s (the same "
                "idempotency key: never a second run)", name, status or type(exc).__name__, wait,
            )  # fmt: skip
            sleep(wait)
            wait = min(2 * wait, 60.0)
