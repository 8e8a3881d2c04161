"""`thoughtSignature`: issued on the parts of each model turn, verified when a request sends the turn back.

A signature is an HMAC over the whole turn (every part, in order, without signatures) and the position of
the signed part. Verification needs no stored state, and it catches an altered part anywhere in the turn,
reordered or dropped parts, a signature moved to another part, and a turn rebuilt from its image alone.

Signatures are issued on the first non-thought part of a turn and on every non-thought image part (as the
real service does), so every model turn the emulator sends carries at least one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

SIGNATURE_KEY = "thoughtSignature"
_VERSION = b"\x01"


def _without_nulls(value: Any) -> Any:
    """A JSON value with null-valued keys removed: `{"text": null}` carries the same content as `{}`,
    as in the service's own (protobuf) reading, so a client that serialises absent fields as null is
    not mistaken for one that altered the turn."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _signed_positions(parts: list[dict[str, Any]]) -> set[int]:
    positions = {i for i, p in enumerate(parts) if not p.get("thought") and p.get("inlineData") is not None}
    first = next((i for i, p in enumerate(parts) if not p.get("thought")), None)
    if first is not None:
        positions.add(first)
    return positions


def _turn_digest(parts: list[dict[str, Any]]) -> bytes:
    unsigned = [_without_nulls({k: v for k, v in p.items() if k != SIGNATURE_KEY}) for p in parts]
    canonical = json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).digest()


class Signer:
    """Signs model turns and checks them when they come back."""

    def __init__(self, secret: bytes) -> None:
        self._key = hashlib.sha256(b"imagebatch-emulator-thought-signature\x00" + secret).digest()

    @classmethod
    def for_seed(cls, seed: int, secret: str | None = None) -> Signer:
        return cls(secret.encode() if secret is not None else f"seed:{seed}".encode())

    def _signature(self, turn: bytes, position: int) -> str:
        mac = hmac.new(self._key, turn + position.to_bytes(4, "big"), hashlib.sha256).digest()
        return base64.b64encode(_VERSION + mac).decode()

    def sign(self, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Return `parts` with a signature on the first non-thought part and on every final image."""
        turn = _turn_digest(parts)
        signed = _signed_positions(parts)
        return [
            {**p, SIGNATURE_KEY: self._signature(turn, i)} if i in signed else p for i, p in enumerate(parts)
        ]

    def verify(self, parts: list[dict[str, Any]], where: str) -> str | None:
        """Check a model turn sent back by a client; return the problem, or None if it is intact.

        `where` names the turn in messages, e.g. `contents[1]`.
        """
        if not any(p.get(SIGNATURE_KEY) is not None for p in parts):
            return (
                f"{where} is a model turn without any thoughtSignature: send earlier model turns back "
                "complete and unaltered, as the service returned them; do not rebuild them from the image"
            )
        turn = _turn_digest(parts)
        expected = _signed_positions(parts)
        for i, part in enumerate(parts):
            given = part.get(SIGNATURE_KEY)
            if i in expected and given is None:
                return f"{where}.parts[{i}] lacks the thoughtSignature the service issued on it"
            if i not in expected and given is not None:
                return f"{where}.parts[{i}] carries a thoughtSignature the service never issued there"
            if given is not None and not (
                isinstance(given, str)
                and hmac.compare_digest(given.encode(), self._signature(turn, i).encode())
            ):
                return (
                    f"{where}.parts[{i}].thoughtSignature does not match: the model turn was altered or "
                    "reordered, or the signature was changed"
                )
        return None
