"""Writes into OUT or DEST never leave it through a symbolic link (issue 29 #5, #9): export's files,
review.jsonl, the report's thumbnails and pages; one check for all of them (`storage.confined`). Each
test plants the link itself, as an attacker sharing the folder would."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from helpers.exports import OutMaker, tree
from helpers.runs import cli
from PIL import Image

from imagebatch.storage.folder import FolderBackend
from imagebatch.storage.layout import REVIEW_FILE
from imagebatch.storage.location import OutsideRootError, confined
from imagebatch.work.decisions import Decision, record_decision


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    (tmp_path / "outside").mkdir()
    return tmp_path / "outside"


@pytest.fixture
def out(tmp_path: Path) -> OutMaker:
    made = OutMaker(tmp_path / "out", ["sku"])
    made.add("r1", [png()], sku="SKU-1")
    made.add("r2", [png()], sku="SKU-2")
    made.write()
    return made


def test_confined_follows_links_that_stay_inside_and_refuses_those_that_leave(
    tmp_path: Path, outside: Path
) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "inner").symlink_to(root / "real")
    (root / "away").symlink_to(outside)
    (root / "file.txt").symlink_to(outside / "victim.txt")  # dangling: the file does not exist yet
    assert confined(root, "inner/a.png") == root / "inner/a.png"
    assert confined(root, "new/deeper/a.png") == root / "new/deeper/a.png"
    for name in ("away/a.png", "away/x/y.png", "file.txt", "../outside/a.png", "real/../../outside/a"):
        with pytest.raises(OutsideRootError, match="leads out of"):
            confined(root, name)
    with pytest.raises(OutsideRootError):
        FolderBackend(root).put("away/run.json", b"{}")
    with pytest.raises(OutsideRootError):
        FolderBackend(root).put_new("file.txt", b"x")
    assert tree(outside) == {}


def test_export_through_a_linked_folder_of_dest_is_refused_and_nothing_written(
    out: OutMaker, tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "r1").symlink_to(outside)  # `ln -s "$PWD/outside" dest/r1`
    code, _, err = cli(capsys, "export", str(out.root), "--to", str(dest), "--name", "{job_id}/{n}.{ext}")
    assert code == 2
    assert "(job 'r1', request 0): its name 'r1/1.png' leads out of DEST through a symbolic link" in err
    assert "nothing was written" in err
    assert tree(outside) == {} and sorted(os.listdir(dest)) == ["r1"]


def test_export_over_a_linked_file_of_dest_is_refused_even_with_overwrite(
    out: OutMaker, tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (outside / "victim.png").write_bytes(b"precious")
    (dest / "SKU-1.png").symlink_to(outside / "victim.png")
    (dest / "export.csv").symlink_to(outside / "listing.csv")
    args = ["export", str(out.root), "--to", str(dest), "--name", "{sku}.{ext}", "--overwrite"]
    code, _, err = cli(capsys, *args)
    assert code == 2
    assert "its name 'SKU-1.png' leads out of DEST" in err and "'export.csv' leads out of DEST" in err
    assert tree(outside) == {"victim.png": b"precious"}


def test_a_decision_is_not_appended_to_a_review_file_linked_out_of_out(out: OutMaker, outside: Path) -> None:
    (outside / "victim.jsonl").write_bytes(b"")
    (out.root / REVIEW_FILE).symlink_to(outside / "victim.jsonl")
    with pytest.raises(OutsideRootError, match=REVIEW_FILE):
        record_decision(FolderBackend(out.root), Decision("ib1-a", 1, "approved"))
    assert (outside / "victim.jsonl").read_bytes() == b""


def test_the_report_makes_no_thumbnail_nor_page_through_a_link_out_of_out(
    out: OutMaker, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (out.root / "thumbs").symlink_to(outside)
    code, _, err = cli(capsys, "report", str(out.root))
    assert code == 2 and "thumbs" in err and "leads out of" in err
    assert tree(outside) == {}

    (out.root / "thumbs").unlink()
    (out.root / "report.html").symlink_to(outside / "report.html")
    code, _, err = cli(capsys, "report", str(out.root))
    assert code == 2 and "report.html leads out of" in err
    assert tree(outside) == {} and tree(out.root / "thumbs")  # the thumbnails went where they belong


def test_a_full_disk_leaves_no_report_page_nor_run_copy_cut_short(tmp_path: Path) -> None:
    """Issue 29 #10: the per-run copy was left cut mid-tag at 32,768 bytes. A child process whose files
    may not grow past 16 KB (RLIMIT_FSIZE: the kernel's EFBIG, as a full disk's ENOSPC) writes a 60 KB
    report and then copies the earlier 60 KB report for its run: each is whole or absent."""
    out = tmp_path / "out"
    out.mkdir()
    earlier = "<html>" + "<p>earlier</p>\n" * 4000 + "</html>"
    (out / "report.html").write_text(earlier)
    code = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from imagebatch.run.report_artifact import keep_run_report\n"
        "from imagebatch.storage.location import confined, write_atomic\n"
        "out = Path(sys.argv[1])\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))\n"
        "page = ('<div>' + 'x' * 90 + '</div>\\n') * 600\n"
        "for step in (lambda: write_atomic(confined(out, 'report.html'), page.encode()),\n"
        "             lambda: keep_run_report(out / 'report.html', '20260101T000000Z-abcdef12')):\n"
        "    try:\n"
        "        step()\n"
        "    except OSError as exc:\n"
        "        print(exc.errno)\n"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["27", "27"]  # EFBIG, twice: neither fitted
    assert (out / "report.html").read_text() == earlier
    assert sorted(p.name for p in out.iterdir()) == ["report.html"]  # no copy cut short, no temporary file


def test_a_loop_of_links_is_refused_as_leaving_not_a_traceback(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    with pytest.raises(OutsideRootError):
        confined(root, "a/x.png")
    from imagebatch.storage.folderfiles import served_path as served

    assert served(root, "a/x.png") is None


def test_a_run_writes_no_image_nor_journal_line_through_a_link_out_of_out(
    tmp_path: Path, outside: Path
) -> None:
    from imagebatch.work.store import OutputStore

    out = tmp_path / "out"
    out.mkdir()
    (out / "images").symlink_to(outside)
    (out / "journal.jsonl").symlink_to(outside / "journal.jsonl")
    (out / "run.json").symlink_to(outside / "run.json")
    store = OutputStore(out)
    with pytest.raises(OutsideRootError):
        store.write_file("job/0-abc.png", png())
    with pytest.raises(OutsideRootError):
        store.journal("attempt_started", key="ib1-x")
    with pytest.raises(OutsideRootError):
        store.write_run({"state": "running"})
    assert isinstance(store.backend.watch.error, OutsideRootError)  # the run stops as on a failed disk
    assert tree(outside) == {}
