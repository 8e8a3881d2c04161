"""The house rules that no linter here keeps: a function fits a screen (60 lines, decorators and docstring
included) and a module stays under 500 lines, in src/, the tests and the benchmarks alike. Split along a
seam when one grows past them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION, MAX_MODULE = 60, 500
TREES = {"src": 100, "tests": 100, "bench": 10}  # each tree, and how many modules it has at least


def _modules(tree: str) -> list[Path]:
    found = sorted((ROOT / tree).rglob("*.py"))
    assert len(found) > TREES[tree]
    return found


@pytest.mark.parametrize("tree", TREES)
def test_every_module_stays_under_500_lines(tree: str) -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules(tree)
        if (n := len(p.read_text().splitlines())) > MAX_MODULE
    }
    assert long == {}


@pytest.mark.parametrize("tree", TREES)
def test_every_function_fits_a_screen(tree: str) -> None:
    long = {}
    for path in _modules(tree):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (lines := (node.end_lineno or node.lineno) - first + 1) > MAX_FUNCTION:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert long == {}
