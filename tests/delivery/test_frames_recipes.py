"""Every notebook recipe the manual and `imagebatch.results`' docstring show runs, line by line, against a
real folder after a run and a rerun on the emulator, and says what a user means by it: over every run a
complete folder is all succeeded (`outcome`), while the last run alone skipped what was done earlier
(`status`); the documented merge with the decisions keeps one `variant` column. A recipe line this test
does not know fails it, so a changed recipe is checked before it is published."""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from helpers.runs import run_now, write_jsonl

import imagebatch
from imagebatch.delivery import frames
from imagebatch.storage.kinds import open_location
from imagebatch.work.decisions import Decision, record_decision

pytestmark = pytest.mark.usefixtures("prefect_harness", "restore_logging")  # flow runs

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```[ \t]*$", re.M | re.S)
LOCATION = re.compile(r"imagebatch\.results\(\"[^\"]*\"\)")
JOBS = [
    {"id": f"mug-{i}", "prompt": f"a mug, angle {i}", "model": "compat-image-2", "sku": f"00{i}"}
    for i in range(6)
]


def recipes() -> Iterator[tuple[str, str]]:
    """(where, code) of each recipe: a page's python blocks that call `imagebatch.results`, and the
    module docstring's indented example."""
    for page in PAGES:
        for match in FENCE.finditer(page.read_text(encoding="utf-8")):
            code = textwrap.dedent(match.group(2))
            if "imagebatch.results(" in code:
                yield str(page.relative_to(ROOT)), code
    doc = frames.__doc__ or ""
    block = doc.split("\n\n")[1]
    yield "imagebatch.delivery.frames", textwrap.dedent(block)


def run_recipe(code: str, out: Path) -> dict[str, Any]:
    """Each top-level statement of `code`, run in order on the folder `out`; the value of each
    expression statement, by its source text."""
    tree = ast.parse(LOCATION.sub(f"imagebatch.results({str(out)!r})", code))
    names: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Expr):
            values[ast.unparse(statement)] = eval(ast.unparse(statement), names)
        else:
            exec(ast.unparse(statement), names)
    values.update({f"{name} =": value for name, value in names.items() if name != "__builtins__"})
    return values


def counts(value: Any) -> dict[str, int]:
    return {str(k): int(v) for k, v in value.to_dict().items()}


# What each expression says of the folder after the run (one request refused by the service) and a rerun.
EXPECTED: dict[str, Callable[[Any], bool]] = {
    "r.results.groupby('outcome').size()": lambda v: counts(v) == {"succeeded": 6},
    "r.results.groupby('status').size()": lambda v: counts(v) == {"skipped": 5, "succeeded": 1},
    "r.results[r.results.outcome != 'succeeded']": lambda v: v.empty,
    "r.usage.groupby('model')[['images', 'total_tokens']].sum()": (
        lambda v: v.images.to_dict() == {"compat-image-2": 6}
    ),
    "reviewed.groupby('decision').size()": lambda v: counts(v) == {"approved": 2, "rejected": 1},
    "reviewed =": lambda v: (
        len(v) == 6 and "variant" in v.columns and not {"variant_x", "variant_y"} & set(v.columns)
    ),
    "r.run": lambda v: v is not None and v.state == "finished" and v.sent == 1,  # the rerun: the failed one
    "r =": lambda v: isinstance(v, imagebatch.Results),
    "imagebatch =": lambda v: v is imagebatch,
}


@pytest.fixture(scope="module")
def reran(
    tmp_path_factory: pytest.TempPathFactory, emulator_server: Any, prefect_harness: str
) -> Iterator[Path]:
    """A folder after a run in which one request failed (503 on all four attempts) and a rerun that sent
    only that one again, with three review decisions."""
    emulator = emulator_server
    emulator.reset()
    tmp = tmp_path_factory.mktemp("recipes")
    manifest = write_jsonl(tmp / "m.jsonl", JOBS)
    out = tmp / "out"
    emulator.set_faults(scripts=[{"outcomes": [503] * 4 + ["ok"], "match": "angle 5"}])
    with pytest.MonkeyPatch.context() as env:
        env.setenv("IMAGEBATCH_BASE_URL", emulator.url)
        env.setenv("IMAGEBATCH_API_KEY", emulator.api_key)
        first = run_now(manifest, out)
        second = run_now(manifest, out)
    assert {s: n for s, n in first["counts"].items() if n} == {"succeeded": 5, "failed": 1}
    assert {s: n for s, n in second["counts"].items() if n} == {"skipped": 5, "succeeded": 1}
    keys = imagebatch.results(out).results.idempotency_key.tolist()
    where = open_location(out)
    record_decision(where, Decision(keys[0], 1, "rejected", "handle missing", "ana"))
    record_decision(where, Decision(keys[1], 1, "approved", reviewer="ana"))
    record_decision(where, Decision(keys[2], 1, "approved", reviewer="bo"))
    yield out
    emulator.reset()


@pytest.mark.parametrize(("where", "code"), list(recipes()), ids=lambda x: x.split("\n")[0][:40])
def test_a_documented_recipe_says_what_it_means_after_a_rerun(where: str, code: str, reran: Path) -> None:
    values = run_recipe(code, reran)
    unknown = sorted(set(values) - set(EXPECTED))
    assert not unknown, f"{where}: a recipe line this test does not check: {unknown}"
    for source, value in values.items():
        assert EXPECTED[source](value), f"{where}: {source} gave\n{value}"


def test_the_recipes_are_found() -> None:
    found = [where for where, _ in recipes()]
    assert "docs/output-folder.md" in found and "imagebatch.delivery.frames" in found


def test_a_manifest_column_named_outcome_is_kept_beside_the_runs_outcome() -> None:
    row = {"job_id": "a", "request_index": "0", "status": "skipped", "outcome": "reshoot"}
    frame = frames.results_frame([row, {**row, "status": "no_image", "outcome": ""}])
    columns = frame.columns.tolist()
    assert columns.index("outcome") == columns.index("status") + 1
    assert frame.outcome.tolist() == ["succeeded", "no_image"]
    assert frame.outcome_manifest.tolist() == ["reshoot", pd.NA]
