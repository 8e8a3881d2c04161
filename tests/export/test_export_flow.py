"""The `export_deliverables` flow, chained after a real run of the generation flow (the emulator, the
session's Prefect harness): the example catalog's images delivered as `{sku}/{colour}.jpg`; and a refused
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

    state = export_deliverables(out=str(out), to=str(tmp_path / "clash"), name="{product_name}.jpg",
                                format="jpeg", return_state=True)  # fmt: skip
    assert state.is_failed()
    assert "both are named 'ceramic mug.jpg'" in str(state.message) + repr(
        state.result(raise_on_failure=False)
    )
    assert not (tmp_path / "clash").exists()
