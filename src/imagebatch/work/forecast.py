"""What a run into an output location would do now, sending nothing and writing nothing: `imagebatch
validate MANIFEST --out OUT`, the nightly catalog's "what will tonight cost" and the reviewer's "what will
the redo send".

A run's own rules decide, not a copy of them: the journal replayed as a run replays it
(`OutputStore.load_state`), each key sent, skipped or carried as a run decides (`context.decide`), and an
edit chain's turns as `work.chain` sends them: after a turn that is carried (unknown, no_image) the later
turns are not sent, and a turn to send whose earlier turns are not saved under `chains/` fails unsent
(`chain.saved_turns`). What this module adds is names: a key the journal never saw is `new`, or `changed`
when the journal holds another key for the same job, request and turn (the row was edited since: it is
sent under its new key, and the old images stay, under their own key's file names); a done request whose
newest variant's review decision in force is `rejected` (`work.decisions`; its newest variant as the
journal knows it, the rule `--redo rejected` itself follows: `work.variants.rejected_requests`) waits
for `--redo rejected`, which alone sends it again.

With `redo` (`validate --out OUT --redo KINDS [--edit]`), the plan is the one a `--redo` run makes
(`work.variants.Variants`, the run's own): every variant the journal knows, the new ones
(`redo`) among them, how many are edits, and so what the redo can cost (`--prices`).

Read only: no lock is taken, so a live run is never in the way (nor blocked). Whether one is sending now
is only tested (`OutputStore.in_use`); if one is, the counts are a snapshot of what it has recorded.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from imagebatch.manifest import Manifest, PlannedRequest, plan
from imagebatch.work.chain import saved_turns
from imagebatch.work.context import Unit, decide, group_units
from imagebatch.work.prices import Estimate, PriceTable
from imagebatch.work.stateindex import StateFile
from imagebatch.work.store import KeyState, OutputStore
from imagebatch.work.variants import RedoSummary, Variants, describe, rejected_requests

State = Literal[
    "new",
    "changed",
    "redo",
    "retry",
    "unknown",
    "rejected",
    "done",
    "no_image",
    "redone",
    "blocked",
    "no_history",
]
STATES: dict[State, str] = {
    "new": "never sent",
    "changed": "its row changed since it was sent: sent under its new key; the old images are kept",
    "redo": "a new variant --redo makes (of a rejected, no_image or failed request)",
    "retry": "did not succeed before (or its files are gone): sent again",
    "unknown": "sent before, no answer (it may have been made and billed): sent only with --retry-unknown",
    "rejected": "done, and its review decision is rejected: sent again (a new variant) only with "
    "--redo rejected",
    "done": "succeeded before: skipped",
    "no_image": "answered without an image: not sent again (--redo no_image makes a new variant)",
    "redone": "failed: not sent again itself, its new variant (--redo failed) is",
    "blocked": "a later turn of an edit chain whose earlier turn is not sent",
    "no_history": "a chain turn whose earlier turns are not saved: fails unsent (--force remakes the chain)",
}
"""Each state a planned request can be in, in the order the table shows them, with what a run does."""
NAMED = 20
"""Changed and rejected rows named one by one below the table; `--keys` lists them all."""


@dataclass(frozen=True, slots=True)
class Fate:
    """What a run would do with one planned request."""

    request: PlannedRequest
    state: State
    sends: bool
    """Whether the run would send it (a chain's later turns: if the turns before succeed)."""
    previous_key: str | None = None
    """`changed`: the key the journal last holds for its job, request and turn."""


class Forecast:
    """What a run into `where` would do now: its fates (`fates`), planned anew on each walk, one request at a
    time, so that what it holds is the folder's state (on disk past a few thousand keys,
    `work.stateindex`) and never a fate per request."""

    def __init__(
        self,
        store: OutputStore,
        units: Callable[[], Iterable[Unit]],
        states: Mapping[str, KeyState],
        last_key: LastKeys,
        rejected: set[str],
        in_use: str | None,
        *,
        retry_unknown: bool = False,
        held: frozenset[str] = frozenset(),
        redo: RedoSummary | None = None,
    ) -> None:
        self.store, self.units, self.states, self.last_key = store, units, states, last_key
        self.rejected, self.held = rejected, held
        self.where = store.where
        self.in_use = in_use
        """Who is sending into the location now (the counts are then a snapshot), or None."""
        self.recorded = bool(states)
        """Whether the location holds a journal (a run has started there)."""
        self.retry_unknown = retry_unknown
        self.redo = redo
        """With `redo`: what the redo is to send (variants, edits, by kind)."""

    def fates(self) -> Iterator[Fate]:
        """Every planned request's fate, in the plan's order."""
        for unit in self.units():
            yield from _unit_fates(
                self.store, unit, self.states, self.last_key, self.rejected, self.retry_unknown, self.held
            )


class LastKeys:
    """The key the journal last holds for each request (job, request, turn), as `forecast` reads the
    journal: the newest `BUFFER` in memory, the rest in a nameless SQLite file in the machine's temporary
    folder (`work.stateindex.StateFile`; never in the output location, which a read-only command leaves
    as it found it), so that a folder of any size is read in bounded memory."""

    BUFFER = 10_000

    def __init__(self) -> None:
        self._recent: dict[str, str] = {}
        self._file: StateFile[str] | None = None

    def note(self, ev: dict[str, Any]) -> None:
        """`OutputStore.load_state`'s `seen`: each event, in the journal's order (the last one wins)."""
        self._recent[_request(ev.get("job_id"), ev.get("request_index"), ev.get("turn_index"))] = ev[
            "idempotency_key"
        ]
        if len(self._recent) >= self.BUFFER:
            if self._file is None:
                self._file = StateFile(None, str.encode, bytes.decode)
            self._file.put(self._recent.items())
            self._recent = {}

    def get(self, job_id: str, request_index: int, turn_index: int) -> str | None:
        name = _request(job_id, request_index, turn_index)
        found = self._recent.get(name)
        if found is None and self._file is not None:
            found = self._file.get(name)
        return found


def _request(job_id: Any, request_index: Any, turn_index: Any) -> str:
    """A request's name as `LastKeys` keeps it: its three parts as JSON, so that no two are one name."""
    return json.dumps([job_id, request_index, turn_index])


def forecast(
    manifest: Manifest,
    out: Path | str,
    *,
    retry_unknown: bool = False,
    redo: Collection[str] = frozenset(),
    edit: bool = False,
) -> Forecast:
    """What `imagebatch run MANIFEST --out OUT [--retry-unknown] [--redo KINDS [--edit]]` would send now,
    request by request. The journal is read here; the plan is made on each walk of the fates (with
    `redo`, once here too: the keys a redo holds back are known only at the end of a pass, as a run's
    own counting pass finds them, `run.plan.RunPlan`)."""
    store = OutputStore(out)
    in_use = store.backend.in_use()
    last_key = LastKeys()
    states = store.load_state(last_key.note)
    rejected = rejected_requests(group_units(plan(manifest)), states, store)
    if not redo:
        return Forecast(
            store, lambda: group_units(plan(manifest)), states, last_key, rejected, in_use,
            retry_unknown=retry_unknown,
        )  # fmt: skip
    variants = Variants(states, store, redo=redo, edit=edit, retry_unknown=retry_unknown)
    for _ in variants.units(group_units(plan(manifest))):
        pass  # the counting pass: leaves `held` and `summary`
    return Forecast(
        store, lambda: variants.units(group_units(plan(manifest))), states, last_key, rejected, in_use,
        retry_unknown=retry_unknown, held=variants.held, redo=variants.summary,
    )  # fmt: skip


def _unit_fates(
    store: OutputStore,
    unit: Unit,
    states: Mapping[str, KeyState],
    last_key: LastKeys,
    rejected: set[str],
    retry_unknown: bool,
    held: frozenset[str] = frozenset(),
) -> list[Fate]:
    """One unit's requests, in order, as `work.unit.run_unit` and `work.chain.run_chain` treat them
    (`held`: the failed requests a redo replaces by a new variant)."""
    fates: list[Fate] = []
    saved: int | None = None  # a chain's saved turns, read at its first turn to send
    blocked = False
    for req in unit.requests:
        key = req.idempotency_key
        state = states.get(key)
        if blocked:
            fates.append(Fate(req, "blocked", False))
            continue
        if key in held:
            fates.append(Fate(req, "redone", False))
            blocked = unit.is_chain
            continue
        decision = decide(state, retry_unknown=retry_unknown)
        if decision == "skip":
            fates.append(Fate(req, "rejected" if key in rejected else "done", False))
            continue
        if decision == "carry":
            assert state is not None and state.status in ("unknown", "no_image")
            fates.append(Fate(req, state.status, False))
            blocked = unit.is_chain
            continue
        if unit.is_chain:
            if saved is None:
                saved = len(saved_turns(store, unit))
            if saved < req.turn_index:
                fates.append(Fate(req, "no_history", False))
                blocked = True
                continue
            saved = req.turn_index + 1  # once it succeeds, it is saved for the next turn
        if state is not None:
            fates.append(Fate(req, "unknown" if state.status == "unknown" else "retry", True))
            continue
        if req.variant > 1:
            fates.append(Fate(req, "redo", True))
            continue
        previous = last_key.get(req.job_id, req.request_index, req.turn_index)
        if previous is not None and previous != key:
            fates.append(Fate(req, "changed", True, previous))
        else:
            fates.append(Fate(req, "new", True))
    return fates


# --- the report -------------------------------------------------------------------------------------


def print_forecast(
    result: Forecast,
    out: TextIO,
    *,
    keys: bool = False,
    prices: PriceTable | None = None,
) -> None:
    """The table of states (requests, how many are sent), the changed and rejected rows named, the most
    the run can cost (`prices`), and with `keys` every request with its state. One walk of the fates
    counts them all; the `keys` rows, printed last, wait in a temporary file meanwhile."""
    with tempfile.TemporaryFile("w+", encoding="utf-8", prefix="imagebatch-keys-") as listing:
        tally = _tally(result.fates(), listing if keys else None, Estimate(prices) if prices else None)
        _print_table(result, tally, out)
        if tally.estimate is not None:
            print("\nmost this run can cost (images at most x price):", file=out)
            for line in tally.estimate.lines():
                print(line, file=out)
        if keys:
            print(file=out)
            print(
                "job_id\trequest_index\tturn_index\troute\tmodel\tidempotency_key\tstate\tsent\tprevious_key",
                file=out,
            )
            listing.seek(0)
            shutil.copyfileobj(listing, out)


@dataclass
class _Tally:
    """What the report prints of the fates, counted in one walk: a count per state, of all and of those
    sent, the first `NAMED` changed and rejected fates, and the estimate of what is sent."""

    counts: Counter[State] = field(default_factory=Counter)
    sent: Counter[State] = field(default_factory=Counter)
    named: dict[State, list[Fate]] = field(default_factory=lambda: {"changed": [], "rejected": []})
    estimate: Estimate | None = None


def _tally(fates: Iterable[Fate], listing: TextIO | None, estimate: Estimate | None) -> _Tally:
    tally = _Tally(estimate=estimate)
    for f in fates:
        tally.counts[f.state] += 1
        if f.sends:
            tally.sent[f.state] += 1
            if estimate is not None:
                estimate.add(f.request)
        if (named := tally.named.get(f.state)) is not None and len(named) < NAMED:
            named.append(f)
        if listing is not None:
            r = f.request
            listing.write(
                f"{r.job_id}\t{r.request_index}\t{r.turn_index}\t{r.route.value}\t{r.model}\t"
                f"{r.idempotency_key}\t{f.state}\t{'yes' if f.sends else 'no'}\t{f.previous_key or ''}\n"
            )
    return tally


def _print_table(result: Forecast, tally: _Tally, out: TextIO) -> None:
    """The table of states, then the changed and rejected rows named."""
    counts, sent = tally.counts, tally.sent
    print(file=out)
    print(f"a run into {result.where} would now (read only: nothing sent, nothing written):", file=out)
    if result.in_use:
        print(f"  {result.in_use} is sending into it now: these counts are a snapshot", file=out)
    if not result.recorded:
        print("  it holds no run yet: every request is new", file=out)
    print(f"  {'state':<11}{'requests':>9}{'sent':>7}", file=out)
    for state, note in STATES.items():
        if counts[state]:
            print(f"  {state:<11}{counts[state]:>9,}{sent[state]:>7,}  {note}", file=out)
    total = sum(counts.values())
    print(f"  {'total':<11}{total:>9,}{sum(sent.values()):>7,}", file=out)
    if result.redo is not None:
        print(f"  {describe(result.redo.info())}", file=out)
    for state, named in tally.named.items():
        if named:
            rows = ", ".join(_row(f.request) for f in named)
            left = counts[state] - len(named)
            more = f" and {left:,} more (--keys lists them)" if left else ""
            print(f"  {state}: {rows}{more}", file=out)


def _row(req: PlannedRequest) -> str:
    """`line 7 (id=mug-blue)`, with the request and turn when the job has several."""
    job = req.job
    where = f"{job.location} (id={job.id})"
    if job.count > 1:
        where += f" request {req.request_index}"
    if job.turns:
        where += f" turn {req.turn_index}"
    return where
