"""Variants: the new samples `imagebatch run --redo KINDS` makes of the requests a reviewer rejected, or
the service answered without an image, or that failed; and every variant of a request in a run's plan,
newest first.

A request's first sample is variant 1 (the plan's own request, its key unchanged); `--redo` takes a set
of kinds (`REDO_KINDS`, comma separated: `--redo rejected,no_image`) and adds variant n + 1 to each
request whose newest variant n is of one of them (`redo_kind`), and nothing else:
- `rejected`: its decision in force is `rejected` (`work.decisions`);
- `no_image`: the service answered without an image (a rerun otherwise carries it as it stands);
- `failed`: its request failed; the failed variant itself is then not sent again (it is `held`), the
  new one is sent in its place.
Variant n + 1 has a key of its own (`manifest.plan.variant_of`), so the next run finds it in the
journal: its newest variant is then n + 1, and nothing is sent again (until it is of a kind asked for).

Choices the issue leaves open:
- **Which variants a run lists**: every variant the journal knows for the plan's requests (a variant
  that was planned but never sent, say past `--max-images`, is not in the journal: it is planned again by
  the next `--redo rejected` run, with the same key). They go before the request's first sample in
  results.csv and the report, newest first.
- **Only a `--redo` run sends a variant**: any other run carries the variants as they stand (`held`:
  a failed one stays failed), so a nightly run never makes a new sample nobody asked for. In a `--redo`
  run every resume rule applies to them as to first samples: a failed variant is sent again, an
  `unknown` one only with `--retry-unknown`.
- **How a variant is made** is decided by the run that sends it (it is not in the key): a new sample
  (the same request again), or under `--edit` an edit turn on the rejected answer with the reviewer's
  note as the instruction, sent after the answer's whole conversation (`work.conversation`). A row
  that cannot be edited (no note, not the native route, no kept conversation or one whose files
  changed) is made as a new sample, and counted (`RedoSummary.fallback`, printed by the run).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from imagebatch.gateway.constants import Route
from imagebatch.manifest import EditOf, PlannedRequest, variant_of
from imagebatch.words import counted
from imagebatch.work import conversation
from imagebatch.work.context import Unit, decide
from imagebatch.work.decisions import Decision, decided
from imagebatch.work.redo import RedoKind
from imagebatch.work.stateindex import StateIndex
from imagebatch.work.store import KeyState, OutputStore

NO_NOTE = "no note"
NOT_NATIVE = "not the native route"
NO_HISTORY = "no kept history"
NO_IMAGE_TO_EDIT = "no image to edit"


def redo_kind(
    req: PlannedRequest, states: Mapping[str, KeyState], decisions: Mapping[str, Decision]
) -> RedoKind | None:
    """The kind of redo `req` (a request's newest variant) is, or None: rejected by its reviewer, or its
    request answered without an image, or failed."""
    decision = decisions.get(req.idempotency_key)
    if decision is not None and decision.decision == "rejected":
        return "rejected"
    state = states.get(req.idempotency_key)
    status = state.status if state is not None else None
    return status if status in ("no_image", "failed") else None


@dataclass
class RedoSummary:
    """What a `--redo rejected` run is to send."""

    variants: int = 0
    """Variants to send: the new ones, and earlier ones not done yet."""
    edits: int = 0
    """Of those, made as an edit of the rejected answer (`--edit`)."""
    fallback: Counter[str] = field(default_factory=Counter)
    """`--edit` asked, but made as new samples, by reason."""
    kinds: Counter[str] = field(default_factory=Counter)
    """The variants to send by the kind of the variant each redoes (`REDO_KINDS`)."""

    def info(self) -> dict[str, Any]:
        """As run.json records it (`redo`)."""
        return {
            "variants": self.variants,
            "kinds": dict(self.kinds),
            "edits": self.edits,
            "new_samples": self.variants - self.edits,
            "fallback": self.fallback.total(),
            "fallback_reasons": dict(self.fallback),
        }


def describe(redo: Mapping[str, Any]) -> str:
    """What a `--redo` run was to send (run.json's `redo`, `RedoSummary.info`), in one line."""
    line = f"redo: {counted(redo['variants'], 'variant')} to send"
    if kinds := redo.get("kinds"):
        line += " (" + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) + ")"
    if redo["edits"]:
        line += f", {redo['edits']} as edits with the reviewer's note"
    if redo["fallback"]:
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(redo["fallback_reasons"].items()))
        line += f"; {redo['fallback']} made as new samples instead of edits ({why})"
    return line


class Variants:
    """Every variant of a plan's requests, added to its units as they come (one unit each, newest first,
    before the request's own unit), the new ones a `redo` (the kinds a `--redo` run asks for; empty: not a
    redo run) adds included, from the folder's state `states` as the run found it.

    Each pass (`units`) makes the same units, and at its end leaves what it found: `held`, the keys the
    run must not send (every variant, when not redoing; a failed variant a new one replaces, when redoing
    `failed`), and `summary`, what a redo run is to send (None outside one). Costs nothing when the
    journal knows no variant and the run redoes nothing."""

    def __init__(
        self,
        states: Mapping[str, KeyState],
        store: OutputStore,
        *,
        redo: Collection[str] = frozenset(),
        edit: bool = False,
        retry_unknown: bool = False,
    ) -> None:
        self.states, self.store, self.redo = states, store, redo
        self.edit, self.retry_unknown = edit, retry_unknown
        self.newest = _newest(states)
        self.decisions = decided(store.backend) if redo else {}
        self.held: frozenset[str] = frozenset()
        self.summary: RedoSummary | None = None
        self._holding: set[str] = set()

    def units(self, units: Iterable[Unit]) -> Iterator[Unit]:
        """`units` with their variants, numbered in order from 0 (the same on every pass)."""
        if not self.newest and not self.redo:
            yield from units
            return
        held: set[str] = set()
        self._holding = held
        summary = RedoSummary() if self.redo else None
        index = 0
        for unit in units:
            for req in unit.requests:
                top = self.newest.get((req.job_id, req.request_index, req.turn_index), 1)
                chain = _existing(req, self.states, top)
                if summary is None:
                    held.update(v.idempotency_key for v in chain[1:])
                else:
                    held |= _redo_chain(
                        chain, self.states, self.decisions, self.store, self.redo, self.edit,
                        self.retry_unknown, summary,
                    )  # fmt: skip
                for variant in reversed(chain[1:]):
                    yield Unit(index, req.job, [variant])
                    index += 1
            unit.index = index
            index += 1
            yield unit
        self.held, self.summary = frozenset(held), summary

    def holds(self, key: str) -> bool:
        """Whether `key` is one the run must not send (`held`), as far as the pass under way has come: right
        for every unit it has yielded, since a request's variants are weighed before its units come."""
        return key in self._holding


def with_variants(
    units: Iterable[Unit],
    states: Mapping[str, KeyState],
    store: OutputStore,
    *,
    redo: Collection[str] = frozenset(),
    edit: bool = False,
    retry_unknown: bool = False,
) -> tuple[list[Unit], frozenset[str], RedoSummary | None]:
    """The run's units with every variant of their requests, all at once (`Variants`, for a caller that
    looks at the whole plan: `validate --out`); the keys the run must not send; and, when redoing, what
    it is to send."""
    variants = Variants(states, store, redo=redo, edit=edit, retry_unknown=retry_unknown)
    out = list(variants.units(units))
    return out, variants.held, variants.summary


def _redo_chain(
    chain: list[PlannedRequest],
    states: Mapping[str, KeyState],
    decisions: Mapping[str, Decision],
    store: OutputStore,
    kinds: Collection[str],
    edit: bool,
    retry_unknown: bool,
    summary: RedoSummary,
) -> set[str]:
    """One request's variants in a redo run: the new variant its newest one's kind asks for appended to
    `chain`, and each variant to send made as this run makes it (`_made`, counted); the keys not to send
    (a failed newest variant, which the new one replaces)."""
    held: set[str] = set()
    if (kind := redo_kind(chain[-1], states, decisions)) in kinds:
        if kind == "failed":
            held.add(chain[-1].idempotency_key)
        chain.append(variant_of(chain[0], chain[-1].variant + 1))
    for n in range(1, len(chain)):
        key = chain[n].idempotency_key
        if key not in held and decide(states.get(key), retry_unknown=retry_unknown) == "send":
            base_kind = redo_kind(chain[n - 1], states, decisions) or "earlier"
            chain[n] = _made(chain[n], chain[n - 1], decisions, store, edit, summary, base_kind)
    return held


def _newest(states: Mapping[str, KeyState]) -> Mapping[tuple[str, int, int], int]:
    """The newest variant the journal knows of each request (job, request, turn) it holds a variant of: the
    replay's own count (`StateIndex.newest`, no walk of the states), or for a plain mapping its states'."""
    if isinstance(states, StateIndex):
        return states.newest
    newest: dict[tuple[str, int, int], int] = {}
    for st in states.values():
        if st.request is not None:
            newest[st.request] = max(newest.get(st.request, 1), st.variant)
    return newest


def rejected_requests(units: Iterable[Unit], states: Mapping[str, KeyState], store: OutputStore) -> set[str]:
    """The planned keys (first samples) of the requests whose newest variant the journal knows has
    `rejected` as its decision in force: those `--redo rejected` makes a new variant of (`validate --out`
    counts them by this same rule)."""
    decisions = decided(store.backend)
    if not any(d.decision == "rejected" for d in decisions.values()):
        return set()
    newest = _newest(states)
    rejected: set[str] = set()
    for unit in units:
        for req in unit.requests:
            chain = _existing(req, states, newest.get((req.job_id, req.request_index, req.turn_index), 1))
            last = decisions.get(chain[-1].idempotency_key)
            if last is not None and last.decision == "rejected":
                rejected.add(req.idempotency_key)
    return rejected


def _existing(req: PlannedRequest, states: Mapping[str, KeyState], top: int) -> list[PlannedRequest]:
    """`req` and its variants 2..top the journal knows, oldest first (stopping at the first it does not:
    variant n + 1 is only ever made once n is there)."""
    chain = [req]
    for n in range(2, top + 1):
        variant = variant_of(req, n)
        if variant.idempotency_key not in states:
            break
        chain.append(variant)
    return chain


def _made(
    variant: PlannedRequest,
    base: PlannedRequest,
    decisions: Mapping[str, Decision],
    store: OutputStore,
    edit: bool,
    summary: RedoSummary,
    kind: str,
) -> PlannedRequest:
    """`variant` as this run makes it: an edit of `base`'s answer (`--edit`, where it can be: a rejected
    image), else a new sample; counted in `summary`, by `kind` (what `base` was)."""
    summary.variants += 1
    summary.kinds[kind] += 1
    if not edit:
        return variant
    decision = decisions.get(base.idempotency_key)
    note = decision.note.strip() if decision is not None and decision.decision == "rejected" else ""
    why = None if note else (NO_NOTE if kind == "rejected" else NO_IMAGE_TO_EDIT)
    if why is None and base.route is not Route.NATIVE:
        why = NOT_NATIVE
    if why is None:
        try:
            conversation.kept(store, base).check(store, base)
        except conversation.HistoryError:
            why = NO_HISTORY
    if why is not None:
        summary.fallback[why] += 1
        return variant
    summary.edits += 1
    return variant_of(variant, variant.variant, EditOf(base, note))
