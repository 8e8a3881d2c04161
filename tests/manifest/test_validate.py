"""`imagebatch validate`: exit codes and output, called through `validate_command`; the examples validate."""

from __future__ import annotations

import gc
import io
from pathlib import Path

import pytest

from imagebatch.cli.main import build_parser, main
from imagebatch.cli.validate import validate_command
from imagebatch.manifest import ManifestError, load_manifest, plan, summarise

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = validate_command(build_parser().parse_args(["validate", *argv]), out=out)
    return code, out.getvalue()


def test_valid_manifest_prints_the_plan(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id,prompt,count,route,model\na,x,2,,\nb,y,,messages,claude-compat-small\n")
    code, out = run(str(path))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"{path}: valid (csv, sha256 ")
    assert lines[1:] == [
        "route     model                jobs  requests  images at most",
        "native    native-image-2.1        1         2               2",
        "messages  claude-compat-small     1         1               0",
        "total                             2         3               2",
    ]


def test_invalid_manifest_prints_every_problem_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id,prompt,image_size\na,x,1k\nb,,\na,z,\n")
    code, out = run(str(path))
    assert code == 2
    assert out.splitlines() == [
        "line 2 (id=a), field image_size: image size must be one of 1K, 2K, 4K (case-sensitive), not '1k' "
        "(did you mean '1K'?)",
        "line 3 (id=b), field prompt: prompt is required",
        "line 4 (id=a), field id: duplicate id 'a': also used on line 2",
        f"{path}: 3 problems; nothing was sent",
    ]


def test_missing_manifest_exits_2(tmp_path: Path) -> None:
    code, out = run(str(tmp_path / "nope.csv"))
    assert code == 2
    assert out.startswith("manifest not found")


def test_format_override_and_keys(tmp_path: Path) -> None:
    path = tmp_path / "jobs.txt"
    path.write_text('{"id": "a", "prompt": "x", "count": 2}\n')
    code, out = run(str(path), "--format", "jsonl", "--keys")
    assert code == 0
    manifest = load_manifest(path, format="jsonl")
    keys = [r.idempotency_key for r in plan(manifest)]
    assert out.splitlines()[-3:] == [
        "job_id\trequest_index\tturn_index\troute\tmodel\tidempotency_key",
        f"a\t0\t0\tnative\tnative-image-2.1\t{keys[0]}",
        f"a\t1\t0\tnative\tnative-image-2.1\t{keys[1]}",
    ]


def test_the_command_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.json"
    path.write_text("[]")
    assert main(["validate", str(path)]) == 2
    assert "the manifest has no jobs" in capsys.readouterr().out


@pytest.mark.parametrize(
    "path", sorted(p for p in EXAMPLES.iterdir() if p.suffix in (".csv", ".json", ".jsonl"))
)
def test_examples_validate(path: Path) -> None:
    code, out = run(str(path))
    assert code == 0, out


def test_examples_cover_what_they_promise() -> None:
    catalog = load_manifest(EXAMPLES / "catalog.csv")
    assert len(catalog.jobs) <= 8
    assert {j.image_size for j in catalog.jobs} == {"1K"}
    assert len({j.aspect_ratio for j in catalog.jobs}) >= 3
    assert "sku" in catalog.metadata_columns
    assert all("{" not in j.prompt for j in catalog.jobs)

    mixed = load_manifest(EXAMPLES / "mixed.json")
    routes = {r.route.value for r in plan(mixed)}
    assert routes == {"native", "chat", "images_generations", "images_edits", "messages", "responses"}
    assert any(j.turns and len(j.turns) == 2 for j in mixed.jobs)
    assert any(j.mask is not None for j in mixed.jobs)
    assert any(j.route == "native" and j.reference_images and not j.turns for j in mixed.jobs)
    assert summarise(plan(mixed)).jobs == len(mixed.jobs)


def test_loading_leaves_the_cycle_collector_as_it_found_it(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    good.write_text("id,prompt\na,x\n")
    bad.write_text("id,prompt,image_size\na,x,9K\n")
    assert gc.isenabled()
    load_manifest(good)
    assert gc.isenabled()
    with pytest.raises(ManifestError):
        load_manifest(bad)
    assert gc.isenabled()
    gc.disable()
    try:
        load_manifest(good)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_validate_prints_the_summary_a_plan_would_give(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(
        '[{"id": "a", "prompt": "x", "count": 3, "max_images": 2, "turns": ["y"]},'
        ' {"id": "b", "prompt": "x", "route": "messages", "model": "claude-compat-small"}]'
    )
    code, out = run(str(path))
    assert code == 0
    assert out.splitlines()[1:] == summarise(plan(load_manifest(path))).table().splitlines()


def test_a_plain_validate_counts_what_loading_would_plan_and_refuses_as_it_does(folder: Path) -> None:
    """Without --keys, --name, --out or --prices the command counts the plan as it checks the rows
    (`summarise_manifest`); with --keys it loads the manifest: both say the same of it."""
    path = folder / "m.csv"
    routes = ["", "images"]
    rows = [f"r{i},{routes[i % 2]},images/ref.png,{1 + i % 3},A {{colour}} mug,{i}" for i in range(60)]
    path.write_text("id,route,reference_images,count,prompt,colour\n" + "\n".join(rows) + "\n")
    code, counted = run(str(path))
    keyed_code, keyed = run(str(path), "--keys")
    assert code == keyed_code == 0
    assert counted.splitlines() == keyed.splitlines()[: len(counted.splitlines())]
    assert counted.splitlines()[-1].split() == ["total", "60", "120", "120"]

    rows[7] = "r3,,images/ref.png,0,A {colur} mug,1"
    path.write_text("id,route,reference_images,count,prompt,colour\n" + "\n".join(rows) + "\n")
    code, counted = run(str(path))
    keyed_code, keyed = run(str(path), "--keys")
    assert code == keyed_code == 2
    assert counted == keyed
    assert counted.splitlines()[-1] == f"{path}: 3 problems; nothing was sent"
