"""`imagebatch export`: what lands in DEST, checked on the written files (names, formats, sizes, EXIF
orientation, colour profile, alpha), the variant and review rules, idempotency and --overwrite."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.exports import (
    ORIENTATION,
    SRGB,
    OutMaker,
    encoded,
    key_of,
    rotated_jpeg,
    transparent_png,
    tree,
    wide_png,
)
from helpers.runs import cli
from PIL import Image

import imagebatch.delivery.export as export_module
from imagebatch.delivery.convert import stage
from imagebatch.delivery.export import export
from imagebatch.delivery.options import ExportOptions
from imagebatch.storage.csvcells import read_csv
from imagebatch.storage.kinds import open_location
from imagebatch.work.decisions import Decision, record_decision


def near(pixel: Any, expected: tuple[int, ...], tolerance: int = 12) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, expected, strict=True))


def opened(path: Path) -> Image.Image:
    """The image at `path`, read whole (no file left open)."""
    with Image.open(path) as im:
        im.load()
        return im


def listing(dest: Path) -> list[dict[str, str]]:
    return list(read_csv(dest / "export.csv"))


def solid_png(colour: tuple[int, int, int], size: tuple[int, int] = (64, 64)) -> bytes:
    return encoded(Image.new("RGB", size, colour), "PNG")


def shoe_and_bag(make_out: Callable[..., OutMaker]) -> Path:
    """A sideways JPEG (SKU-1, red) and a half-transparent PNG (SKU-2, sand)."""
    out = make_out()
    out.add("shoe", [rotated_jpeg()], sku="SKU-1", colour="red")
    out.add("bag", [transparent_png()], sku="SKU-2", colour="sand")
    return out.write()


def test_jpeg_deliverables_named_sized_rotated_flattened_with_their_profile(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = make_out()
    out.add("shoe", [rotated_jpeg()], sku="SKU-1", colour="red")
    out.add("bag", [transparent_png()], sku="SKU-2", colour="sand")
    out.add("lamp", [wide_png()], sku="SKU-3", colour="brushed brass")
    out.write()
    dest = tmp_path / "dest"
    code, stdout, err = cli(
        capsys, "export", str(out.root), "--to", str(dest), "--name", "{sku}/{colour}.{ext}",
        "--format", "jpeg", "--max-side", "256", "--background", "#00ff00", "--quality", "92",
    )  # fmt: skip
    assert code == 0, err
    assert "3 written" in stdout
    assert sorted(tree(dest)) == ["SKU-1/red.jpg", "SKU-2/sand.jpg", "SKU-3/brushed brass.jpg", "export.csv"]

    shoe = opened(dest / "SKU-1/red.jpg")  # stored 400 x 200 sideways: shown 200 x 400, then fitted in 256
    assert (shoe.format, shoe.mode, shoe.size) == ("JPEG", "RGB", (128, 256))
    assert shoe.getexif().get(ORIENTATION) is None  # applied to the pixels, so no viewer rotates it again
    assert near(shoe.getpixel((64, 40)), (255, 0, 0)) and near(shoe.getpixel((64, 216)), (0, 0, 255))
    assert shoe.info["icc_profile"] == SRGB

    bag = opened(dest / "SKU-2/sand.jpg")
    assert (bag.format, bag.mode, bag.size) == ("JPEG", "RGB", (256, 256))
    assert near(bag.getpixel((40, 128)), (255, 0, 0)) and near(bag.getpixel((216, 128)), (0, 255, 0))
    assert bag.info["icc_profile"] == SRGB

    lamp = opened(dest / "SKU-3/brushed brass.jpg")
    assert (lamp.format, lamp.size) == ("JPEG", (256, 128))
    assert "icc_profile" not in lamp.info  # its source had none

    rows = {r["path"]: r for r in listing(dest)}
    assert set(rows) == {"SKU-1/red.jpg", "SKU-2/sand.jpg", "SKU-3/brushed brass.jpg"}
    for path, row in rows.items():
        data = (dest / path).read_bytes()
        im = opened(dest / path)
        assert row["sha256"] == hashlib.sha256(data).hexdigest()
        assert (int(row["bytes"]), int(row["width"]), int(row["height"])) == (len(data), *im.size)
    assert rows["SKU-1/red.jpg"]["idempotency_key"] == key_of("shoe", 0)
    assert rows["SKU-1/red.jpg"]["variant"] == "1"
    assert rows["SKU-1/red.jpg"]["source"].startswith("images/shoe/0-")


def test_default_names_copy_unchanged_images_and_keep_alpha(
    make_out: Callable[..., OutMaker], tmp_path: Path
) -> None:
    out = make_out(metadata=())
    bag = transparent_png()
    pair = [wide_png(), wide_png((1, 2, 3))]
    out.add("bag", [bag])
    out.add("bag", pair, request=1)  # a request for two images: {n} 1 and 2
    out.add("shoe", [rotated_jpeg()])
    out.add("note", [], status="succeeded")  # a text route's row: nothing to deliver
    out.write()
    dest = tmp_path / "dest"
    summary = export(str(out.root), str(dest), ExportOptions(workers=1))
    files = tree(dest)
    assert sorted(files) == [
        "bag/0-0-1.png",
        "bag/1-0-1.png",
        "bag/1-0-2.png",
        "export.csv",
        "shoe/0-0-1.jpg",
    ]
    # nothing to change: copied byte for byte; the sideways JPEG is rotated, so re-encoded
    assert files["bag/0-0-1.png"] == bag
    assert [files["bag/1-0-1.png"], files["bag/1-0-2.png"]] == pair
    shoe = opened(dest / "shoe/0-0-1.jpg")
    assert shoe.size == (200, 400) and shoe.getexif().get(ORIENTATION) is None
    assert summary.written == 4

    webp = tmp_path / "webp"
    export(str(out.root), str(webp), ExportOptions(format="webp", max_side=100, workers=1))
    im = opened(webp / "bag/0-0-1.webp")
    assert (im.format, im.mode, im.size) == ("WEBP", "RGBA", (100, 100))
    assert im.getpixel((80, 50))[3] == 0 and near(im.getpixel((20, 50)), (255, 0, 0, 255))
    assert im.info["icc_profile"] == SRGB


@pytest.mark.slow  # processes of their own
@pytest.mark.parametrize("pool", ["process", "thread"])
def test_a_pool_of_workers_writes_the_same_files_as_one_thread(
    make_out: Callable[..., OutMaker], tmp_path: Path, pool: Any
) -> None:
    out = make_out(metadata=("sku",))
    for i in range(6):
        out.add(f"p{i}", [rotated_jpeg() if i % 2 else transparent_png()], sku=f"S{i}")
    out.write()
    jpeg = ExportOptions(name="{sku}.{ext}", format="jpeg", max_side=150, workers=1)
    export(str(out.root), str(tmp_path / "one"), jpeg)
    summary = export(str(out.root), str(tmp_path / "two"), jpeg.model_copy(update={"workers": 2}), pool=pool)
    assert summary.written == 6
    assert tree(tmp_path / "two") == tree(tmp_path / "one")
    assert not [p for p in (tmp_path / "two").iterdir() if p.name.startswith(".")]  # no staging left


def test_newest_succeeded_variant_is_delivered(make_out: Callable[..., OutMaker], tmp_path: Path) -> None:
    out = make_out(metadata=())
    out.add("mug", [solid_png((255, 0, 0))], variant=1)
    out.add("mug", [solid_png((0, 0, 255))], variant=2)
    out.add("mug", [], variant=3, status="failed")
    out.add("cup", [solid_png((0, 255, 0))])  # no variant cell: 1
    out.write()
    dest = tmp_path / "dest"
    export(str(out.root), str(dest), ExportOptions(workers=1))
    assert opened(dest / "mug/0-0-1.png").getpixel((1, 1)) == (0, 0, 255)
    rows = {r["path"]: r for r in listing(dest)}
    assert (rows["mug/0-0-1.png"]["variant"], rows["cup/0-0-1.png"]["variant"]) == ("2", "1")
    assert rows["mug/0-0-1.png"]["idempotency_key"] == key_of("mug", 0, 2)


def decide(out: Path, *decisions: tuple[str, int, str]) -> None:
    """Record review decisions as the review page does (the last one for a key wins)."""
    for key, variant, decision in decisions:
        record_decision(open_location(out), Decision(key, variant, decision, reviewer="ann"))  # type: ignore[arg-type]


def test_approved_only_delivers_the_newest_approved_variant(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = make_out(metadata=("sku",))
    red, blue, green = solid_png((255, 0, 0)), solid_png((0, 0, 255)), solid_png((0, 255, 0))
    out.add("mug", [red], variant=1, sku="MUG")  # approved, its redo rejected: variant 1 leaves
    out.add("mug", [blue], variant=2, sku="MUG")
    out.add("hat", [red], variant=1, sku="HAT")  # both approved: the newest
    out.add("hat", [green], variant=2, sku="HAT")
    out.add("cup", [red], sku="CUP")  # approved, then the approval undone
    out.add("box", [red], sku="BOX")  # never reviewed
    out.add("bin", [red], sku="BIN")  # rejected, then approved
    root = out.write()
    code, stdout, _ = cli(capsys, "export", str(root), "--to", str(tmp_path / "none"), "--approved-only")
    assert code == 0 and "no image is approved" in stdout and "5 missing" in stdout
    assert sorted(tree(tmp_path / "none")) == ["export.csv"]  # only the list of what is missing, and why
    listed = list(read_csv(tmp_path / "none" / "export.csv"))
    assert [(r["job_id"], r["sku"], r["status"], r["reason"]) for r in listed] == [
        (job, job.upper(), "missing", "unreviewed") for job in ("mug", "hat", "cup", "box", "bin")
    ]
    decide(
        root,
        (key_of("mug", 0, 1), 1, "approved"), (key_of("mug", 0, 2), 2, "rejected"),
        (key_of("hat", 0, 1), 1, "approved"), (key_of("hat", 0, 2), 2, "approved"),
        (key_of("cup", 0), 1, "approved"), (key_of("cup", 0), 1, "cleared"),
        (key_of("bin", 0), 1, "rejected"), (key_of("bin", 0), 1, "approved"),
    )  # fmt: skip
    dest = tmp_path / "dest"
    code, _, err = cli(
        capsys, "export", str(root), "--to", str(dest), "--name", "{sku}.{ext}", "--approved-only"
    )
    assert code == 0, err
    files = tree(dest)
    assert sorted(files) == ["BIN.png", "HAT.png", "MUG.png", "export.csv"]
    assert (files["MUG.png"], files["HAT.png"]) == (red, green)
    listed = {r["job_id"]: r for r in read_csv(dest / "export.csv")}
    assert [(r["path"], r["status"], r["reason"], r["variant"], r["decision"]) for r in listed.values()] == [
        ("MUG.png", "delivered", "", "1", "approved"),
        ("HAT.png", "delivered", "", "2", "approved"),
        ("", "missing", "unreviewed", "1", ""),  # cup: its approval cleared
        ("", "missing", "unreviewed", "1", ""),
        ("BIN.png", "delivered", "", "1", "approved"),
    ]
    assert listed["hat"]["decided_at"] and listed["hat"]["sku"] == "HAT"

    everything = tmp_path / "all"  # without --approved-only, decisions are not read: the newest image
    assert cli(capsys, "export", str(root), "--to", str(everything), "--name", "{sku}.{ext}")[0] == 0
    assert sorted(tree(everything)) == ["BIN.png", "BOX.png", "CUP.png", "HAT.png", "MUG.png", "export.csv"]
    assert tree(everything)["MUG.png"] == blue


def stats(root: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_a_second_export_writes_nothing_and_a_changed_file_is_kept_unless_overwrite(
    make_out: Callable[..., OutMaker],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = shoe_and_bag(make_out)
    dest = tmp_path / "dest"
    argv = ["export", str(root), "--to", str(dest), "--name", "{sku}/{colour}.{ext}", "--format", "jpeg"]
    assert cli(capsys, *argv)[0] == 0
    before = stats(dest)
    converted: list[str] = []
    monkeypatch.setattr(export_module, "stage", lambda job: converted.append(job.target) or stage(job))
    code, stdout, _ = cli(capsys, *argv, "--workers", "1")
    assert code == 0 and "0 written, 2 unchanged" in stdout
    assert stats(dest) == before  # not one file (nor export.csv, nor a folder) touched or added
    assert converted == []  # export.csv vouched for both files: nothing decoded

    (dest / "export.csv").unlink()  # without the list, the files are compared by converting again
    code, stdout, _ = cli(capsys, *argv, "--workers", "1")
    assert code == 0 and "0 written, 2 unchanged" in stdout
    assert len(converted) == 2
    assert {k: v for k, v in stats(dest).items() if k != "export.csv"} == {
        k: v for k, v in before.items() if k != "export.csv"
    }

    edited = b"someone else's file"
    (dest / "SKU-2/sand.jpg").write_bytes(edited)
    kept = tree(dest)
    code, _, err = cli(capsys, *argv)
    assert code == 2
    assert (
        "results.csv row 3 (job 'bag', request 0): DEST already has 'SKU-2/sand.jpg' with other bytes" in err
    )
    assert "nothing was written" in err
    assert tree(dest) == kept

    code, stdout, _ = cli(capsys, *argv, "--overwrite")
    assert code == 0 and "0 written, 1 unchanged, 1 replaced (--overwrite)" in stdout
    assert opened(dest / "SKU-2/sand.jpg").size == (300, 300)
    assert (dest / "SKU-1/red.jpg").stat().st_ino == before["SKU-1/red.jpg"][0]


def test_a_regenerated_source_replaces_the_file_the_earlier_export_wrote(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = make_out()
    row = out.add("mug", [solid_png((255, 0, 0))], sku="MUG", colour="red")
    root = out.write()
    dest = tmp_path / "dest"
    argv = ["export", str(root), "--to", str(dest), "--name", "{sku}.{ext}", "--format", "jpeg"]
    assert cli(capsys, *argv)[0] == 0
    (root / row["paths"]).write_bytes(solid_png((0, 0, 255)))  # `run --force`: same key, new image
    # DEST's file is the one the earlier export wrote (export.csv lists its sha256): no --overwrite needed
    code, stdout, err = cli(capsys, *argv)
    assert code == 0, err
    assert "0 written, 0 unchanged, 1 replaced (newer than the earlier export's)" in stdout
    assert near(opened(dest / "MUG.jpg").getpixel((5, 5)), (0, 0, 255))


def test_export_into_a_bucket_and_from_one(
    s3: Any, make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = shoe_and_bag(make_out)
    bucket = s3.bucket()
    argv = ["--name", "{sku}/{colour}.{ext}", "--format", "jpeg", "--max-side", "128"]
    code, stdout, err = cli(capsys, "export", str(root), "--to", f"s3://{bucket}/deliver", *argv)
    assert code == 0, err
    objects = s3.objects(bucket, "deliver")
    assert sorted(objects) == ["SKU-1/red.jpg", "SKU-2/sand.jpg", "export.csv"]
    shoe = Image.open(io.BytesIO(objects["SKU-1/red.jpg"]))
    assert (shoe.format, shoe.size) == ("JPEG", (64, 128))

    def versions() -> dict[str, tuple[str, Any]]:
        listed = s3.client.list_objects_v2(Bucket=bucket, Prefix="deliver/")["Contents"]
        return {o["Key"]: (o["ETag"], o["LastModified"]) for o in listed}

    before = versions()
    code, stdout, _ = cli(capsys, "export", str(root), "--to", f"s3://{bucket}/deliver", *argv)
    assert code == 0 and "0 written, 2 unchanged" in stdout
    assert versions() == before

    for rel, data in tree(root).items():  # the same output folder, in a bucket
        s3.client.put_object(Bucket=bucket, Key=f"run/{rel}", Body=data)
    local = tmp_path / "from-bucket"
    assert cli(capsys, "export", f"s3://{bucket}/run", "--to", str(local), *argv)[0] == 0
    assert {k: v for k, v in tree(local).items() if k != "export.csv"} == {
        k: v for k, v in objects.items() if k != "export.csv"
    }

    run = open_location(f"s3://{bucket}/run")  # decisions in a bucket: one object each under review/
    record_decision(run, Decision(key_of("shoe", 0), 1, "approved"))
    record_decision(run, Decision(key_of("bag", 0), 1, "rejected"))
    approved = tmp_path / "approved"
    assert (
        cli(capsys, "export", f"s3://{bucket}/run", "--to", str(approved), *argv, "--approved-only")[0] == 0
    )
    assert sorted(tree(approved)) == ["SKU-1/red.jpg", "export.csv"]


@pytest.mark.slow  # a process of its own
def test_the_command_does_not_import_prefect(make_out: Callable[..., OutMaker], tmp_path: Path) -> None:
    root = shoe_and_bag(make_out)
    script = (
        "import sys\nfrom imagebatch.cli.main import main\n"
        f"code = main(['export', {str(root)!r}, '--to', {str(tmp_path / 'dest')!r}])\n"
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.splitlines()[-1] == "0 []"
    assert sorted(tree(tmp_path / "dest")) == ["bag/0-0-1.png", "export.csv", "shoe/0-0-1.jpg"]


def test_an_image_in_another_format_than_its_name_says_is_delivered_in_the_named_one(
    make_out: Callable[..., OutMaker], tmp_path: Path
) -> None:
    out = make_out(metadata=())
    out.add("gif", [encoded(Image.new("P", (16, 16), 3), "GIF")])  # stored as .png by the maker
    out.write()
    export(str(out.root), str(tmp_path / "dest"), ExportOptions(workers=1))
    assert opened(tmp_path / "dest" / "gif/0-0-1.png").format == "PNG"


def test_into_a_long_bucket_prefix_a_name_that_would_make_a_key_over_1024_bytes_is_refused_first(
    s3: Any, make_out: Callable[..., OutMaker], capsys: pytest.CaptureFixture[str]
) -> None:
    """S3 refuses a key over 1,024 bytes (moto stores it): the export refuses such a name before writing
    anything, naming the row, with room kept for the folder a stale file is moved to."""
    from imagebatch.delivery.aside import ASIDE_FOLDER, MAX_SAME_SECOND, name_room, stamp
    from imagebatch.delivery.naming import MAX_NAME_BYTES

    out = make_out()
    out.add("shoe", [solid_png((200, 0, 0))], sku="SKU-1", colour="r" * 200)
    out.add("bag", [solid_png((0, 0, 200))], sku="SKU-2", colour="sand")
    bucket, prefix = s3.bucket(), "catalog/" + "p" * 700
    dest = f"s3://{bucket}/{prefix}"
    room = name_room(open_location(dest), MAX_NAME_BYTES)
    assert room == 1024 - len(prefix) - 1 - len(f"{ASIDE_FOLDER}/{stamp()}-{MAX_SAME_SECOND}/") < 400
    name = "{sku}/{colour}/{colour}.{ext}"  # 411 bytes for the shoe, each segment under 255
    code, _, err = cli(capsys, "export", str(out.write()), "--to", dest, "--name", name)
    assert code == 2
    assert "results.csv row 2 (job 'shoe'" in err and f"leaves {room:,} for a name" in err, err
    assert s3.objects(bucket, "catalog") == {}  # nothing written, not even the short one
    assert name_room(open_location(str(out.root)), MAX_NAME_BYTES) == MAX_NAME_BYTES  # a folder: no key
