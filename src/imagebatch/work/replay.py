"""The replay: what the journal says of each idempotency key (`KeyState`), read event by event. A rerun
starts from it, so the output location, not Prefect's database, is the record of what has been done.

Kept apart from the writing side (`work.store`) so that the rules of reading back (a new attempt
supersedes an outcome, an answer whose files are all there is done) are read in one screen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import marshal
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebatch.work.request_record import RequestRecord, Status
from imagebatch.work.stateindex import Request, StateFile, StateIndex


@dataclass(slots=True)
class KeyState:
    """What the journal says about one idempotency key: its last outcome, or what happened since.

    Slotted, and its record's repeated words shared (`_shared`): the replay holds up to `WINDOW` of them
    in memory while it reads the journal (bench/README.md, "The record's end")."""

    outcome: RequestRecord | None = None
    """The last recorded outcome (None after a new attempt started)."""
    pending: bool = False
    """An attempt was started and never finished: it may have been generated and billed."""
    unanswered: bool = False
    """Since the last outcome, some attempt got no answer (it may have been generated and billed)."""
    answered_ok: bool = False
    """Since the last outcome, a success answer arrived."""
    answered: RequestRecord | None = None
    """The record planned for that answer, journaled before its files were written."""
    attempts: int = 0
    variant: int = 1
    """The variant the key is of, from its journal lines (1 when they name none)."""
    request: tuple[str, int, int] | None = None
    """(job_id, request_index, turn_index) of a variant >= 2, from its journal lines; None for variant 1
    (`work.variants` finds a request's variants by it)."""

    @property
    def status(self) -> Status | None:
        """The status a rerun starts from (None: never sent, or its files are gone)."""
        if self.outcome is not None:
            return self.outcome.status
        if self.pending or self.unanswered or self.answered_ok:
            return "unknown"
        return "failed" if self.attempts else None


WINDOW = 20_000
"""Keys whose states stay in memory while the journal is read: past that many, the least recently named
go to disk (`StateFile`), and the whole index is on disk once read. An attempt's lines are close together
in the journal, so a key is rarely named again once out of the window (it is read back when it is)."""


def replay(
    events: Iterable[dict[str, Any]],
    files_exist: Callable[[RequestRecord, bool], bool],
    seen: Callable[[dict[str, Any]], None] | None = None,
    spool: Path | None = None,
) -> StateIndex[KeyState]:
    """The state of every idempotency key `events` (the journal's lines, in order) name.

    A success whose files are all there counts as succeeded even if the process died before its outcome
    was journaled (the `answered` event names the files first); a succeeded outcome whose files are gone
    counts as never done, so a rerun makes them again. `files_exist(record, settled)` looks the files up;
    `seen` is given every event that names a key, in order (`validate --out` notes each request's last
    key). Past `WINDOW` keys the states are kept in a file in `spool` (`work.stateindex`)."""
    window = WINDOW
    held: dict[str, KeyState] = {}
    file: StateFile[KeyState] | None = None
    newest: dict[Request, int] = {}
    for ev in events:
        key = ev.get("idempotency_key")
        if not isinstance(key, str) or ev.get("event") == "usage":
            continue
        if seen is not None:
            seen(ev)
        st = held.pop(key, None)
        if st is None:
            st = (file.get(key) if file is not None else None) or KeyState()
        held[key] = st  # the most recently named last: the window lets go of the oldest first
        _apply(st, ev)
        if st.request is not None:
            newest[st.request] = max(newest.get(st.request, 1), st.variant)
        if len(held) > window:
            file = file or StateFile(spool, _encode, _decode)
            file.put(_oldest(held, max(1, window // 2)))

    def settle(st: KeyState) -> bool:
        return _settle(st, files_exist)

    if file is None:
        for st in held.values():
            settle(st)
        return StateIndex(held, None, newest)
    file.put(_oldest(held, len(held)))
    file.rewrite(settle)
    return StateIndex(None, file, newest)


def _oldest(held: dict[str, KeyState], n: int) -> list[tuple[str, KeyState]]:
    """Take the `n` least recently named keys out of `held`."""
    gone = [(key, held[key]) for key in itertools.islice(held, n)]
    for key, _ in gone:
        del held[key]
    return gone


def _settle(st: KeyState, files_exist: Callable[[RequestRecord, bool], bool]) -> bool:
    """Settle what the files say of a key once its lines are all read (True if its state changed): an
    answer whose files are all there is done; a success whose files are gone is to be made again."""
    if st.outcome is None and st.answered is not None and not st.pending:
        if files_exist(st.answered, False):
            st.outcome = st.answered
            return True
    elif st.outcome is not None and st.outcome.status == "succeeded" and not files_exist(st.outcome, True):
        st.outcome = None
        st.attempts = 0  # its files were removed: make it again
        return True
    return False


def _apply(st: KeyState, ev: dict[str, Any]) -> None:
    """One journal event, applied to its key's state."""
    if st.request is None and isinstance(variant := ev.get("variant"), int) and variant > 1:
        st.variant = variant
        with contextlib.suppress(KeyError, TypeError, ValueError):
            st.request = (str(ev["job_id"]), int(ev["request_index"]), int(ev["turn_index"]))
    kind = ev.get("event")
    if kind == "attempt_started":
        if st.outcome is not None:  # a new send supersedes the last outcome
            st.outcome, st.unanswered, st.answered_ok, st.answered = None, False, False, None
        st.pending = True
        st.attempts += 1
    elif kind == "attempt_finished":
        st.pending = False
        st.unanswered |= ev.get("outcome") == "no_answer"
        st.answered_ok |= ev.get("outcome") == "ok"
    elif kind in ("answered", "outcome"):
        try:
            record = _shared(RequestRecord.from_json(ev))
        except (TypeError, ValueError):
            return  # a damaged record: the key stays in doubt rather than wrongly settled
        if kind == "answered":
            st.answered = record
        else:
            st.outcome, st.pending, st.unanswered, st.answered_ok, st.answered = (
                record, False, False, False, None,
            )  # fmt: skip


_FIELDS = tuple(f.name for f in dataclasses.fields(RequestRecord))


def _encode(st: KeyState) -> bytes:
    """A state as bytes for the index's file (`marshal`: a third of a pickle's size, twice as fast; the
    file is read back only by the process that wrote it, so the format need not outlive it)."""
    return marshal.dumps((_fields(st.outcome), st.pending, st.unanswered, st.answered_ok,
                          _fields(st.answered), st.attempts, st.variant, st.request))  # fmt: skip


def _fields(record: RequestRecord | None) -> tuple[Any, ...] | None:
    return None if record is None else tuple(getattr(record, name) for name in _FIELDS)


def _decode(data: bytes) -> KeyState:
    outcome, pending, unanswered, answered_ok, answered, attempts, variant, request = marshal.loads(data)
    return KeyState(
        None if outcome is None else _shared(RequestRecord(*outcome)),
        pending, unanswered, answered_ok,
        None if answered is None else _shared(RequestRecord(*answered)),
        attempts, variant, request,
    )  # fmt: skip


def _shared(record: RequestRecord) -> RequestRecord:
    """`record` with the words every record repeats (status, model, route, MIME type, finish reason) as
    one shared string each: a decoded line gives each record its own copies, about 300 bytes a key."""
    record.status = sys.intern(record.status)  # type: ignore[assignment]
    record.model, record.route = sys.intern(record.model), sys.intern(record.route)
    if record.mime_type is not None:
        record.mime_type = sys.intern(record.mime_type)
    if record.finish_reason is not None:
        record.finish_reason = sys.intern(record.finish_reason)
    return record
