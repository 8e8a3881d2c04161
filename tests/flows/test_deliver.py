"""The `export_deliverables` flow, chained after real runs of the generation flow (the emulator, the
session's Prefect harness): the example catalog's images delivered as `{sku}/{colour}.jpg`; a rejected
image's redo (variant 2) delivered in its place; `approved_only` after review decisions; and a refused
export fails its flow run and writes nothing; after a row changes, an approved-only export (the command)
ships no stale file and names the missing deliverable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.exports import OutMaker, encoded, tree
from helpers.runs import cli, run_flow
from PIL import Image

from imagebatch.delivery.aside import ASIDE_FOLDER
from imagebatch.delivery.destlock import exclusive
from imagebatch.delivery.options import ExportOptions
from imagebatch.flows.deliver import export_deliverables
from imagebatch.storage.csvcells import read_csv
from imagebatch.storage.kinds import open_location
from imagebatch.work.decisions import Decision, record_decision

pytestmark = pytest.mark.usefixtures("prefect_harness", "restore_logging")
PNG = encoded(Image.new("RGB", (8, 8), (0, 0, 255)), "PNG")


def test_the_catalog_delivered_after_its_run(service_env: Any, examples: Path, tmp_path: Path) -> None:
    out, dest = tmp_path / "out", tmp_path / "deliver"
    info = run_flow(manifest=str(examples / "catalog.csv"), out=str(out), report=False)
    assert info["counts"]["succeeded"] == 6
    catalog = list(read_csv(examples / "catalog.csv"))
    jpeg = ExportOptions(name="{sku}/{colour}.{ext}", format="jpeg", max_side=512, quality=85)
    counts = export_deliverables(out=str(out), to=str(dest), options=jpeg)
    assert counts == {"delivered": 6, "written": 6, "unchanged": 0, "replaced": 0, "overwritten": 0,
                      "missing": 0, "set_aside": 0}  # fmt: skip
    expected = {f"{row['sku']}/{row['colour']}.jpg" for row in catalog}
    assert set(tree(dest)) == expected | {"export.csv"}
    for name in expected:
        with Image.open(dest / name) as im:
            assert im.format == "JPEG" and max(im.size) == 512  # the emulator's images are 1024 px long
    again = export_deliverables(out=str(out), to=str(dest), options=jpeg)
    assert again["written"] == 0 and again["unchanged"] == 6 and again["missing"] == 0

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
    redone = export_deliverables(out=str(out), to=str(dest), options=jpeg)
    # the emulator draws an image from its prompt, so the new sample has the old one's pixels: nothing
    # to write (the same bytes are no conflict), and export.csv now names variant 2 and its file
    assert (redone["delivered"], redone["written"], redone["unchanged"], redone["set_aside"]) == (6, 0, 6, 0)
    listed = {row["path"]: row for row in read_csv(dest / "export.csv")}
    assert listed["SKU-1001/cobalt blue.jpg"]["variant"] == "2"
    assert listed["SKU-1001/cobalt blue.jpg"]["source"] == variant2[0]["paths"]

    record_decision(open_location(out), Decision(variant2[0]["idempotency_key"], 2, "approved"))
    record_decision(open_location(out), Decision(results["mug-sage"]["idempotency_key"], 1, "approved"))
    approved = tmp_path / "approved"
    made = export_deliverables(
        out=str(out), to=str(approved), options=ExportOptions(name="{sku}.{ext}", approved_only=True)
    )
    assert (made["delivered"], made["written"], made["missing"]) == (2, 2, 4)
    assert sorted(tree(approved)) == ["SKU-1001.png", "SKU-1002.png", "export.csv"]

    clash = ExportOptions(name="{product_name}.jpg", format="jpeg")
    state = export_deliverables(out=str(out), to=str(tmp_path / "clash"), options=clash, return_state=True)
    assert state.is_failed()
    assert "both are named 'ceramic mug.jpg'" in str(state.message) + repr(
        state.result(raise_on_failure=False)
    )
    assert not (tmp_path / "clash").exists()


def test_after_a_row_changes_an_approved_only_export_ships_no_stale_file(
    service_env: Any, examples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest, out, dest = examples / "catalog.csv", tmp_path / "out", tmp_path / "deliver"
    run_flow(manifest=str(manifest), out=str(out), report=False)
    for row in read_csv(out / "results.csv"):
        record_decision(open_location(out), Decision(row["idempotency_key"], 1, "approved", "", "ana"))
    argv = ["export", str(out), "--to", str(dest), "--name", "{sku}/{colour}.{ext}", "--approved-only"]
    code, stdout, err = cli(capsys, *argv)
    assert code == 0 and "exported 6 images" in stdout, err
    before = tree(dest)

    # the vase's row changes after its image was approved: the run makes a new, unreviewed image
    manifest.write_text(manifest.read_text().replace("on a shelf with books", "on a windowsill"))
    info = run_flow(manifest=str(manifest), out=str(out), report=False)
    assert info["counts"]["succeeded"] == 1
    code, stdout, err = cli(capsys, *argv)
    assert code == 0, err
    assert "exported 5 images" in stdout and "1 missing" in stdout
    assert "(job 'vase-white', request 0): changed since approval (SKU-5001/matte white.png)" in stdout
    assert "1 file of an earlier export not delivered now, moved to" in stdout
    assert "\n  SKU-5001/matte white.png" in stdout
    rows = {row["job_id"]: row for row in read_csv(dest / "export.csv")}
    delivered = {row["path"] for row in rows.values() if row["status"] == "delivered"}
    shipped = {n for n in tree(dest) if n != "export.csv" and not n.startswith(f"{ASIDE_FOLDER}/")}
    assert shipped == delivered and len(delivered) == 5  # no file in DEST that export.csv does not list
    vase = rows["vase-white"]
    assert (vase["status"], vase["reason"], vase["path"]) == ("missing", "changed since approval", "")
    assert (vase["sku"], vase["product_name"], vase["colour"]) == (
        "SKU-5001",
        "stoneware vase",
        "matte white",
    )
    mug = rows["mug-cobalt"]
    assert (mug["sku"], mug["colour"], mug["decision"], mug["reviewer"]) == (
        "SKU-1001",
        "cobalt blue",
        "approved",
        "ana",
    )
    assert mug["decided_at"].endswith("Z") and mug["variant"] == "1"
    (aside,) = [n for n in tree(dest) if n.startswith(f"{ASIDE_FOLDER}/")]
    assert (
        aside.endswith("/SKU-5001/matte white.png")
        and tree(dest)[aside] == before["SKU-5001/matte white.png"]
    )

    # once the new image is approved it is delivered under the same name, and nothing is missing
    new = next(r for r in read_csv(out / "results.csv") if r["job_id"] == "vase-white")
    record_decision(open_location(out), Decision(new["idempotency_key"], 1, "approved", "", "ana"))
    code, stdout, err = cli(capsys, *argv)
    assert code == 0 and "exported 6 images" in stdout and "1 written, 5 unchanged" in stdout, err
    assert (
        "missing" not in stdout
        and tree(dest)["SKU-5001/matte white.png"] != before["SKU-5001/matte white.png"]
    )


def test_the_flow_refuses_a_name_wider_than_a_name_may_be(tmp_path: Path) -> None:
    """Issue 29 #6, through the flow's `name` parameter: refused at once, nothing written."""
    made = OutMaker(tmp_path / "out", ["sku", "colour"])
    made.add("hat", [b"not read"], sku="SKU-3", colour="blue")
    made.write()
    state = export_deliverables(
        out=str(made.root),
        to=str(tmp_path / "dest"),
        options={"name": "{job_id:>999999999}.{ext}"},
        return_state=True,
    )
    assert state.is_failed()
    assert "asks for a width of 999999999" in str(state.message) + repr(state.result(raise_on_failure=False))
    assert not (tmp_path / "dest").exists()


def test_the_flow_is_refused_while_another_export_holds_dest(tmp_path: Path) -> None:
    """One export into a DEST at a time, the flow's as the command's: its run Failed, DEST untouched."""
    made = OutMaker(tmp_path / "out", ["sku", "colour"])
    made.add("hat", [PNG], sku="SKU-3", colour="blue")
    made.write()
    dest = tmp_path / "dest"
    with exclusive(open_location(str(dest))):
        state = export_deliverables(out=str(made.root), to=str(dest), return_state=True)
        assert state.is_failed()
        said = str(state.message) + repr(state.result(raise_on_failure=False))
        assert "another export into it is running" in said
        assert tree(dest) == {}
    assert export_deliverables(out=str(made.root), to=str(dest))["written"] == 1


def test_a_flow_run_made_with_the_earlier_flat_parameters_exports_as_they_say(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A deployment made before the options were one parameter gives its runs `name`, `format`...: the
    run (made on the server with those parameters, then run as a worker's flow process runs it: Prefect's
    engine given the flow run alone, which binds its stored parameters to the flow's signature) reads them
    into `options` and warns to redeploy."""
    from prefect import get_client
    from prefect.flow_engine import run_flow as run_flow_run

    made = OutMaker(tmp_path / "out", ["sku", "colour"])
    made.add("hat", [PNG], sku="SKU-3", colour="blue")
    made.write()
    dest = tmp_path / "dest"
    flat = {"out": str(made.root), "to": str(dest), "name": "{sku}.{ext}", "format": "jpeg"}
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run(export_deliverables, parameters=flat)
    counts = run_flow_run(export_deliverables, flow_run=flow_run)
    assert counts["written"] == 1 and sorted(tree(dest)) == ["SKU-3.jpg", "export.csv"]
    assert "parameters format, name were read into `options`; redeploy the flow" in caplog.text
