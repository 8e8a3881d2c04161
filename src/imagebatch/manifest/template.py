"""Prompt templates: `{column}` placeholders filled from a row's other columns, `{{` `}}` for braces."""

from __future__ import annotations

import difflib
import functools
import json
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

# --- templates ---------------------------------------------------------------------------------------

_TEXT = frozenset({str})

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


class TemplateError(ValueError):
    """A prompt template that cannot be filled in; `issues` lists (message, hint) for every fault."""

    def __init__(self, issues: list[tuple[str, str | None]]) -> None:
        super().__init__("; ".join(m for m, _ in issues))
        self.issues = issues


def template_value(value: Any) -> str | None:
    """How a row's value reads inside a prompt; None for a list or object (not allowed)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return None


@functools.lru_cache(maxsize=1024)
def _parse_template(template: str) -> tuple[tuple[int, str, str | None], ...]:
    """Split a template once into (kind, text, hint) segments: 0 literal, 1 placeholder, 2 fault.

    Cached: a catalog's rows usually share one template, so it is parsed once, not once per row.
    """
    segments: list[tuple[int, str, str | None]] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(template):
        if match.start() > pos:
            segments.append((0, template[pos : match.start()], None))
        pos = match.end()
        token, name = match.group(0), match.group(1)
        if token in ("{{", "}}"):
            segments.append((0, token[0], None))
        elif name is None:
            segments.append((2, f"unmatched {token!r} in the prompt", "write {{ or }} for a literal brace"))
        elif not name.strip():
            segments.append((2, "empty placeholder {} in the prompt", "write {{}} for literal braces"))
        elif name.strip() == "prompt":
            segments.append((2, "the placeholder {prompt} would make the prompt contain itself", None))
        else:
            segments.append((1, name.strip(), None))
    if pos < len(template):
        segments.append((0, template[pos:], None))
    return tuple(segments)


@functools.lru_cache(maxsize=1024)
def _format_of(template: str) -> tuple[str, Callable[[Mapping[str, Any]], Any], bool] | None:
    """The template as a `%` format, a getter of its placeholders' values in order, and whether the
    getter gives a lone value (one placeholder) rather than a tuple; None for a template with a fault.
    Cached as `_parse_template` is: a catalog's rows share a template, and their values are text."""
    parts: list[str] = []
    names: list[str] = []
    for kind, text, _ in _parse_template(template):
        if kind == 2:
            return None
        parts.append(text.replace("%", "%%") if kind == 0 else "%s")
        if kind == 1:
            names.append(text)
    getter = operator.itemgetter(*names) if names else (lambda values: ())
    return "".join(parts), getter, len(names) == 1


def render_prompt(template: str, values: Mapping[str, Any]) -> str:
    """Fill `{column}` placeholders from `values`; `{{` and `}}` are literal braces.

    Raises TemplateError listing every placeholder that names no column (with the nearest column name as
    a hint), every unmatched brace and every placeholder naming a list or object.
    """
    if "{" not in template and "}" not in template:
        return template
    if type(values) is dict and (compiled := _format_of(template)) is not None:
        # Text values read as themselves: one format fills them in. Any other value (a number, a list) or
        # a column that is not there takes the general path below, which reads or reports it.
        form, getter, lone = compiled
        try:
            got = getter(values)
        except KeyError:
            pass
        else:
            got = (got,) if lone else got
            if _TEXT.issuperset(map(type, got)):
                return form % got
    issues: list[tuple[str, str | None]] = []
    parts: list[str] = []
    for kind, text, hint in _parse_template(template):
        if kind == 0:
            parts.append(text)
        elif kind == 2:
            issues.append((text, hint))
        elif text not in values:
            close = difflib.get_close_matches(text, [str(k) for k in values], n=1, cutoff=0.6)
            hint = f"did you mean {{{close[0]}}}?" if close else "write {{ and }} for literal braces"
            issues.append((f"placeholder {{{text}}} names no column of this row", hint))
        elif (value := template_value(values[text])) is None:
            issues.append((f"placeholder {{{text}}} names a list or object, not a value", None))
        else:
            parts.append(value)
    if issues:
        raise TemplateError(issues)
    return "".join(parts)
