"""One shard of a sharded run, run here on the session's emulator (the parent, its workers and the merge:
tests/platform/test_deploy_shards*.py): the counts it ends with are its own units' records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.runs import run_flow, write_jsonl

from imagebatch.manifest import load_manifest, plan
from imagebatch.run.shards import shard_of
from imagebatch.work.context import group_units


def test_a_shard_counts_each_of_its_units_once_whether_it_sent_it_or_found_it_done(
    service_env: Any, tmp_path: Path, out: Path
) -> None:
    rows = [{"id": f"j{i}", "route": "images", "prompt": f"a vase, number {i}"} for i in range(12)]
    manifest = write_jsonl(tmp_path / "m.jsonl", rows)
    own = [u for u in group_units(plan(load_manifest(manifest))) if shard_of(u, 2) == 0]
    assert 0 < len(own) < len(rows)

    first = run_flow(str(manifest), str(out), shards=2, shard=0)
    assert dict(first["counts"]) == {"succeeded": len(own)}
    assert len(service_env.requests()) == len(own)

    again = run_flow(str(manifest), str(out), shards=2, shard=0)  # every unit recorded here, none sent
    assert dict(again["counts"]) == {"skipped": len(own)}
    assert len(service_env.requests()) == len(own)
