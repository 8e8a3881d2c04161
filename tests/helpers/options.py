"""A value other than its default for every field of the options model, so that tests driven by the
model's fields (a shard's parameters, the settled rerun, the command line) cover an option added later."""

from __future__ import annotations

import types
import typing
from typing import Any

from imagebatch.options import fields


def other_value(name: str) -> Any:
    """A valid value of the field `name` that is not its default (a string names its field)."""
    info = fields()[name]
    kind = info.annotation
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if kind is bool:
        return not info.default
    if kind is int:
        return (info.default or 0) + 3
    if kind is float:
        return (info.default or 0.0) + 7.5
    if typing.get_origin(kind) is list:
        return [f"/srv/{name}"]
    if typing.get_origin(kind) is typing.Literal:
        return typing.get_args(kind)[0]
    assert kind is str, f"{name}: give tests/helpers/options.py a value for {kind}"
    special = {"allow_failures": "3", "redo": "rejected,no_image"}  # values with rules of their own
    return special.get(name, f"value-of-{name}")


def every_other() -> dict[str, Any]:
    """Every field at a value other than its default, by name."""
    return {name: other_value(name) for name in fields()}
