"""The 1.x compatibility promise (docs/changelog.md): a deployment's flow parameters and an output folder
made by 1.0 are read by every later 1.x. The flows' parameter schemas of 1.0.0 are a committed snapshot
(tests/fixtures/flow-parameters-1.0.json, never regenerated within 1.x): a parameter removed or made
required breaks a deployment made earlier, an optional one added does not. tests/fixtures/output-1.0 is
an output folder a real 1.0.0 run made on the embedded emulator, with its manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import cli, summary_counts

from imagebatch import results
from imagebatch.flows.batch import generate_from_manifest
from imagebatch.flows.deliver import export_deliverables
from imagebatch.run.exit_codes import EXIT_OK

FIXTURES = Path(__file__).parent / "fixtures"
SNAPSHOT = FIXTURES / "flow-parameters-1.0.json"
OUTPUT_1_0 = FIXTURES / "output-1.0"


def current_schemas() -> dict[str, Any]:
    """Each flow's parameter schema as a deployment stores it, by flow name."""
    flows = (generate_from_manifest, export_deliverables)
    return {flow.name: flow.parameters.model_dump(mode="json") for flow in flows}


def _objects(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The schema's object types by name: the parameters themselves ("") and each definition."""
    return {"": schema, **schema.get("definitions", {})}


def breaks(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What makes parameters valid under `old` invalid under `new`: a property removed, one made
    required, an object type gone."""
    found = []
    new_objects = _objects(new)
    for name, before in _objects(old).items():
        after = new_objects.get(name)
        where = name or "parameters"
        if after is None:
            found.append(f"{where}: removed")
            continue
        gone = [p for p in before.get("properties", {}) if p not in after["properties"]]
        found += [f"{where}.{p}: removed" for p in gone]
        required = set(after.get("required", [])) - set(before.get("required", []))
        found += [f"{where}.{p}: now required" for p in sorted(required)]
    return found


def still_read(flow: str) -> set[str]:
    """The parameters a flow no longer declares but still reads into its own (the export flow's flat
    options, read into `options`: `flows.compat.EarlierShapeFlow.earlier_parameters`)."""
    flows = {f.name: f for f in (generate_from_manifest, export_deliverables)}
    return {f"parameters.{p}: removed" for p in getattr(flows[flow], "earlier_parameters", ())}


def test_every_flow_reads_the_parameters_1_0_gave() -> None:
    snapshot = json.loads(SNAPSHOT.read_text())
    now = current_schemas()
    assert sorted(snapshot) == sorted(now), "a flow a 1.0 deployment names is gone or renamed"
    found = {
        flow: [b for b in breaks(snapshot[flow], now[flow]) if b not in still_read(flow)] for flow in now
    }
    assert found == {flow: [] for flow in snapshot}


def test_the_export_parameters_of_a_1_0_deployment_are_read_into_its_options() -> None:
    """Each flat parameter 1.0's export flow declared, at its 1.0 default or a value of its own."""
    schema = json.loads(SNAPSHOT.read_text())["export-deliverables"]["properties"]
    given = {name: spec.get("default") for name, spec in schema.items()} | {"out": "/o", "to": "/d"}
    given |= {"format": "webp", "quality": 80, "canvas": "100x100", "slug": True}
    options = export_deliverables.validate_parameters(given)["options"]
    assert options.model_dump() == {k: v for k, v in given.items() if k not in ("out", "to")}


def test_a_removed_or_required_parameter_breaks_and_an_added_optional_one_does_not() -> None:
    old = json.loads(SNAPSHOT.read_text())["generate_from_manifest"]
    added = json.loads(json.dumps(old))
    added["definitions"]["Pacing"]["properties"]["burst"] = {"type": "integer", "default": 1}
    added["properties"]["note"] = {"type": "string", "default": ""}
    assert breaks(old, added) == []
    removed = json.loads(json.dumps(old))
    del removed["definitions"]["Pacing"]["properties"]["rpm"]
    del removed["properties"]["options"]
    assert breaks(old, removed) == ["parameters.options: removed", "Pacing.rpm: removed"]
    required = json.loads(json.dumps(old))
    required["definitions"]["Pacing"]["required"] = ["concurrency"]
    required["required"].append("options")
    assert breaks(old, required) == ["parameters.options: now required", "Pacing.concurrency: now required"]


@pytest.fixture
def folder_1_0(tmp_path: Path) -> Path:
    """A copy of the 1.0 output folder and its manifest (a run writes into it)."""
    return Path(shutil.copytree(OUTPUT_1_0, tmp_path / "output-1.0"))


def test_the_notebook_api_reads_a_1_0_output_folder(folder_1_0: Path) -> None:
    read = results(folder_1_0 / "out")
    assert sorted(read.results["job_id"]) == ["lamp", "mug"]
    assert set(read.results["status"]) == {"succeeded"}
    assert all((folder_1_0 / "out" / path).is_file() for path in read.results["paths"])
    assert len(read.usage) > 0 and read.decisions.empty


@pytest.mark.slow
def test_a_rerun_over_a_1_0_output_folder_sends_nothing(
    folder_1_0: Path, capsys: Any, service_env: Any
) -> None:
    out = folder_1_0 / "out"
    code, printed, err = cli(capsys, "run", str(folder_1_0 / "manifest.csv"), "--out", str(out))
    assert code == EXIT_OK, err
    assert summary_counts(printed) == {"skipped": 2}
    assert service_env.requests() == []
