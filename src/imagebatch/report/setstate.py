"""The state of a set: an output folder after any number of runs and redos, as a person asks about it (how
many requests are done, what still needs a reviewer), beside what the last run alone did (run.json).

A request's status in the set is its best variant's: done (succeeded in any run: results.csv's
`succeeded`, or `skipped`, "done earlier") if any variant is, else its newest variant's. A review is
open while a person still has something to do: an image unreviewed, or rejected and not yet redone. A
rejected image that a newer variant of its request has replaced is "redone", counted apart (the page
`report.review_page` applies the same rule, from each card's `x`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from imagebatch.work.decisions import Decision
from imagebatch.work.runsummary import RunSummary

DONE = ("succeeded", "skipped")
"""The statuses of a request whose image was made (in this run, or an earlier one)."""
STATUS_LABELS = {"skipped": "done earlier"}
"""How a card names a status, where results.csv's word would mislead (`skipped` reads as "not done")."""
REVIEW_STATES = ("unreviewed", "rejected", "approved", "redone", "not_chosen")
OPEN = ("unreviewed", "rejected")
"""The review states that still need a person."""


def status_label(status: str) -> str:
    """A status as a card shows it (`skipped` is "done earlier")."""
    return STATUS_LABELS.get(status, status)


def request_of(row: Mapping[str, str]) -> tuple[str, str, str]:
    """The request a results.csv row is a variant of: (job, request, turn)."""
    return row["job_id"], row["request_index"], row.get("turn_index") or "0"


def variant_number(row: Mapping[str, str]) -> int:
    """A row's variant: results.csv's `variant` cell, 1 where the column or the cell is missing."""
    try:
        return max(1, int(row.get("variant") or 1))
    except ValueError:
        return 1


def superseded(rows: Iterable[Mapping[str, str]]) -> set[str]:
    """The keys of the reviewable rows (`reviewable`: images to judge) that a newer reviewable variant of
    their request has replaced."""
    newest: dict[tuple[str, str, str], int] = {}
    kept = [(request_of(row), variant_number(row), row["idempotency_key"]) for row in rows]  # not the rows
    for request, variant, _ in kept:
        newest[request] = max(newest.get(request, 0), variant)
    return {key for request, variant, key in kept if variant < newest[request]}


def review_state(decision: Decision | None, replaced: bool) -> str:
    """One image's review state (`REVIEW_STATES`): approved, else redone if a newer variant replaced it,
    else rejected or unreviewed (open)."""
    kind = decision.decision if decision is not None and decision.decision != "cleared" else None
    if kind == "approved":
        return "approved"
    if replaced:
        return "redone"
    return kind or "unreviewed"


def review_counts(
    rows: Iterable[Mapping[str, str]], decisions: Mapping[str, Decision]
) -> tuple[Counter[str], set[str]]:
    """The reviewable `rows`' images by review state (`review_state`, `decisions` those in force), and the
    keys of those a newer variant replaced (`superseded`)."""
    kept = list(rows)
    return review_states(kept, decisions), superseded(kept)


def review_states(rows: Iterable[Mapping[str, str]], decisions: Mapping[str, Decision]) -> Counter[str]:
    """`review_counts`' count, in memory that does not grow with the rows: `rows` is walked twice (an
    iterable made anew on each walk, as a run's records read back from its spool), and only the requests
    with a variant past the first are remembered between the walks."""
    newest: dict[tuple[str, str, str], int] = {}
    for row in rows:
        if (variant := variant_number(row)) > 1:
            request = request_of(row)
            newest[request] = max(newest.get(request, 1), variant)
    counts: Counter[str] = Counter()
    for row in rows:
        replaced = bool(newest) and variant_number(row) < newest.get(request_of(row), 1)
        counts[review_state(decisions.get(row["idempotency_key"]), replaced)] += 1
    return counts


def set_counts(rows: Iterable[Mapping[str, str]]) -> Counter[str]:
    """The set's requests by status, each request counted once (its best variant, above)."""
    best: dict[tuple[str, str, str], tuple[bool, int, str]] = {}
    for row in rows:
        rank = (row["status"] in DONE, variant_number(row), row["status"])
        request = request_of(row)
        if request not in best or rank[:2] > best[request][:2]:
            best[request] = rank
    return Counter("done" if done else status for done, _, status in best.values())


def review_line(states: Mapping[str, int]) -> str:
    """`12 open (10 unreviewed, 2 rejected) · 40 approved · 3 redone`."""
    unreviewed, rejected = states.get("unreviewed", 0), states.get("rejected", 0)
    line = f"{unreviewed + rejected:,} open ({unreviewed:,} unreviewed, {rejected:,} rejected)"
    line += f" · {states.get('approved', 0):,} approved"
    if states.get("redone"):
        line += f" · {states['redone']:,} redone"
    if states.get("not_chosen"):
        line += f" · {states['not_chosen']:,} not chosen"
    return line


def last_run_line(run: RunSummary | None) -> str:
    """What the last run did, from run.json's counts: `finished: succeeded 6 · failed 2 · done earlier
    52`; empty if there is no run.json or it has no counts."""
    if run is None or not run.counts:
        return ""
    parts = [f"{status_label(s)} {n:,}" for s, n in run.counts.items() if n]
    state = " ".join(x for x in (run.state, run.stopped or "") if x)
    return f"{state}: {' · '.join(parts) or 'nothing'}"
