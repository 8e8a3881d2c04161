"""The storage seam is one: no module above storage/ asks which kind of output location it has (a folder or
a bucket); each difference of behaviour is a method of `storage.backend.Backend`. Read from the source
with `ast`, so a new branch fails here before review."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "imagebatch"
KINDS = {"LocalFolder", "ObjectLocation", "FolderBackend", "BucketBackend"}
"""The classes of the two kinds: an `isinstance` against one is a branch on the kind."""
KIND_TESTS = {"is_object_url", "is_object_store"}
"""Functions and attributes that say which kind a location is."""
NO_PLACE = {"root", "folder", "_folder"}
"""Attributes that are None for a bucket: `x.root is None` is a branch on the kind."""
ONE_KIND = NO_PLACE | {"bucket", "prefix", "check"}
"""Attributes only one kind has: `hasattr(loc, "root")`, `getattr(loc, "check", None)` ask the kind."""
OUT_NAMES = {"out", "where", "dest", "location", "loc"}
"""What the code calls `--out` and the like: `isinstance(where, str)` tells a URL from a path."""
SCHEMES = ("s3://", "gs://", "az://", "file://")

ALLOWED = {
    # A manifest's file reference (an input, not the output location) is a local path or a URL: how
    # it is read is the manifest's concern.
    "manifest/sources.py": 2,
    "manifest/models.py": 2,
    # What a person typed, told apart before any location is opened: the trusted-folder list's entries,
    # a deployment's `out` parameter (a local path must be absolute on a worker, and exist), the checks
    # before a run, `validate --out` and `report` (a bucket's credentials and lease; a folder's records
    # and disk), and `report --to` (which copies a bucket's report; a folder's opens in place).
    "run/trust.py": 2,
    "platform/deploy.py": 3,
    "run/preflight.py": 2,
    "cli/outputs.py": 4,
    "cli/validate.py": 1,
}
"""Each module's branches on the kind that remain, and why: the count may only go down."""


def _is_kind_branch(node: ast.AST) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id in KIND_TESTS:
            return True
        if node.func.id == "isinstance" and len(node.args) == 2:
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            of_out = isinstance(node.args[0], ast.Name) and node.args[0].id in OUT_NAMES
            return bool(names & KINDS) or (of_out and bool(names & {"str", "Path"}))
        if node.func.id in ("hasattr", "getattr") and len(node.args) >= 2:
            of_args = isinstance(node.args[0], ast.Name) and node.args[0].id == "args"  # argparse's
            return not of_args and isinstance(node.args[1], ast.Constant) and node.args[1].value in ONE_KIND
    if isinstance(node, ast.Attribute) and node.attr in KIND_TESTS:
        return True
    if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr in NO_PLACE:
        others = node.comparators
        return any(isinstance(c, ast.Constant) and c.value is None for c in others)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
        return any(isinstance(a, ast.Constant) and str(a.value).startswith(SCHEMES) for a in node.args)
    return False


def kind_branches(tree: ast.AST) -> int:
    """How many places in `tree` ask which kind of output location they have."""
    return sum(_is_kind_branch(node) for node in ast.walk(tree))


def test_no_module_above_storage_branches_on_the_kind_of_location() -> None:
    found = Counter[str]()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith("storage/") and (n := kind_branches(ast.parse(path.read_text()))):
            found[rel] = n
    over = {rel: n for rel, n in found.items() if n > ALLOWED.get(rel, 0)}
    assert over == {}, f"branches on the kind of store outside storage/: {over}"
    fewer = {rel: (found[rel], n) for rel, n in ALLOWED.items() if found[rel] < n}
    assert fewer == {}, f"fewer branches than allowed (found, allowed): lower ALLOWED: {fewer}"


def test_the_scan_finds_each_form_of_branch() -> None:
    forms = [
        "if is_object_url(out): pass",
        "if store.is_object_store: pass",
        "if isinstance(loc, LocalFolder): pass",
        "x = loc.root if isinstance(loc, (LocalFolder, Path)) else None",
        "if self.folder is None: pass",
        "if hasattr(loc, 'root'): pass",
        "check = getattr(loc, 'check', None)",
        "text = where if isinstance(where, str) else str(where)",
        "if url.startswith('s3://'): pass",
    ]
    assert [kind_branches(ast.parse(f)) for f in forms] == [1] * len(forms)
    assert kind_branches(ast.parse("if isinstance(x, str) and x.name is None: pass")) == 0
