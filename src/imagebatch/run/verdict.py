"""`--allow-failures`: how many requests a run may leave not done and still end Completed (exit 0), and
the rule that decides a run's final state (`verdict`).

Without Prefect, so that the command line can check it before Prefect starts, and a rerun settled without
Prefect (`run.nothing_to_send`) ends by the same rule; the warnings a run ends with (`warnings`) are said
in the same words in the flow run's log and on the terminal."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from imagebatch.errors import UsageError
from imagebatch.run.constants import INTERRUPTED
from imagebatch.storage.layout import UNKNOWN_HINT
from imagebatch.words import counted
from imagebatch.work.outcome import not_done, total

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


Verdict = Literal["Completed", "Failed", "Cancelled"]


def verdict(info: dict[str, Any], allowance: Allowance | None = None) -> Verdict:
    """A run's final state by its summary (`run.final_state.final_state` makes it a Prefect state):
    Cancelled when a signal stopped it; Failed when a record could not be written, or it stopped early
    with requests not done; Completed when every request is done, or those not done are within
    `allowance`; else Failed. The command's exit code is 0 exactly when it is Completed."""
    counts = info["counts"]
    stopped: str | None = info.get("stopped")
    missing = not_done(counts)
    if stopped and stopped.startswith(INTERRUPTED):
        return "Cancelled"
    if info.get("unwritten") or (stopped and missing):
        return "Failed"
    if not missing or (allowance is not None and allowance.allows(missing, total(counts))):
        return "Completed"
    return "Failed"


def warnings(info: dict[str, Any]) -> Iterator[str]:
    """One line per kind of problem a run ended with, each saying what to do: a stop (401 and 402 name
    their fix), 429s, `unknown`, other failures, answers without an image, unwritten records."""
    counts: Mapping[str, int] = info["counts"]
    if stopped := info.get("stopped"):
        left = counts.get("not_attempted", 0)
        rest = f"{counted(left, 'request')} not attempted. A rerun picks up where this one stopped."
        yield f"Stopped early: {stopped}. {rest}"
    if limited := info.get("rate_limited"):
        yield (
            f"{counted(limited, 'request')} failed on HTTP 429 (the service's rate limit; the native and "
            "chat routes are never retried): a rerun sends them; a lower rpm or concurrency (or a "
            "--global-limit shared by every run) avoids it."
        )
    if unknown := counts.get("unknown"):
        what = "ended with an unknown outcome (sent, no answer)"
        yield f"{counted(unknown, 'request')} {what}; for each, {UNKNOWN_HINT}."
    failed = counts.get("failed", 0) - (info.get("rate_limited") or 0)
    if failed > 0:
        why = "the error column of results.csv (and report.html) says why"
        yield f"{counted(failed, 'request')} failed: {why}."
    if no_image := counts.get("no_image"):
        what = "came back without an image (no_image): results.csv has the text"
        yield f"{counted(no_image, 'request')} {what}."
    yield from info.get("unwritten") or []
