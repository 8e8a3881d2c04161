"""The `export_deliverables` flow, chained after real runs of the generation flow (the emulator, the
session's Prefect harness): the example catalog's images delivered as `{sku}/{colour}.jpg`; a rejected
image's redo (variant 2) delivered in its place; `approved_only` after review decisions; and a refused
export fails its flow run and writes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.exports import tree
from helpers.runs import run_flow
from PIL import Image

from imagebatch.flows.deliver import export_deliverables
from imagebatch.tasks.csvcells import read_csv
from imagebatch.tasks.decisions import Decision, record_decision
from imagebatch.tasks.storage import open_location

pytestmark = pytest.mark.usefixtures("prefect_harness", "restore_logging")


def test_the_catalog_delivered_after_its_run(service_env: Any, examples: Path, tmp_path: Path) -> None:
    out, dest = tmp_path / "out", tmp_path / "deliver"
    info = run_flow(manifest=str(examples / "catalog.csv"), out=str(out), report=False)
    assert info["counts"]["succeeded"] == 6
    catalog = list(read_csv(examples / "catalog.csv"))
    counts = export_deliverables(
        out=str(out), to=str(dest), name="{sku}/{colour}.{ext}", format="jpeg", max_side=512, quality=85
    )
    assert counts == {"delivered": 6, "written": 6, "unchanged": 0, "overwritten": 0}
    expected = {f"{row['sku']}/{row['colour']}.jpg" for row in catalog}
    assert set(tree(dest)) == expected | {"export.csv"}
    for name in expected:
        with Image.open(dest / name) as im:
            assert im.format == "JPEG" and max(im.size) == 512  # the emulator's images are 1024 px long
    again = export_deliverables(out=str(out), to=str(dest), name="{sku}/{colour}.{ext}", format="jpeg",
                                max_side=512, quality=85)  # fmt: skip
    assert again["written"] == 0 and again["unchanged"] == 6

    # a reviewer rejects the cobalt mug, the redo makes variant 2: delivered in place of variant 1
    results = {row["job_id"]: row for row in read_csv(out / "results.csv")}
    record_decision(
        open_location(out), Decision(results["mug-cobalt"]["idempotency_key"], 1, "rejected", "dull")
    )
    run_flow(manifest=str(examples / "catalog.csv"), out=str(out), report=False, redo="rejected")
    variant2 = [
        r for r in read_csv(out / "results.csv") if r["job_id"] == "mug-cobalt" and r["variant"] == "2"
    ]
    assert len(variant2) == 1 and variant2[0]["status"] == "succeeded"
    redone = export_deliverables(out=str(out), to=str(dest), name="{sku}/{colour}.{ext}", format="jpeg",
                                 max_side=512, quality=85)  # fmt: skip
    # the emulator draws an image from its prompt, so the new sample has the old one's pixels: nothing
    # to write (the same bytes are no conflict), and export.csv now names variant 2 and its file
    assert redone == {"delivered": 6, "written": 0, "unchanged": 6, "overwritten": 0}
    listed = {row["path"]: row for row in read_csv(dest / "export.csv")}
    assert listed["SKU-1001/cobalt blue.jpg"]["variant"] == "2"
    assert listed["SKU-1001/cobalt blue.jpg"]["source"] == variant2[0]["paths"]

    record_decision(open_location(out), Decision(variant2[0]["idempotency_key"], 2, "approved"))
    record_decision(open_location(out), Decision(results["mug-sage"]["idempotency_key"], 1, "approved"))
    approved = tmp_path / "approved"
    assert export_deliverables(out=str(out), to=str(approved), name="{sku}.{ext}", approved_only=True) == {
        "delivered": 2, "written": 2, "unchanged": 0, "overwritten": 0
    }  # fmt: skip
    assert sorted(tree(approved)) == ["SKU-1001.png", "SKU-1002.png", "export.csv"]

    state = export_deliverables(out=str(out), to=str(tmp_path / "clash"), name="{product_name}.jpg",
                                format="jpeg", return_state=True)  # fmt: skip
    assert state.is_failed()
    assert "both are named 'ceramic mug.jpg'" in str(state.message) + repr(
        state.result(raise_on_failure=False)
    )
    assert not (tmp_path / "clash").exists()


def test_the_flow_refuses_a_name_wider_than_a_name_may_be(make_out: Any, tmp_path: Path) -> None:
    """Issue 29 #6, through the flow's `name` parameter: refused at once, nothing written."""
    made = make_out()
    made.add("hat", [b"not read"], sku="SKU-3", colour="blue")
    made.write()
    state = export_deliverables(
        out=str(made.root), to=str(tmp_path / "dest"), name="{job_id:>999999999}.{ext}", return_state=True
    )
    assert state.is_failed()
    assert "asks for a width of 999999999" in str(state.message) + repr(state.result(raise_on_failure=False))
    assert not (tmp_path / "dest").exists()
