"""Values the flow modules share: the flow's name, Prefect's final state types and the shard grace.

Imports nothing, so that the command's parser (`cli.main`) may name the flow without loading Prefect.
"""

from __future__ import annotations

FLOW_NAME = "generate_from_manifest"
"""The flow's name on Prefect's server: deployments are `generate_from_manifest/NAME`."""

FINAL_STATE_NAMES = ("Completed", "Failed", "Cancelled", "Crashed")
"""Prefect's final states, by the names its events carry (`prefect.flow-run.Failed`): a run (flow or task)
never leaves one."""
TERMINAL_STATES = tuple(name.upper() for name in FINAL_STATE_NAMES)
"""The same states by their types, as the API's filters and a run's `state_type` say them."""

SHARD_GRACE = 120.0
"""Seconds a Running shard's lock may be free before its run counts as crashed (`run.shards`): longer
than a shard's start-up, before it takes the lock."""
