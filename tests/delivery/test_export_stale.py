"""`imagebatch export` never ships a stale file: an earlier export's file this one does not deliver is
moved to DEST/.superseded/DATE/ (or removed with --prune) and named; export.csv lists every deliverable,
missing ones with why; a fixed canvas, and the warning naming images below the delivery size."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.exports import OutMaker, encoded, key_of, tree, wide_png
from helpers.runs import cli
from PIL import Image

from imagebatch.delivery.aside import ASIDE_FOLDER
from imagebatch.storage.csvcells import read_csv
from imagebatch.storage.kinds import open_location
from imagebatch.work.decisions import Decision, record_decision

RED = encoded(Image.new("RGB", (64, 64), (255, 0, 0)), "PNG")
BLUE = encoded(Image.new("RGB", (64, 64), (0, 0, 255)), "PNG")


def decide(root: Path, job: str, decision: str, variant: int = 1) -> None:
    record_decision(open_location(root), Decision(key_of(job, 0, variant), variant, decision, "", "ana"))  # type: ignore[arg-type]


def shipped(dest: Path) -> set[str]:
    """What uploading DEST would put at the shop's URLs: every file but export.csv and the set-aside ones."""
    return {name for name in tree(dest) if name != "export.csv" and not name.startswith(f"{ASIDE_FOLDER}/")}


def listed(dest: Path) -> dict[str, dict[str, str]]:
    """export.csv's rows by job id."""
    return {row["job_id"]: row for row in read_csv(dest / "export.csv")}


@pytest.fixture
def two(make_out: Callable[..., OutMaker]) -> OutMaker:
    made = make_out()
    made.add("mug", [RED], sku="MUG", colour="red")
    made.add("hat", [BLUE], sku="HAT", colour="blue")
    made.write()
    decide(made.root, "mug", "approved")
    decide(made.root, "hat", "approved")
    return made


def test_a_file_no_longer_delivered_is_set_aside_and_named(
    two: OutMaker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "dest"
    argv = ["export", str(two.root), "--to", str(dest), "--name", "{sku}/{colour}.{ext}", "--approved-only"]
    code, stdout, err = cli(capsys, *argv)
    assert code == 0, err
    assert shipped(dest) == {"MUG/red.png", "HAT/blue.png"}

    decide(two.root, "hat", "rejected")  # the reviewer changes their mind
    code, stdout, err = cli(capsys, *argv)
    assert code == 0, err
    assert shipped(dest) == {"MUG/red.png"}  # no file export.csv does not list
    assert not (dest / "HAT").exists()  # its emptied folder is gone too
    (aside,) = [name for name in tree(dest) if name.startswith(f"{ASIDE_FOLDER}/")]
    assert aside.endswith("/HAT/blue.png") and tree(dest)[aside] == BLUE
    assert (
        "1 missing" in stdout
        and "results.csv row 3 (job 'hat', request 0): rejected (HAT/blue.png)" in stdout
    )
    assert "1 file of an earlier export not delivered now, moved to" in stdout
    assert "\n  HAT/blue.png" in stdout
    rows = listed(dest)
    assert (rows["hat"]["status"], rows["hat"]["reason"], rows["hat"]["path"]) == ("missing", "rejected", "")
    assert (rows["hat"]["decision"], rows["hat"]["reviewer"], rows["hat"]["sku"]) == (
        "rejected",
        "ana",
        "HAT",
    )
    assert rows["mug"]["status"] == "delivered" and rows["mug"]["colour"] == "red"

    code, stdout, _ = cli(capsys, *argv)  # nothing more to set aside: nothing said, nothing moved
    assert code == 0 and "earlier export" not in stdout and "1 missing" in stdout

    decide(two.root, "mug", "cleared")
    code, stdout, _ = cli(capsys, *argv, "--prune")
    assert code == 0 and "1 file of an earlier export not delivered now, removed (--prune)" in stdout
    assert shipped(dest) == set() and [aside] == [n for n in tree(dest) if n != "export.csv"]
    assert [(r["status"], r["reason"]) for r in listed(dest).values()] == [
        ("missing", "unreviewed"),
        ("missing", "rejected"),
    ]


def test_files_export_did_not_write_are_never_moved(
    two: OutMaker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "dest"
    (dest / "HAT").mkdir(parents=True)
    (dest / "HAT/blue.png").write_bytes(b"the shop's own file")  # in the way of no deliverable of this one
    (dest / "notes.txt").write_text("keep me")
    argv = ["export", str(two.root), "--to", str(dest), "--name", "{sku}.{ext}", "--approved-only"]
    assert cli(capsys, *argv)[0] == 0
    decide(two.root, "hat", "rejected")
    code, _, _ = cli(capsys, *argv)
    assert code == 0
    assert sorted(tree(dest)) == [
        ".superseded/" + next(p.name for p in (dest / ASIDE_FOLDER).iterdir()) + "/HAT.png",
        "HAT/blue.png",
        "MUG.png",
        "export.csv",
        "notes.txt",
    ]


def test_canvas_pads_every_image_and_warns_of_small_ones(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = make_out()
    made.add("wide", [wide_png((20, 120, 40))], sku="WIDE", colour="green")  # 1200 x 600: shrunk to fit
    made.add("tiny", [RED], sku="TINY", colour="red")  # 64 x 64: padded, never enlarged, named
    made.write()
    dest = tmp_path / "dest"
    argv = ["export", str(made.root), "--to", str(dest), "--name", "{sku}.{ext}", "--format", "jpeg"]
    code, _, err = cli(capsys, *argv, "--canvas", "1000x800", "--background", "#000000")
    assert code == 0, err
    assert "warning: 1 image is below the delivery size (--canvas 1000x800), not enlarged:\n  TINY.jpg" in err
    with Image.open(dest / "WIDE.jpg") as wide, Image.open(dest / "TINY.jpg") as tiny:
        assert wide.size == tiny.size == (1000, 800)
        wide_rgb, tiny_rgb = wide.convert("RGB"), tiny.convert("RGB")
        assert max(abs(a - b) for a, b in zip(wide_rgb.getpixel((500, 400)), (20, 120, 40), strict=True)) < 8
        assert max(wide_rgb.getpixel((500, 60))) < 8  # 1000 x 500 centred: black bands above and below
        assert max(tiny_rgb.getpixel((10, 10))) < 8 and tiny_rgb.getpixel((500, 400))[0] > 240
    rows = listed(dest)
    assert (rows["tiny"]["below_size"], rows["wide"]["below_size"]) == ("yes", "")
    assert rows["tiny"]["conversion"].endswith("canvas=1000x800")

    code, stdout, err = cli(capsys, *argv, "--canvas", "1000x800", "--background", "#000000")
    assert "0 written, 2 unchanged" in stdout and "TINY.jpg" in err  # a reused file keeps its warning
    code, _, err = cli(capsys, *argv, "--canvas", "2000")
    assert code == 2 and "--canvas '2000': WIDTHxHEIGHT in pixels" in err


def test_in_a_bucket_a_stale_object_is_set_aside_or_pruned(
    s3: Any, two: OutMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = s3.bucket()
    argv = [
        "export",
        str(two.root),
        "--to",
        f"s3://{bucket}/deliver",
        "--name",
        "{sku}.{ext}",
        "--approved-only",
    ]
    code, _, err = cli(capsys, *argv)
    assert code == 0, err
    assert sorted(s3.objects(bucket, "deliver")) == ["HAT.png", "MUG.png", "export.csv"]
    decide(two.root, "hat", "rejected")
    code, stdout, _ = cli(capsys, *argv)
    assert code == 0 and f"moved to s3://{bucket}/deliver/{ASIDE_FOLDER}/" in stdout
    objects = s3.objects(bucket, "deliver")
    (aside,) = [name for name in objects if name.startswith(f"{ASIDE_FOLDER}/")]
    assert aside.endswith("/HAT.png") and objects[aside] == BLUE
    assert sorted(set(objects) - {aside}) == ["MUG.png", "export.csv"]
    decide(two.root, "mug", "rejected")
    code, stdout, _ = cli(capsys, *argv, "--prune")
    assert code == 0 and "removed (--prune)" in stdout
    assert sorted(s3.objects(bucket, "deliver")) == sorted([aside, "export.csv"])
