"""Commands live in cli/: the rooms below it take typed arguments and return results or raise errors
(`imagebatch.errors`), and cli/ alone parses, prints and chooses the exit code, from one table
(`run.exit_codes`). Read from the source with `ast`, so that a command creeping back into a lower room
fails here, naming the module and the line."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "imagebatch"
TABLE = "run/exit_codes.py"
"""The one module that defines exit numbers."""
OWN_PROCESS = {
    "run/graceful_stop.py": {"exit_code_for"},
    "platform/prefect_server.py": {"EXIT_OK"},
    "run/shard_child.py": set(),
}
"""Below cli/, the processes that end themselves, not a command, and what they take from the table: the
flow's own process leaves with 128 + the signal when a second signal abandons its requests
(`abandon_run`), whoever started it (a worker, a script); the temporary Prefect server's process leaves
as soon as the command that started it is gone; a shard's process that a sharded run's parent started
leaves with its engine's code as soon as its run has ended, when Prefect's server was lost."""
EXITS = {"exit", "_exit", "quit", "SystemExit"}
"""What ends a process with a code: `sys.exit`, `os._exit`, `exit`, `quit`, `SystemExit`."""


@functools.cache
def _modules(root: Path) -> dict[str, ast.Module]:
    """Every module under `root`, parsed once for the file's tests (none changes what it is given)."""
    found = {str(p.relative_to(root)): ast.parse(p.read_text()) for p in sorted(root.rglob("*.py"))}
    assert len(found) > 100 and "cli/main.py" in found
    return found


def _in_cli(name: str) -> bool:
    return name.startswith("cli/")


def _imports(tree: ast.Module) -> list[tuple[int, str, set[str]]]:
    """Each import: its line, the module, and the names taken from it."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, set()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module, {alias.name for alias in node.names}))
    return found


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _number(node: ast.AST | None) -> bool:
    """A literal number, or arithmetic on one (`2`, `-1`, `128 + signum`)."""
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    if isinstance(node, ast.UnaryOp):
        return _number(node.operand)
    return isinstance(node, ast.BinOp) and (_number(node.left) or _number(node.right))


def _to_stderr(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.keyword) and n.arg == "file" and ast.unparse(n.value) == "sys.stderr"
        for n in ast.walk(node)
    )


def _answers_like_a_command(function: ast.FunctionDef) -> bool:
    """Prints to stderr and returns a literal number: a command's refusal and its exit code."""
    returns = [n for n in ast.walk(function) if isinstance(n, ast.Return) and _number(n.value)]
    return bool(returns) and _to_stderr(function)


def argparse_outside_cli(modules: dict[str, ast.Module]) -> list[str]:
    return [
        f"{name}:{line} imports argparse"
        for name, tree in modules.items()
        if not _in_cli(name)
        for line, module, _ in _imports(tree)
        if module == "argparse"
    ]


def exit_numbers_outside_the_table(modules: dict[str, ast.Module]) -> list[str]:
    """An exit with a literal number anywhere; a number named EXIT_* outside the table; outside cli/, the
    table named or a process ended (but by `OWN_PROCESS`), a command's handler (`*_main`, `*_command`) or
    a function that prints a refusal on stderr and returns a number; in cli/, a literal number returned (a
    handler's code, which the table names)."""
    found = []
    for name, tree in modules.items():
        if name == TABLE:
            continue
        cli = _in_cli(name)
        for line, module, names in _imports(tree):
            if (
                module == "imagebatch.run.exit_codes"
                and not cli
                and not names <= OWN_PROCESS.get(name, set())
            ):
                found.append(f"{name}:{line} takes {sorted(names)} from the exit-code table")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _called(node) in EXITS:
                if any(_number(a) for a in [*node.args, *(k.value for k in node.keywords)]):
                    found.append(f"{name}:{node.lineno} exits with a literal number")
                elif not cli and name not in OWN_PROCESS:
                    found.append(f"{name}:{node.lineno} ends the process below cli/")
            elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Name) and node.exc.id in EXITS:
                found.append(f"{name}:{node.lineno} raises {node.exc.id}")
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                named = [t.id for t in targets if isinstance(t, ast.Name) and t.id.startswith("EXIT_")]
                named = named if _number(node.value) else []
                found += [f"{name}:{node.lineno} defines {n}" for n in named]
            elif isinstance(node, ast.FunctionDef) and not cli and node.name.endswith(("_main", "_command")):
                found.append(f"{name}:{node.lineno} defines the command handler {node.name}")
            elif isinstance(node, ast.FunctionDef) and not cli and _answers_like_a_command(node):
                found.append(f"{name}:{node.lineno} prints a refusal and returns its exit code")
            elif isinstance(node, ast.Return) and cli and _number(node.value):
                found.append(f"{name}:{node.lineno} returns a literal number")
    return found


def test_argparse_is_imported_only_in_cli() -> None:
    assert argparse_outside_cli(_modules(SRC)) == []


def test_exit_numbers_are_named_only_in_the_table() -> None:
    assert exit_numbers_outside_the_table(_modules(SRC)) == []


@pytest.mark.parametrize(
    ("path", "source", "found"),
    [
        ("platform/limits.py", "import argparse\n", "platform/limits.py:1 imports argparse"),
        ("report/review.py", "import sys\nsys.exit(2)\n", "report/review.py:2 exits with a literal number"),
        ("cli/run.py", "def f() -> int:\n    return 2\n", "cli/run.py:2 returns a literal number"),
        ("cli/run.py", "raise SystemExit(130)\n", "cli/run.py:1 exits with a literal number"),
        ("manifest/validate.py", "EXIT_INVALID = 2\n", "manifest/validate.py:1 defines EXIT_INVALID"),
        (
            "platform/worker.py",
            "from imagebatch.run.exit_codes import EXIT_USAGE\n",
            "platform/worker.py:1 takes ['EXIT_USAGE'] from the exit-code table",
        ),
        (
            "delivery/command.py",
            "def export_main(args) -> int: ...\n",
            "delivery/command.py:1 defines the command handler export_main",
        ),
        (
            "report/review.py",
            "def serve_review() -> int:\n    print('refused', file=sys.stderr)\n    return 2\n",
            "report/review.py:1 prints a refusal and returns its exit code",
        ),
    ],
)
def test_the_scan_finds_a_command_below_cli(path: str, source: str, found: str) -> None:
    """Each rule of the scan, on a module written the way the commands once were."""
    modules = {path: ast.parse(source)}  # the rules read one module at a time
    assert found in argparse_outside_cli(modules) + exit_numbers_outside_the_table(modules)
