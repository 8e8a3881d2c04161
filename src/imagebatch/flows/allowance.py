"""`--allow-failures`: how many requests a run may leave not done and still end Completed (exit 0).

Without Prefect, so that the command line can check it before Prefect starts."""

from __future__ import annotations

import re
from dataclasses import dataclass

from imagebatch.flows.config import UsageError

ALLOW_HELP = "N (requests) or P% (of the run's requests)"


@dataclass(frozen=True)
class Allowance:
    """How many requests a run may leave not done and still be Completed (`--allow-failures`)."""

    count: int | None = None
    percent: float | None = None

    def allows(self, missing: int, requests: int) -> bool:
        if self.count is not None:
            return missing <= self.count
        return self.percent is not None and missing * 100 <= self.percent * requests + 1e-9

    def __str__(self) -> str:
        return f"{self.count}" if self.count is not None else f"{self.percent:g}%"


def parse_allowance(text: str | int | None) -> Allowance | None:
    """`--allow-failures`: `3` (at most 3 requests not done) or `2.5%` (of the run's requests); None: 0."""
    if text is None or text == "":
        return None
    value = str(text).strip()
    if match := re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", value):
        percent = float(match.group(1))
        if percent <= 100:
            return Allowance(percent=percent)
    elif value.isdigit():
        return Allowance(count=int(value))
    raise UsageError(f"--allow-failures {value!r}: give {ALLOW_HELP}, e.g. 3 or 2.5%")
