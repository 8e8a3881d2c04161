"""The house rules that no linter here keeps: a function of src/ fits a screen (60 lines, decorators and
docstring included) and a module stays under 500 lines. Split along a seam when one grows past them."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_FUNCTION, MAX_MODULE = 60, 500


def _modules() -> list[Path]:
    found = sorted(SRC.rglob("*.py"))
    assert len(found) > 100  # the package is there
    return found


def test_every_module_stays_under_500_lines() -> None:
    long = {
        str(p.relative_to(SRC)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE
    }
    assert long == {}


def test_every_function_fits_a_screen() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (lines := (node.end_lineno or node.lineno) - first + 1) > MAX_FUNCTION:
                    long[f"{path.relative_to(SRC)}:{node.lineno} {node.name}"] = lines
    assert long == {}
