"""`imagebatch export` refuses hostile input with one line per problem, exit 2, no traceback and DEST
not created, each test written as the attack: an image of OUT linked to a file outside it; a canvas of
400 megapixels; `{request_index:c}` over a large index; names and slugs holding invisible Unicode."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.exports import OutMaker, encoded
from helpers.runs import cli
from PIL import Image

from imagebatch.delivery.naming import NameTemplate, TemplateError

RED = encoded(Image.new("RGB", (8, 8), (255, 0, 0)), "PNG")


def refused(capsys: pytest.CaptureFixture[str], out: OutMaker, dest: Path, *options: str) -> str:
    """Run the export; assert exit 2, DEST absent, no traceback; return stderr."""
    code, stdout, err = cli(capsys, "export", str(out.root), "--to", str(dest), *options)
    assert code == 2, stdout
    assert not dest.exists() and "Traceback" not in err
    return err


def test_an_image_linked_out_of_out_is_refused_not_read(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "secret.png"
    secret.write_bytes(encoded(Image.new("RGB", (8, 8), (1, 2, 3)), "PNG"))
    made = make_out()
    made.add("fine", [RED], sku="A", colour="red")
    linked = made.add("linked", [RED], sku="B", colour="red")
    made.write()
    (made.root / linked["paths"]).unlink()
    (made.root / linked["paths"]).symlink_to(secret)
    err = refused(capsys, made, tmp_path / "dest", "--name", "{sku}.{ext}")
    assert (
        f"results.csv row 3 (job 'linked', request 0): its image {linked['paths']} leads out of OUT through "
        "a symbolic link: not read"
    ) in err
    assert "1 problem; nothing was written" in err


def test_a_canvas_of_more_than_100_megapixels_is_refused_before_any_work(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = make_out()
    for k in range(6):
        made.add(f"job{k}", [RED], sku=f"S{k}", colour="red")
    made.write()
    started = time.monotonic()
    err = refused(capsys, made, tmp_path / "dest", "--canvas", "20000x20000")
    assert (
        err == "imagebatch export: --canvas '20000x20000' is 400 megapixels; at most 100 (as 10000x10000)\n"
    )
    assert time.monotonic() - started < 30  # refused, not 3 GB and minutes of canvases
    code, _, _ = cli(capsys, "export", str(made.root), "--to", str(tmp_path / "ok"), "--canvas", "20x5000")
    assert code == 0  # a long side within bounds, few pixels: fine


def test_a_character_format_spec_is_refused_with_the_template(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = make_out()
    made.add("big", [RED], request=2_000_000, sku="A", colour="red")  # past U+10FFFF as a character
    made.write()
    err = refused(capsys, made, tmp_path / "dest", "--name", "{request_index:c}.{ext}")
    assert err == (
        "imagebatch export: --name '{request_index:c}.{ext}': {request_index:c} makes a character of a "
        "number (':c'), which a name cannot hold: use 'd'\n"
    )
    with pytest.raises(TemplateError, match="cannot hold"):
        NameTemplate.parse("{sku:>5c}")
    template = NameTemplate.parse("{sku:e}")  # a value that overflows its spec: refused, not raised
    with pytest.raises(TemplateError, match="too large"):
        template.render({"sku": 10**400})


INVISIBLE = {
    "\u0085": "U+0085",  # NEXT LINE, a C1 control
    "\u2028": "U+2028 (LINE SEPARATOR)",
    "\u202e": "U+202E (RIGHT-TO-LEFT OVERRIDE)",
    "\u200f": "U+200F (RIGHT-TO-LEFT MARK)",
    "\u00ad": "U+00AD (SOFT HYPHEN)",
}


def test_names_refuse_every_control_format_and_separator_character(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = make_out()
    for k, char in enumerate(INVISIBLE):
        made.add(f"j{k}", [RED], sku=f"photo{char}gpj", colour="red")
    made.write()
    err = refused(capsys, made, tmp_path / "dest", "--name", "{sku}.{ext}")
    for k, shown in enumerate(INVISIBLE.values()):
        assert f"results.csv row {k + 2} (job 'j{k}', request 0): its name" in err
        assert f"the invisible character {shown}" in err
    assert f"{len(INVISIBLE)} problems; nothing was written" in err


def test_slug_cleans_separators_and_refuses_format_characters(
    make_out: Callable[..., OutMaker], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = make_out()
    made.add("next-line", [RED], sku="Mug\u0085Blue", colour="red")
    made.add("override", [RED], sku="gnp\u202eexe", colour="red")
    made.write()
    err = refused(capsys, made, tmp_path / "dest", "--name", "{sku}.{ext}", "--slug")
    assert "row 3 (job 'override', request 0): its name 'gnp\\u202eexe.png' is refused" in err
    assert "U+202E (RIGHT-TO-LEFT OVERRIDE)" in err and "next-line" not in err  # U+0085 made '-'


@pytest.mark.parametrize("slug", [[], ["--slug"]])
@pytest.mark.parametrize("value", ["\u200b", "\u200b\u200b", " \u3000 ", "\u2029"])
def test_a_value_with_nothing_visible_is_refused(
    make_out: Callable[..., OutMaker],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    value: str,
    slug: list[str],
) -> None:
    made = make_out()
    made.add("blank", [RED], sku=value, colour="red")
    made.write()
    err = refused(capsys, made, tmp_path / "dest", "--name", "{colour}-{sku}.{ext}", *slug)
    assert f"results.csv row 2 (job 'blank', request 0): {{sku}} is {value!r}: nothing visible in it" in err
