"""`imagebatch export` destroys nothing it did not write, each test written as the attack: a retouched
(read-only) file at a delivered path under `--prune`; an export.csv edited to list a person's files;
`--overwrite` over someone's file; `.superseded` linked elsewhere; two exports into one DEST at once;
SIGTERM in the middle of converting."""

from __future__ import annotations

import csv
import functools
import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers.exports import OutMaker, encoded, key_of, tree
from helpers.prefect_server import wait_for
from helpers.runs import cli
from PIL import Image

from imagebatch.delivery.aside import ASIDE_FOLDER
from imagebatch.delivery.destlock import LOCK_OBJECT, exclusive
from imagebatch.delivery.export import export
from imagebatch.delivery.options import ExportOptions
from imagebatch.delivery.publish import STAGING_PREFIX
from imagebatch.storage.kinds import open_location
from imagebatch.work.decisions import Decision, record_decision

RED = encoded(Image.new("RGB", (64, 64), (255, 0, 0)), "PNG")
BLUE = encoded(Image.new("RGB", (64, 64), (0, 0, 255)), "PNG")
RETOUCHED = encoded(Image.new("RGB", (64, 64), (0, 0, 250)), "PNG")


@pytest.fixture
def two(make_out: Callable[..., OutMaker]) -> OutMaker:
    made = make_out()
    made.add("mug", [RED], sku="MUG", colour="red")
    made.add("hat", [BLUE], sku="HAT", colour="blue")
    made.write()
    for job in ("mug", "hat"):
        record_decision(open_location(made.root), Decision(key_of(job, 0), 1, "approved", "", "ana"))  # type: ignore[arg-type]
    return made


def reject_hat(out: OutMaker) -> None:
    record_decision(open_location(out.root), Decision(key_of("hat", 0), 1, "rejected", "", "ana"))  # type: ignore[arg-type]


def argv(out: OutMaker, dest: str, *more: str) -> list[str]:
    return ["export", str(out.root), "--to", dest, "--name", "{sku}.{ext}", "--approved-only", *more]


def aside(files: dict[str, bytes]) -> dict[str, bytes]:
    """The files under `.superseded/<stamp>/`, by their path below the stamp."""
    return {k.split("/", 2)[2]: v for k, v in files.items() if k.startswith(f"{ASIDE_FOLDER}/")}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_prune_never_removes_a_file_retouched_since_export_wrote_it(
    two: OutMaker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "dest"
    assert cli(capsys, *argv(two, str(dest)))[0] == 0
    (dest / "HAT.png").write_bytes(RETOUCHED)  # a retoucher's work, made read-only
    (dest / "HAT.png").chmod(0o444)
    reject_hat(two)
    code, stdout, err = cli(capsys, *argv(two, str(dest), "--prune"))
    assert code == 0, err
    assert aside(tree(dest)) == {"HAT.png": RETOUCHED}  # moved aside, bytes and all
    assert "1 file of an earlier export not delivered now, changed since it wrote them, moved to" in stdout
    assert "(never removed):\n  HAT.png" in stdout
    assert "removed (--prune)" not in stdout and not (dest / "HAT.png").exists()


@pytest.mark.parametrize("where", ["folder", "bucket"])
def test_paths_an_edited_export_csv_lists_that_export_never_wrote_are_left_alone(
    two: OutMaker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    outside = tmp_path / "mine"
    (outside / "mydocs").mkdir(parents=True)
    (outside / "mydocs/thesis.docx").write_bytes(b"three years")
    (outside / "photo.png").write_bytes(RED)
    theirs = {"budget.xlsx": b"numbers", "mydocs/thesis.docx": b"three years"}
    if where == "folder":
        dest_url = str(tmp_path / "dest")
        assert cli(capsys, *argv(two, dest_url))[0] == 0
        dest = tmp_path / "dest"
        for name, data in theirs.items():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(data)
        (dest / "elsewhere").symlink_to(outside)  # a link out of DEST: its files are not DEST's
        theirs["elsewhere/photo.png"] = RED
        listing = (dest / "export.csv").read_text()
    else:
        s3: Any = request.getfixturevalue("s3")
        bucket = s3.bucket()
        dest_url = f"s3://{bucket}/deliver"
        assert cli(capsys, *argv(two, dest_url))[0] == 0
        for name, data in theirs.items():
            s3.client.put_object(Bucket=bucket, Key=f"deliver/{name}", Body=data)
        listing = s3.objects(bucket, "deliver")["export.csv"].decode()
    header = next(csv.reader([listing.splitlines()[0]]))
    rows = [{"path": name, "status": "delivered", "sha256": sha(data)} for name, data in theirs.items()]
    rows.append({"path": "../mine/photo.png", "status": "delivered", "sha256": sha(RED)})
    forged = listing + "".join(",".join(r.get(c, "") for c in header) + "\r\n" for r in rows)
    if where == "folder":
        (tmp_path / "dest/export.csv").write_text(forged)
    else:
        s3.client.put_object(Bucket=bucket, Key="deliver/export.csv", Body=forged.encode())

    code, stdout, err = cli(capsys, *argv(two, dest_url, "--prune"))
    assert code == 0, err
    assert "earlier export" not in stdout  # nothing of theirs named as set aside or removed
    files = tree(tmp_path / "dest") if where == "folder" else s3.objects(bucket, "deliver")
    assert {name: files.get(name) for name in theirs if not name.startswith("elsewhere/")} == {
        name: data for name, data in theirs.items() if not name.startswith("elsewhere/")
    }
    assert tree(outside) == {"mydocs/thesis.docx": b"three years", "photo.png": RED}
    assert not aside(files)


@pytest.mark.parametrize("where", ["folder", "bucket"])
def test_overwrite_keeps_the_file_it_replaces_and_names_it(
    two: OutMaker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    if where == "folder":
        dest_url = str(tmp_path / "dest")
        (tmp_path / "dest").mkdir()
        (tmp_path / "dest/HAT.png").write_bytes(RETOUCHED)  # someone's own file at a deliverable's name
    else:
        s3: Any = request.getfixturevalue("s3")
        bucket = s3.bucket()
        dest_url = f"s3://{bucket}/deliver"
        s3.client.put_object(Bucket=bucket, Key="deliver/HAT.png", Body=RETOUCHED)
    code, stdout, err = cli(capsys, *argv(two, dest_url, "--overwrite"))
    assert code == 0, err
    files = tree(tmp_path / "dest") if where == "folder" else s3.objects(bucket, "deliver")
    assert files["HAT.png"] == BLUE and aside(files) == {"HAT.png": RETOUCHED}
    assert "1 replaced (--overwrite)" in stdout
    assert "1 file replaced (--overwrite), the earlier one kept in" in stdout and "\n  HAT.png" in stdout


def test_a_superseded_folder_linked_elsewhere_refuses_the_export(
    two: OutMaker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert cli(capsys, *argv(two, str(dest)))[0] == 0
    (dest / ASIDE_FOLDER).symlink_to(elsewhere)
    reject_hat(two)
    before = tree(dest)
    code, _, err = cli(capsys, *argv(two, str(dest)))
    assert code == 2
    assert f"DEST's {ASIDE_FOLDER} is a symbolic link: export moves no file through it" in err
    assert tree(elsewhere) == {} and tree(dest) == before


@pytest.mark.parametrize("where", ["folder", "bucket"])
def test_a_second_export_into_a_dest_another_export_holds_is_refused(
    two: OutMaker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    if where == "folder":
        dest_url = str(tmp_path / "dest")
    else:
        s3: Any = request.getfixturevalue("s3")
        bucket = s3.bucket()
        dest_url = f"s3://{bucket}/deliver"
    with exclusive(open_location(dest_url)):  # the first export, still running
        code, stdout, err = cli(capsys, *argv(two, dest_url))
        assert code == 2 and stdout == ""
        assert err.splitlines()[0] == f"--to {dest_url}: another export into it is running" + (
            "; wait for it to finish" if where == "folder" else err.splitlines()[0].split("running", 1)[1]
        )
        if where == "bucket":
            assert f"if none is, delete {dest_url}/{LOCK_OBJECT}" in err
            assert sorted(s3.objects(bucket, "deliver")) == [LOCK_OBJECT]  # nothing of the second's
        else:
            assert tree(tmp_path / "dest") == {}
    assert cli(capsys, *argv(two, dest_url))[0] == 0  # let go: the next export goes ahead
    files = tree(tmp_path / "dest") if where == "folder" else s3.objects(bucket, "deliver")
    assert sorted(files) == ["HAT.png", "MUG.png", "export.csv"]


@pytest.mark.slow  # a process of its own, killed midway
def test_sigterm_while_converting_removes_the_staging_folder(
    make_out: Callable[..., OutMaker], tmp_path: Path
) -> None:
    big = encoded(Image.new("RGB", (3000, 3000), (200, 30, 30)), "PNG")
    made = make_out()
    for k in range(60):
        made.add(f"job{k}", [big], sku=f"SKU-{k}", colour="red")
    made.write()
    dest = tmp_path / "dest"
    script = (
        "import sys\nfrom imagebatch.cli.main import main\n"
        f"sys.exit(main(['export', {str(made.root)!r}, '--to', {str(dest)!r}, '--format', 'jpeg', "
        "'--max-side', '2000', '--workers', '2']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        wait_for(
            "a staged file",
            lambda: dest.is_dir() and any(p.is_file() for p in dest.glob(f"{STAGING_PREFIX}*/*")),
            timeout=120,
        )
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert (
        "imagebatch export: stopped (SIGTERM); the files written are whole" in err and "Traceback" not in err
    )
    assert not dest.exists()  # the staging folder gone, and the DEST folder the export made with it


def test_exports_in_one_second_never_move_a_file_onto_one_set_aside_before(
    two: OutMaker, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    same_second = datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)
    run = functools.partial(
        export,
        str(two.root),
        str(dest),
        ExportOptions(name="{sku}.{ext}", approved_only=True),
        now=lambda: same_second,
    )
    run()
    reject_hat(two)
    assert run().set_aside == ["HAT.png"]
    record_decision(open_location(two.root), Decision(key_of("hat", 0), 1, "approved", "", "ana"))  # type: ignore[arg-type]
    run()
    (dest / "HAT.png").write_bytes(RETOUCHED)
    reject_hat(two)
    summary = run()
    assert summary.changed_aside == ["HAT.png"] and summary.aside_to is not None
    assert summary.aside_to.endswith(f"{ASIDE_FOLDER}/2026-05-04T12-00-00Z-2/")
    assert {k: v for k, v in tree(dest).items() if k.startswith(ASIDE_FOLDER)} == {
        f"{ASIDE_FOLDER}/2026-05-04T12-00-00Z/HAT.png": BLUE,
        f"{ASIDE_FOLDER}/2026-05-04T12-00-00Z-2/HAT.png": RETOUCHED,
    }
