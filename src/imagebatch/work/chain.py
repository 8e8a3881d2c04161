"""Edit chains: the turns of one request in order, each sent with every earlier turn exactly as sent and
as returned (same parts, same order, unaltered `thoughtSignature`), the history saved under `chains/`.

A chain stops at the first turn that did not succeed, and a done turn is never sent again to rebuild lost
history: a turn whose earlier turns are missing from `chains/` fails and says `--force` remakes it all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from imagebatch.gateway import ImageResult
from imagebatch.manifest import PlannedRequest
from imagebatch.work import records
from imagebatch.work.build import InputChangedError, build_request
from imagebatch.work.context import RunContext, Unit
from imagebatch.work.keeping import Keeping, as_they_come
from imagebatch.work.records import Result
from imagebatch.work.send import send_and_record
from imagebatch.work.store import OutputStore, RequestRecord


def run_chain(ctx: RunContext, unit: Unit, keep: Keeping = as_they_come) -> list[RequestRecord]:
    """Send the turns of `unit` in order, one record per turn kept by `keep` as each settles."""
    first = unit.requests[0]
    blocked: str | None = None
    with keep(ctx, unit) as out:
        history = saved_history(ctx, unit)
        for req in unit.requests:
            if blocked:
                out.append(records.not_attempted(req, blocked))
                continue
            decision = ctx.decision(req.idempotency_key)
            if decision != "send":
                out.append(records.carried(req, ctx.states.get(req.idempotency_key)))
                if decision == "carry":
                    blocked = f"turn {req.turn_index} of this chain is {out[-1].status}"
                continue
            if ctx.state.halt.is_set():
                out.append(records.not_attempted(req, ctx.state.halt_reason or "the run was stopped"))
                blocked = out[-1].error
                continue
            if len(history) < req.turn_index:
                path = ctx.store.chain_name(first.job_id, first.request_index)
                why = (
                    f"{path} lacks the earlier turns this turn must send back; "
                    "rerun with --force to make the whole chain again (each turn is billed)"
                )
                out.append(records.record(req, "failed", error=why))
                blocked = f"turn {req.turn_index} could not be sent"
                continue
            earlier = [c for turn in history[: req.turn_index] for c in turn["contents"]]
            try:
                request = build_request(req, earlier)
            except InputChangedError as exc:
                out.append(records.record(req, "failed", error=str(exc)))
                blocked = f"turn {req.turn_index} could not be sent"
                continue
            sent_turn = request.json["contents"][-1] if request.json else {}
            saving = _history_keeper(ctx, first, history, req, sent_turn)
            done, _ = send_and_record(ctx, req, request, chain=True, on_answer=saving)
            if done.status != "succeeded":
                blocked = f"turn {req.turn_index} of this chain is {done.status}"
            out.append(done)
    return out


def _history_keeper(
    ctx: RunContext,
    first: PlannedRequest,
    history: list[dict[str, Any]],
    req: PlannedRequest,
    sent_turn: dict[str, Any],
) -> Callable[[Result, RequestRecord], None]:
    """What a turn's answer adds to the chain's history, saved before the turn's files: a turn that counts
    as done on disk is always in the history."""

    def keep_history(result: Result, _record: RequestRecord) -> None:
        model_content = getattr(result, "model_content", None)
        if isinstance(result, ImageResult) and model_content is not None:
            del history[req.turn_index :]
            history.append({"key": req.idempotency_key, "contents": [sent_turn, model_content]})
            saved = {"job_id": first.job_id, "turns": history}
            ctx.store.save_chain(first.job_id, first.request_index, saved)

    return keep_history


def saved_history(ctx: RunContext, unit: Unit) -> list[dict[str, Any]]:
    """The saved turns of a chain, as far as their keys still match the plan (and none when forcing)."""
    return [] if ctx.force else saved_turns(ctx.store, unit)


def saved_turns(store: OutputStore, unit: Unit) -> list[dict[str, Any]]:
    """The turns of a chain saved under `chains/`, as far as their keys still match the plan."""
    first = unit.requests[0]
    saved = store.load_chain(first.job_id, first.request_index) or {}
    turns: list[dict[str, Any]] = []
    for turn, req in zip(saved.get("turns", []), unit.requests, strict=False):
        if turn.get("key") != req.idempotency_key:
            break
        turns.append(turn)
    return turns
