"""How a message a person reads writes what it counts: `1 request`, `3 requests`, never `request(s)`. At
the bottom of the layers, importing nothing, so that any room's message (and a command's start) can use it.
"""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """`1 request`, `3 requests`, `1,024 image names`: the count, and the noun in the number it takes."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
