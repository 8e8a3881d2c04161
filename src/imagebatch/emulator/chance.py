"""Deterministic "randomness": every choice is a hash of the seed and what it is about.

No global RNG is used, so the outcome of a request never depends on which requests came before it or
ran beside it; only on (seed, Idempotency-Key, attempt number, ...).
"""

from __future__ import annotations

import hashlib

from imagebatch.gateway.constants import Route

from .settings import FAULT_OUTCOMES, FaultConfig


def digest(*parts: object) -> bytes:
    """SHA-256 of the parts, separated so that ("ab", "c") and ("a", "bc") differ."""
    h = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.digest()


def unit(*parts: object) -> float:
    """A number in [0, 1) fixed by the parts."""
    return int.from_bytes(digest(*parts)[:8], "big") / 2**64


def choose_fault(
    faults: FaultConfig, *, seed: int, route: Route, key: str, prompt: str, attempt: int
) -> str | None:
    """The fault outcome of this attempt, or None for a normal answer. Scripts win over rates."""
    for script in faults.scripts:
        if script.applies(route, key, prompt) and attempt <= len(script.outcomes):
            outcome = script.outcomes[attempt - 1]
            return None if outcome == "ok" else outcome
    if not faults.rates:
        return None
    u = unit(seed, "fault", key, attempt)
    cumulative = 0.0
    for fault in FAULT_OUTCOMES:  # a fixed order, so the same u always maps to the same outcome
        cumulative += faults.rates.get(fault, 0.0)  # type: ignore[call-overload]  # str, not the Literal
        if u < cumulative:
            return fault
    return None
