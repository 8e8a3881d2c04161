"""Values the flow modules share: the flows' names, Prefect's final states, and the graces of a stop.

Imports nothing, so that the command's parser (`cli.main`) may name the flow without loading Prefect.
"""

from __future__ import annotations

FLOW_NAME = "generate_from_manifest"
"""The batch flow's name on Prefect's server: deployments are `generate_from_manifest/NAME`."""
EXPORT_FLOW_NAME = "export-deliverables"
"""The export flow's name on Prefect's server."""

INTERRUPTED = "interrupted"
"""How the stop reason of a run stopped by a signal begins (`interrupted (SIGTERM)`)."""

FINAL_STATE_NAMES = ("Completed", "Failed", "Cancelled", "Crashed")
"""Prefect's final states, by the names its events carry (`prefect.flow-run.Failed`): a run (flow or task)
never leaves one."""
TERMINAL_STATES = tuple(name.upper() for name in FINAL_STATE_NAMES)
"""The same states by their types, as the API's filters and a run's `state_type` say them."""

SHARD_GRACE = 120.0
"""Seconds a Running shard's lock may be free before its run counts as crashed (`run.shards`): longer
than a shard's start-up, before it takes the lock."""

STOP_GRACE = 25.0
"""Seconds the requests in flight get after a run's first stop signal before they are abandoned
(`run.graceful_stop`): inside Prefect's 30 s between its SIGTERM and its SIGKILL on a cancellation."""
RECORDING = 10.0
"""Seconds a stopped run takes, once its requests have finished, to write its records and report its
state."""
SHARDED_STOP_GRACE = STOP_GRACE + RECORDING
"""A sharded run's parent sends nothing itself: it waits for its shards' own stop (`STOP_GRACE` and their
records) before it gives up on them."""
WORKER_GRACE = SHARDED_STOP_GRACE + RECORDING
"""Seconds `imagebatch worker` waits for its flow runs to stop before it stops Prefect's worker: the
longest of its runs' graces (a sharded parent's), and the parent's own records."""
NEVER_STARTED = 300.0
"""Seconds a shard a worker claimed may take to start before it counts as crashed."""
