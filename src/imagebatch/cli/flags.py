"""The flags of a run's options, derived from the options model (`imagebatch.options`): one flag per
field, its type, choices and help from the field, so that `run`, `deploy`, `serve` and `validate` never
list an option by hand. A flag's default is None, meaning "the model's default" (or its environment
variable's), so that the model stays the one place a default is written; the flags given make the
run's options in `options_from`.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from imagebatch.cli.common import with_default
from imagebatch.errors import UsageError
from imagebatch.options import OWNER, RunOptions, cli_of, fields, flag_of, problem


def add_option_flags(
    parser: argparse.ArgumentParser,
    command: str,
    *,
    only: Iterable[str] | None = None,
    helps: dict[str, str] | None = None,
) -> None:
    """Add the flags of the fields `command` takes (or of the fields named in `only`), in one argument
    group per group of the model; `helps` replaces a field's help where a command means it otherwise."""
    chosen = set(only) if only is not None else None
    titles: dict[str, argparse._ArgumentGroup] = {}
    for name, info in fields().items():
        if (chosen is None and command not in cli_of(info).commands) or (
            chosen is not None and name not in chosen
        ):
            continue
        group = OWNER[name]
        if group not in titles:
            model = RunOptions.model_fields[group].annotation
            doc = " ".join((getattr(model, "__doc__", None) or "").split())
            titles[group] = parser.add_argument_group(group, doc.replace("%", "%%"))
        text = (helps or {}).get(name) or help_of(info)
        titles[group].add_argument(
            flag_of(name), dest=name, default=None, help=text.replace("%", "%%"), **kind_of(info)
        )


def help_of(info: FieldInfo) -> str:
    """The field's description ending in its default, `(default: X)` (`cli.common.with_default`); a field
    unset by default (no limit, no redo, no pacing) says `none`."""
    default = info.default
    if isinstance(default, bool):
        shown: str | None = "on" if default else "off"
    elif isinstance(default, (int, float)):
        shown = f"{default:g}"
    else:
        shown = "none" if default is None else str(default)
    return with_default(info.description or "", shown)


def kind_of(info: FieldInfo) -> dict[str, Any]:
    """argparse's keywords for the field's type: a switch with its --no- form, a repeatable value, a
    choice, or a value of its type."""
    kind = _without_none(info.annotation)
    metavar = cli_of(info).metavar
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(kind) is list:
        return {"action": "append", "metavar": metavar}  # repeated: --files-root A --files-root B
    if typing.get_origin(kind) is typing.Literal:
        return {"choices": typing.get_args(kind)}
    return {"type": kind, "metavar": metavar}


def _without_none(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kept = [a for a in typing.get_args(annotation) if a is not type(None)]
        return kept[0] if len(kept) == 1 else annotation
    return annotation


def options_from(args: argparse.Namespace, command: str) -> RunOptions:
    """The run's options from a command's parsed flags (`cli.flags`: an absent flag is None, leaving the
    model's default); a value out of its bounds is `UsageError`, one line naming the flag."""
    given = {
        name: getattr(args, name)
        for name in fields()
        if getattr(args, name, None) is not None  # a flag `command` has (cli.flags made it), given
    }
    try:
        return RunOptions.from_flat(**given)
    except ValidationError as exc:
        raise UsageError(problem(exc)) from None
