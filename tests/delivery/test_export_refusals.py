"""`imagebatch export` refuses before writing: two images with one name, an unknown column, an unsafe
name, something in DEST's way, a source that is missing or not an image, bad options. Each time: exit 2,
the rows named, and DEST as it was (here: not even created)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.exports import OutMaker, encoded, transparent_png, tree
from helpers.runs import cli
from PIL import Image

from imagebatch.delivery.naming import NameTemplate, TemplateError, clashes, unsafe

RED = encoded(Image.new("RGB", (8, 8), (255, 0, 0)), "PNG")


@pytest.fixture
def out(make_out: Callable[..., OutMaker]) -> OutMaker:
    made = make_out()
    made.add("mug-red", [RED], sku="SKU-1", colour="red")
    made.add("cup-red", [RED], sku="SKU-2", colour="Red")
    made.add("hat", [RED, RED], sku="SKU-3", colour="blue")
    made.write()
    return made


def refused(capsys: pytest.CaptureFixture[str], out: OutMaker, dest: Path, *options: str) -> str:
    """Run the export; assert exit 2, DEST absent; return stderr."""
    code, stdout, err = cli(capsys, "export", str(out.root), "--to", str(dest), *options)
    assert code == 2, stdout
    assert not dest.exists()
    return err


def test_two_images_with_one_name_are_refused_with_both_rows(
    out: OutMaker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(capsys, out, tmp_path / "dest", "--name", "{colour}.{ext}")
    # 'red' and 'Red' are one file on macOS and Windows; the two images of 'hat' are one name
    assert (
        "results.csv row 2 (job 'mug-red', request 0) and results.csv row 3 (job 'cup-red', request 0): "
        "both are named 'Red.png'"
    ) in err
    hat = "results.csv row 4 (job 'hat', request 0, image {})"
    assert f"{hat.format(1)} and {hat.format(2)}: both are named 'blue.png'" in err
    assert "2 problems; nothing was written" in err


def rows_of(make_out: Callable[..., OutMaker], *values: tuple[str, str]) -> OutMaker:
    """An output folder of one red image per (sku, colour), jobs named a, b, c..."""
    made = make_out()
    for job, (sku, colour) in zip("abcdef", values, strict=False):
        made.add(job, [RED], sku=sku, colour=colour)
    made.write()
    return made


def test_a_slash_inside_a_value_is_refused_and_slug_makes_clean_names(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = rows_of(make_out, ("SKU-4003", "black/natural"), ("SKU-4004", "Forest Green"))
    err = refused(capsys, made, tmp_path / "dest", "--name", "{sku}/{colour}.{ext}")
    assert (
        "results.csv row 2 (job 'a', request 0): {colour} is 'black/natural': a '/' inside a value would "
        "make folders"
    ) in err
    assert "1 problem; nothing was written" in err

    code, _, err = cli(
        capsys, "export", str(made.root), "--to", str(tmp_path / "dest"), "--name", "{sku}/{colour}.{ext}",
        "--slug",
    )  # fmt: skip
    assert code == 0, err
    assert sorted(tree(tmp_path / "dest")) == [
        "export.csv",
        "sku-4003/black-natural.png",
        "sku-4004/forest-green.png",
    ]


def test_a_template_naming_an_unknown_column_is_refused(
    out: OutMaker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(capsys, out, tmp_path / "dest", "--name", "{sku}/{size}.{ext}")
    assert "names {size}: not a column of results.csv" in err and "sku, colour" in err


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("../{sku}.{ext}", "a '..' segment"),
        ("/srv/{sku}.{ext}", "an absolute path"),
        ("{sku}//{colour}.{ext}", "an empty segment"),
        ("{sku}:{colour}.{ext}", "the character ':'"),
        ("{sku}/{colour}.{ext}/", "an empty segment"),
        ("{sku}/con.{ext}", "'con.png' is a device name on Windows"),
        ("{sku}/{colour} ", "ends in ' '"),
    ],
)
def test_an_unsafe_name_is_refused(
    out: OutMaker, tmp_path: Path, capsys: pytest.CaptureFixture[str], template: str, why: str
) -> None:
    err = refused(capsys, out, tmp_path / "dest", "--name", template)
    assert "results.csv row 2 (job 'mug-red', request 0): its name" in err and why in err


def test_a_value_that_would_climb_out_or_hide_is_refused(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = rows_of(make_out, ("..", "red"), ("SKU-2", ""), ("../../etc", "red"), (" SKU-4", "red"))
    err = refused(capsys, made, tmp_path / "dest", "--name", "{sku}/{colour}.{ext}")
    assert "row 2 (job 'a', request 0): its name '../red.png' is refused: a '..' segment" in err
    assert "row 4 (job 'c', request 0): {sku} is '../../etc': a '/' inside a value" in err
    assert (
        "row 5 (job 'd', request 0): its name ' SKU-4/red.png' is refused: the segment ' SKU-4' starts" in err
    )
    assert "row 3 (job 'b', request 0): its name 'SKU-2/.png' is refused: the hidden segment '.png'" in err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--name", "{sku"], "expected '}' before end of string"),
        (["--name", "{sku.__class__}"], "must be a plain column name"),
        (["--name", "{0}.{ext}"], "needs a column's name"),
        (["--name", "images.zip"], "has no field"),
        (["--quality", "0"], "--quality 0: from 1 to 100"),
        (["--format", "png", "--quality", "80"], "--quality applies to jpeg and webp"),
        (["--background", "ultraviolet"], "--background 'ultraviolet'"),
        (["--max-side", "0"], "--max-side 0"),
        (["--workers", "0"], "--workers 0"),
    ],
)
def test_bad_options_are_refused(
    out: OutMaker, tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    assert message in refused(capsys, out, tmp_path / "dest", *options)


def test_something_in_dests_way_is_refused_and_dest_is_left_as_it_was(
    out: OutMaker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "dest"
    (dest / "SKU-3").mkdir(parents=True)
    (dest / "SKU-3" / "blue").mkdir()
    (dest / "SKU-1").write_bytes(b"a file")
    before = tree(dest)
    code, _, err = cli(
        capsys, "export", str(out.root), "--to", str(dest), "--name", "{sku}/{colour}-{n}.{ext}"
    )
    assert code == 2
    assert "row 2 (job 'mug-red', request 0): DEST has a file 'SKU-1' where its name 'SKU-1/red-1.png'" in err
    assert tree(dest) == before and sorted(p.name for p in dest.iterdir()) == ["SKU-1", "SKU-3"]


def test_dest_may_not_be_out_or_its_images(out: OutMaker, capsys: pytest.CaptureFixture[str]) -> None:
    for dest in (out.root, out.root / "images" / "deliver"):
        code, _, err = cli(capsys, "export", str(out.root), "--to", str(dest))
        assert code == 2 and "is OUT or one of its run's folders" in err
    assert not (out.root / "images" / "deliver").exists() and not (out.root / "export.csv").exists()


def test_a_missing_or_broken_source_is_refused_before_anything_is_written(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = make_out()
    made.add("good", [transparent_png()], sku="SKU-1", colour="red")
    broken = made.add("broken", [RED], sku="SKU-2", colour="red")
    gone = made.add("gone", [RED], sku="SKU-3", colour="red")
    root = made.write()
    (root / broken["paths"]).write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (root / gone["paths"]).unlink()
    dest = tmp_path / "deeper" / "dest"
    err = refused(capsys, made, dest, "--name", "{sku}.{ext}")
    assert f"row 4 (job 'gone', request 0): its image {gone['paths']} is missing from OUT" in err
    (root / gone["paths"]).write_bytes(RED)
    err = refused(capsys, made, dest, "--name", "{sku}.{ext}", "--format", "jpeg")
    assert f"row 3 (job 'broken', request 0): {broken['paths']} cannot be converted" in err
    assert not (tmp_path / "deeper").exists()  # the folders made for staging are gone too


def test_out_without_results_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "export", str(tmp_path / "nothing"), "--to", str(tmp_path / "dest"))
    assert code == 2 and "has no results.csv" in err and not (tmp_path / "dest").exists()


def test_template_fields_and_names() -> None:
    template = NameTemplate.parse("{sku}/{request_index:03d}-{n}.{ext}")
    assert template.fields == ("sku", "request_index", "n", "ext")
    assert template.unknown(["sku", "request_index"]) == []
    assert template.render({"sku": "A", "request_index": 7, "n": 1, "ext": "jpg"}) == "A/007-1.jpg"
    with pytest.raises(TemplateError):
        template.render({"sku": "A", "request_index": "seven", "n": 1, "ext": "jpg"})
    assert unsafe("SKU-1/cobalt blue.jpg") is None
    assert unsafe("a/" + "x" * 256) == "a segment longer than 255 bytes"
    assert unsafe("a\x00b") is not None and unsafe("a\\b") is not None and unsafe("COM1") is not None
    assert clashes({"one": "Café/a.jpg", "two": "cafe\u0301/A.JPG", "three": "b.jpg"}) == [
        ("one", "two", "cafe\u0301/A.JPG")
    ]


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("{job_id:>999999999}.{ext}", "{job_id:>999999999} asks for a width of 999999999"),
        ("{sku:.99999999999999}.{ext}", "asks for a precision of 99999999999999"),
        ("{sku:x<1025}.{ext}", "asks for a width of 1025; a name is at most 1,024 bytes"),
        ("{sku:zz}.{ext}", "{sku:zz} has an invalid format spec"),
    ],
)
def test_a_format_spec_wider_than_a_name_is_refused_before_any_name_is_formatted(
    out: OutMaker, tmp_path: Path, capsys: pytest.CaptureFixture[str], template: str, why: str
) -> None:
    """Issue 29 #6: `{job_id:>999999999}` formatted a gigabyte per name (>40 s, 3 GB) before the
    1,024-byte check."""
    err = refused(capsys, out, tmp_path / "dest", "--name", template)
    assert err.startswith(f"imagebatch export: --name {template!r}: {{") and why in err
    assert NameTemplate.parse("{sku:>1024}").render({"sku": "a"}) == " " * 1023 + "a"
