"""`thoughtSignature`: issued on the parts of each model turn, verified when a request sends the turn back.

A signature is an HMAC over three things:

- the conversation the turn answered: a digest of the model in the path and of every item of `contents` of
  the request that produced the turn (signatures stripped, null-valued keys removed, a missing `role` read
  as `user`, canonical JSON);
- the whole turn (every part, in order, without signatures);
- the position of the signed part.

Verification needs no stored state: a turn at `contents[i]` is checked against the digest of the
`contents[:i]` actually sent and the model of the current path. So it catches an altered part anywhere in
the turn, reordered or dropped parts, a signature moved to another part, a turn rebuilt from its image
alone, and also a turn that does not belong where it is sent: pasted from another conversation, produced
by another model, swapped with another model turn, sent twice, or sent after an altered, reordered or
shortened history (e.g. the first user turn dropped).

Signatures are issued on the first non-thought part of a turn and on every non-thought image part (as the
real service does), so every model turn the emulator sends carries at least one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Sequence
from typing import Any

from .bodies import b64decode_any, standard_base64

SIGNATURE_KEY = "thoughtSignature"
_VERSION = b"\x02"
"""Version 2 also covers the conversation; version 1 (the turn alone) is refused."""
_VERSION_TURN_ONLY = b"\x01"


def _without_nulls(value: Any) -> Any:
    """A JSON value with null-valued keys removed: `{"text": null}` carries the same content as `{}`,
    as in the service's own (protobuf) reading, so a client that serialises absent fields as null is
    not mistaken for one that altered the turn."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _unsigned(parts: Sequence[Any]) -> list[Any]:
    return [_canonical_part(p) if isinstance(p, dict) else p for p in parts]


def _canonical_part(part: dict[str, Any]) -> Any:
    """A part without its signature, in one spelling: `mime_type` read as `mimeType` and image data in
    standard padded base64, so a client that re-encodes a turn (URL-safe base64, snake case, as
    google-genai does) sends back the same turn."""
    item = _without_nulls({k: v for k, v in part.items() if k != SIGNATURE_KEY})
    inline = item.get("inlineData")
    if isinstance(inline, dict):
        inline = dict(inline)
        if "mime_type" in inline:
            inline.setdefault("mimeType", inline.pop("mime_type"))
        if isinstance(inline.get("data"), str):
            inline["data"] = standard_base64(inline["data"])
        item["inlineData"] = inline
    return item


def _signed_positions(parts: list[dict[str, Any]]) -> set[int]:
    positions = {i for i, p in enumerate(parts) if not p.get("thought") and p.get("inlineData") is not None}
    first = next((i for i, p in enumerate(parts) if not p.get("thought")), None)
    if first is not None:
        positions.add(first)
    return positions


def _turn_digest(parts: list[dict[str, Any]]) -> bytes:
    return hashlib.sha256(_canonical(_unsigned(parts))).digest()


def _content_digest(content: dict[str, Any]) -> bytes:
    item = _without_nulls({k: v for k, v in content.items() if k != "parts"})
    item.setdefault("role", "user")  # the spec's default: an absent role is a user turn
    item["parts"] = _unsigned(content.get("parts") or [])
    return hashlib.sha256(_canonical(item)).digest()


def history_digests(contents: Sequence[dict[str, Any]], model: str) -> list[bytes]:
    """The conversation digest before each item of `contents` and after the last one (`len + 1` items).

    Item `i` covers `model` and `contents[:i]`; it is what a model turn sent at `contents[i]` was signed
    with, and item `len(contents)` is what the answer to this request is signed with. Each step hashes
    the previous digest with one content's digest, so the whole list costs one pass over the contents.
    """
    digest = hashlib.sha256(b"imagebatch-emulator-conversation\x00" + model.encode()).digest()
    digests = [digest]
    for content in contents:
        digest = hashlib.sha256(digest + _content_digest(content)).digest()
        digests.append(digest)
    return digests


def _decoded(signature: str) -> bytes | None:
    try:
        return b64decode_any(signature)
    except (binascii.Error, ValueError):
        return None


def _version_of(signature: str) -> bytes | None:
    decoded = _decoded(signature)
    return None if decoded is None else decoded[:1]


class Signer:
    """Signs model turns and checks them when they come back."""

    def __init__(self, secret: bytes) -> None:
        self._key = hashlib.sha256(b"imagebatch-emulator-thought-signature\x00" + secret).digest()

    @classmethod
    def for_seed(cls, seed: int, secret: str | None = None) -> Signer:
        return cls(secret.encode() if secret is not None else f"seed:{seed}".encode())

    def _signature(self, context: bytes, turn: bytes, position: int) -> str:
        message = context + turn + position.to_bytes(4, "big")
        mac = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.b64encode(_VERSION + mac).decode()

    def sign(self, parts: list[dict[str, Any]], context: bytes) -> list[dict[str, Any]]:
        """Return `parts` with a signature on the first non-thought part and on every final image.

        `context` is the conversation digest of the request being answered (the last item of
        `history_digests(request contents, model)`).
        """
        turn = _turn_digest(parts)
        signed = _signed_positions(parts)
        return [
            {**p, SIGNATURE_KEY: self._signature(context, turn, i)} if i in signed else p
            for i, p in enumerate(parts)
        ]

    def verify(self, parts: list[dict[str, Any]], where: str, context: bytes) -> str | None:
        """Check a model turn sent back by a client; return the problem, or None if it is intact.

        `where` names the turn in messages, e.g. `contents[1]`; `context` is the conversation digest of
        everything sent before it (`history_digests(contents, model)[i]`).
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
            if given is None:
                continue
            # Compared by decoded bytes: a signature re-encoded in the other alphabet is the same signature.
            given_bytes = _decoded(given) if isinstance(given, str) else None
            expected_bytes = base64.b64decode(self._signature(context, turn, i))
            if given_bytes is not None and hmac.compare_digest(given_bytes, expected_bytes):
                continue
            if isinstance(given, str) and _version_of(given) == _VERSION_TURN_ONLY:
                return (
                    f"{where}.parts[{i}].thoughtSignature does not match: it was issued by an older "
                    "emulator whose signatures did not cover the conversation; make the chain again"
                )
            return (
                f"{where}.parts[{i}].thoughtSignature does not match: the model turn was altered or "
                "reordered or the signature was changed, or the turn does not answer the contents sent "
                "before it with this model (history altered, reordered or shortened, or the turn taken "
                "from another conversation or another model)"
            )
        return None
