"""`imagebatch init [DIR]`: the example manifests and images written where a user asks, never over a
file of theirs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.runs import cli

from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE

EXAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "examples"


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def expected() -> dict[str, bytes]:
    """The examples folder without its README (about the repository) and its image-drawing script."""
    tree = _tree(EXAMPLES)
    return {n: d for n, d in tree.items() if n not in ("README.md", "make_images.py") and "__" not in n}


def test_init_writes_the_examples_and_says_what_next(tmp_path: Path, capsys: Any) -> None:
    target = tmp_path / "demo"
    code, out, err = cli(capsys, "init", str(target))
    assert (code, err) == (EXIT_OK, "")
    assert _tree(target) == expected()
    assert {"catalog.csv", "mixed.json", "social.jsonl", "images/product.png"} <= set(expected())
    assert out.splitlines() == [
        f"{len(expected())} example files written to {target} (0 already there)",
        f"next: imagebatch run {target / 'catalog.csv'} --out {target / 'out'}",
    ]


def test_init_again_leaves_identical_files_and_a_users_own(tmp_path: Path, capsys: Any) -> None:
    cli(capsys, "init", str(tmp_path))
    (tmp_path / "notes.txt").write_text("mine")
    code, out, _ = cli(capsys, "init", str(tmp_path))
    assert code == EXIT_OK
    assert out.splitlines()[0] == f"0 example files written to {tmp_path} ({len(expected())} already there)"
    assert _tree(tmp_path) == expected() | {"notes.txt": b"mine"}


def test_init_over_a_different_file_writes_nothing_and_exits_2(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "logo.png").write_bytes(b"my logo")
    code, out, err = cli(capsys, "init", str(tmp_path))
    assert (code, out) == (EXIT_USAGE, "")
    assert err.splitlines() == [
        f"imagebatch init: {tmp_path / 'images' / 'logo.png'} exists and is not the example's; nothing was "
        "written (choose another DIR, or move 1 file away)"
    ]
    assert _tree(tmp_path) == {"images/logo.png": b"my logo"}


def test_init_into_a_file_writes_nothing_and_exits_2(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "demo").write_text("mine")
    code, out, err = cli(capsys, "init", str(tmp_path / "demo"))
    assert (code, out) == (EXIT_USAGE, "")
    assert err == f"imagebatch init: {tmp_path / 'demo'} is a file, not a folder; nothing was written\n"
    assert _tree(tmp_path) == {"demo": b"mine"}
