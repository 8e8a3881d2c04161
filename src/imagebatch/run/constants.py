"""Values the flow modules share: the flow's name, Prefect's final state types and the shard grace.

Imports nothing, so that the command's parser (`cli.main`) may name the flow without loading Prefect.
"""

from __future__ import annotations

FLOW_NAME = "generate_from_manifest"
"""The flow's name on Prefect's server: deployments are `generate_from_manifest/NAME`."""

TERMINAL_STATES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
"""Prefect's state types a run (flow or task) never leaves."""

SHARD_GRACE = 120.0
"""Seconds a Running shard's lock may be free before its run counts as crashed (`run.shards`): longer
than a shard's start-up, before it takes the lock."""
