"""What `--redo` takes: the kinds of request a redo makes a new variant of, and their parsing; light, so
that the options model and the command line read it without loading the variants' machinery
(`work.variants`)."""

from __future__ import annotations

from typing import Literal, get_args

RedoKind = Literal["rejected", "no_image", "failed"]
REDO_KINDS: tuple[RedoKind, ...] = get_args(RedoKind)
"""What `--redo` takes, comma separated."""


def redo_kinds(text: str | None) -> frozenset[RedoKind]:
    """`--redo rejected,no_image` as a set (empty for None); ValueError in one line naming what is not a
    kind."""
    if text is None:
        return frozenset()
    words = [word.strip() for word in text.split(",")]
    if bad := [word for word in words if word not in REDO_KINDS]:
        shown = ", ".join(repr(word) for word in bad)
        raise ValueError(f"--redo takes {', '.join(REDO_KINDS)} (comma separated), not {shown}")
    return frozenset(words)  # type: ignore[arg-type]
