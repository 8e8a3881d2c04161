"""What real clients send on the native route: google-genai writes `mime_type` (snake case) inside
`inlineData` and encodes bytes, signatures included, with URL-safe base64. The upstream reads both
spellings and both alphabets (proto3 JSON), so the emulator does too (issue 10, item 1)."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from helpers.emulator import assert_error, final_images, native_body, post
from helpers.images import png

from imagebatch.emulator import EmulatorServer
from imagebatch.emulator.signing import SIGNATURE_KEY
from imagebatch.gateway.constants import Route


def urlsafe(data: bytes, padded: bool) -> str:
    text = base64.urlsafe_b64encode(data).decode()
    return text if padded else text.rstrip("=")


def reencode(value: str, padded: bool = False) -> str:
    """A standard base64 string as google-genai would send it back: URL-safe, without padding."""
    return urlsafe(base64.b64decode(value), padded)


def edit(image: dict[str, Any], prompt: str = "make it blue") -> dict[str, Any]:
    body = native_body(prompt)
    body["contents"][0]["parts"].append({"inlineData": image})
    return body


# A picture whose standard base64 has '+' or '/' in it, so that the URL-safe form really differs.
REFERENCE = next(p for p in (png(40 + i, 40, (i * 37 % 256, 90, 200)) for i in range(64))
                 if set("+/") & set(base64.b64encode(p).decode()))  # fmt: skip


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_a_reference_image_in_snake_case_and_url_safe_base64_is_accepted(
    emulator: EmulatorServer, padded: bool
) -> None:
    image = {"mime_type": "image/png", "data": urlsafe(REFERENCE, padded)}
    response = post(emulator, Route.NATIVE, edit(image), key=f"snake-{padded}")
    assert response.status_code == 200, response.text
    assert final_images(response.json())


def test_both_spellings_that_agree_are_one_field(emulator: EmulatorServer) -> None:
    data = base64.b64encode(REFERENCE).decode()
    image = {"mimeType": "image/png", "mime_type": "image/png", "data": data}
    assert post(emulator, Route.NATIVE, edit(image), key="both-same").status_code == 200


def test_both_spellings_that_disagree_are_refused(emulator: EmulatorServer) -> None:
    image = {"mimeType": "image/jpeg", "mime_type": "image/png", "data": base64.b64encode(REFERENCE).decode()}
    body = assert_error(post(emulator, Route.NATIVE, edit(image), key="both-differ"), 400)
    assert "mimeType (image/jpeg) and mime_type (image/png)" in body["error"]["message"]


def test_mixed_alphabets_are_still_refused(emulator: EmulatorServer) -> None:
    text = base64.b64encode(REFERENCE).decode()
    mixed = text.replace("+", "-", 1) if "+" in text else text.replace("/", "_", 1)
    mixed = mixed.replace("A", "/", 1) if "/" not in mixed else mixed.replace("A", "+", 1)
    body = assert_error(post(emulator, Route.NATIVE, edit({"mimeType": "image/png", "data": mixed})), 400)
    assert "not valid base64" in body["error"]["message"]


def sdk_style(turn: dict[str, Any]) -> dict[str, Any]:
    """A model turn as google-genai sends it back: snake-case mime type, URL-safe unpadded bytes and
    signatures."""
    out = copy.deepcopy(turn)
    for part in out["parts"]:
        if "inlineData" in part:
            inline = part["inlineData"]
            part["inlineData"] = {"data": reencode(inline["data"]), "mime_type": inline["mimeType"]}
        if SIGNATURE_KEY in part:
            part[SIGNATURE_KEY] = reencode(part[SIGNATURE_KEY])
    return out


def test_a_two_turn_edit_sent_back_as_the_sdk_encodes_it_verifies(emulator: EmulatorServer) -> None:
    emulator.configure(max_images_policy="cap", thought_image_rate=1.0)
    first = post(emulator, Route.NATIVE, native_body("a paper boat"), key="sdk-1")
    turn = first.json()["candidates"][0]["content"]
    contents = [
        native_body("a paper boat")["contents"][0],
        sdk_style(turn),
        native_body("red")["contents"][0],
    ]
    response = post(emulator, Route.NATIVE, {"contents": contents}, key="sdk-2")
    assert response.status_code == 200, response.text


def test_an_altered_signature_still_fails_in_either_alphabet(emulator: EmulatorServer) -> None:
    first = post(emulator, Route.NATIVE, native_body("a paper boat"), key="alt-1")
    turn = sdk_style(first.json()["candidates"][0]["content"])
    part = next(p for p in turn["parts"] if SIGNATURE_KEY in p)
    raw = bytearray(base64.urlsafe_b64decode(part[SIGNATURE_KEY] + "=" * (-len(part[SIGNATURE_KEY]) % 4)))
    raw[-1] ^= 1
    part[SIGNATURE_KEY] = urlsafe(bytes(raw), padded=False)
    contents = [native_body("a paper boat")["contents"][0], turn, native_body("red")["contents"][0]]
    body = assert_error(post(emulator, Route.NATIVE, {"contents": contents}, key="alt-2"), 400)
    assert "thoughtSignature does not match" in body["error"]["message"]
