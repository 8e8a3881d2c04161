"""Signed edit history: model turns must come back complete and unaltered, or the request gets a 400."""

from __future__ import annotations

import base64
import copy
import io
from typing import Any

import httpx
import pytest
from helpers.emulator import assert_error, emulator_settings, final_images, native_body, open_image, post

from imagebatch.emulator import EmulatorServer
from imagebatch.emulator.signing import SIGNATURE_KEY, Signer, history_digests
from imagebatch.gateway.constants import Route


def model_turn(
    server: EmulatorServer, prompt: str = "a paper boat", key: str = "turn-1", cap: int = 2
) -> dict[str, Any]:
    """A model turn exactly as the emulator returned it (with a thought image and two final images)."""
    response = post(
        server, Route.NATIVE, native_body(prompt), key=key, headers={"X-Service-Max-Images": str(cap)}
    )
    assert response.status_code == 200
    return response.json()["candidates"][0]["content"]


def history(*turns: dict[str, Any], prompt: str = "now make it red") -> dict[str, Any]:
    contents = [
        native_body("a paper boat")["contents"][0],
        *turns,
        {"role": "user", "parts": [{"text": prompt}]},
    ]
    return {"contents": contents}


@pytest.fixture
def turn(emulator: EmulatorServer) -> dict[str, Any]:
    emulator.configure(max_images_policy="cap", thought_image_rate=1.0)
    return model_turn(emulator)


def signed_indexes(turn: dict[str, Any]) -> list[int]:
    return [i for i, p in enumerate(turn["parts"]) if SIGNATURE_KEY in p]


def test_valid_round_trip(emulator: EmulatorServer, turn: dict[str, Any]) -> None:
    response = post(emulator, Route.NATIVE, history(turn), key="turn-2")
    assert response.status_code == 200, response.text
    second = response.json()["candidates"][0]["content"]
    # contents: user, model, user, model, user -- the middle user turn is the one `second` answered
    third = post(emulator, Route.NATIVE, history(turn, user_turn("now make it red"), second, prompt="red"))
    # every turn is a billed generation
    assert third.status_code == 200, third.text
    assert [e["idempotency_key"] for e in emulator.ledger()] == ["turn-1", "turn-2", None]


def test_signatures_sit_on_the_first_answer_part_and_every_final_image(turn: dict[str, Any]) -> None:
    parts = turn["parts"]
    first_answer = next(i for i, p in enumerate(parts) if not p.get("thought"))
    images = [i for i, p in enumerate(parts) if "inlineData" in p and not p.get("thought")]
    assert signed_indexes(turn) == sorted({first_answer, *images})
    assert all(SIGNATURE_KEY not in p for p in parts if p.get("thought"))


def _reencode(part: dict[str, Any]) -> None:
    image = open_image(base64.b64decode(part["inlineData"]["data"]))
    out = io.BytesIO()
    image.convert("RGB").save(out, "PNG", compress_level=9)
    part["inlineData"] = {"mimeType": "image/png", "data": base64.b64encode(out.getvalue()).decode()}


def _final_image_index(turn: dict[str, Any]) -> int:
    return next(i for i, p in enumerate(turn["parts"]) if "inlineData" in p and not p.get("thought"))


def tamper_image(turn: dict[str, Any]) -> None:
    _reencode(turn["parts"][_final_image_index(turn)])


def tamper_text(turn: dict[str, Any]) -> None:
    part = next(p for p in turn["parts"] if "text" in p and not p.get("thought"))
    part["text"] += " (edited)"


def tamper_thought(turn: dict[str, Any]) -> None:
    turn["parts"][0]["text"] = "a different plan"


def change_signature(turn: dict[str, Any]) -> None:
    part = turn["parts"][_final_image_index(turn)]
    sig = part[SIGNATURE_KEY]
    part[SIGNATURE_KEY] = sig[:10] + ("A" if sig[10] != "A" else "B") + sig[11:]


def drop_one_signature(turn: dict[str, Any]) -> None:
    del turn["parts"][_final_image_index(turn)][SIGNATURE_KEY]


def drop_all_signatures(turn: dict[str, Any]) -> None:
    for part in turn["parts"]:
        part.pop(SIGNATURE_KEY, None)


def rebuild_from_image(turn: dict[str, Any]) -> None:
    image = turn["parts"][_final_image_index(turn)]
    turn["parts"] = [{"inlineData": image["inlineData"]}]


def rebuild_keeping_signature(turn: dict[str, Any]) -> None:
    turn["parts"] = [turn["parts"][_final_image_index(turn)]]


def drop_thought_parts(turn: dict[str, Any]) -> None:
    turn["parts"] = [p for p in turn["parts"] if not p.get("thought")]


def reorder(turn: dict[str, Any]) -> None:
    images = [i for i, p in enumerate(turn["parts"]) if "inlineData" in p and not p.get("thought")]
    a, b = images[0], images[1]
    turn["parts"][a], turn["parts"][b] = turn["parts"][b], turn["parts"][a]


def move_text_to_end(turn: dict[str, Any]) -> None:
    text = next(p for p in turn["parts"] if "text" in p and not p.get("thought"))
    turn["parts"].remove(text)
    turn["parts"].append(text)


def swap_signatures(turn: dict[str, Any]) -> None:
    a, b = [p for p in turn["parts"] if "inlineData" in p and not p.get("thought")][:2]
    a[SIGNATURE_KEY], b[SIGNATURE_KEY] = b[SIGNATURE_KEY], a[SIGNATURE_KEY]


def invent_on_thought(turn: dict[str, Any]) -> None:
    turn["parts"][0][SIGNATURE_KEY] = turn["parts"][_final_image_index(turn)][SIGNATURE_KEY]


def invent_on_thought_image(turn: dict[str, Any]) -> None:
    thought_image = next(p for p in turn["parts"] if p.get("thought") and "inlineData" in p)
    thought_image[SIGNATURE_KEY] = "AQ" + "A" * 42


def add_a_part(turn: dict[str, Any]) -> None:
    turn["parts"].append({"text": "and one more thing"})


def mark_image_as_thought(turn: dict[str, Any]) -> None:
    turn["parts"][_final_image_index(turn)]["thought"] = True


def signature_not_a_string(turn: dict[str, Any]) -> None:
    turn["parts"][_final_image_index(turn)][SIGNATURE_KEY] = 12345


@pytest.mark.parametrize(
    ("tamper", "says"),
    [
        (tamper_image, "does not match"),
        (tamper_text, "does not match"),
        (tamper_thought, "does not match"),
        (change_signature, "does not match"),
        (drop_one_signature, "lacks"),
        (drop_all_signatures, "without any thoughtSignature"),
        (rebuild_from_image, "without any thoughtSignature"),
        (rebuild_keeping_signature, "does not match"),
        (drop_thought_parts, ""),
        (reorder, "does not match"),
        (move_text_to_end, ""),
        (swap_signatures, "does not match"),
        (invent_on_thought, "never issued"),
        (invent_on_thought_image, "never issued"),
        (add_a_part, ""),
        (mark_image_as_thought, ""),
        (signature_not_a_string, "thoughtSignature"),
    ],
)
def test_altered_model_turn_is_400(
    emulator: EmulatorServer, turn: dict[str, Any], tamper: Any, says: str
) -> None:
    altered = copy.deepcopy(turn)
    tamper(altered)
    body = assert_error(post(emulator, Route.NATIVE, history(altered)), 400, "invalid_request")
    message = body["error"]["message"]
    assert "contents[1]" in message or "contents.1" in message  # names the turn
    assert says in message
    assert len(emulator.ledger()) == 1  # only the first turn was generated


def test_null_fields_do_not_count_as_alterations(emulator: EmulatorServer, turn: dict[str, Any]) -> None:
    # A client that dumps its parsed model turn with every field (absent ones as null) sends the same turn.
    padded = copy.deepcopy(turn)
    for part in padded["parts"]:
        for field in ("text", "inlineData", "thought", SIGNATURE_KEY):
            part.setdefault(field, None)
    assert post(emulator, Route.NATIVE, history(padded)).status_code == 200


def test_signatures_from_another_emulator_secret_are_refused(emulator: EmulatorServer) -> None:
    with EmulatorServer(emulator_settings(seed=99)) as other:
        foreign = model_turn(other)
    assert_error(post(emulator, Route.NATIVE, history(foreign)), 400, "invalid_request")


def test_signatures_survive_a_restart_with_the_same_seed(emulator: EmulatorServer) -> None:
    with EmulatorServer(emulator_settings(seed=0)) as twin:
        turn = model_turn(twin)
    assert post(emulator, Route.NATIVE, history(turn)).status_code == 200


def test_a_no_image_turn_can_be_sent_back(emulator: EmulatorServer) -> None:
    emulator.set_faults(scripts=[["no_image"]])
    turn = model_turn(emulator, key="blocked")
    assert not [p for p in turn["parts"] if "inlineData" in p and not p.get("thought")]
    assert signed_indexes(turn)
    assert post(emulator, Route.NATIVE, history(turn), key="after").status_code == 200


def test_multi_turn_edit_uses_the_previous_image(emulator: EmulatorServer) -> None:
    emulator.configure(jpeg_rate=0.0, max_images_policy="cap")
    turn = model_turn(emulator, cap=1)
    [(_, with_history)] = final_images(
        post(emulator, Route.NATIVE, history(turn, prompt="make it red")).json()
    )
    [(_, fresh)] = final_images(post(emulator, Route.NATIVE, native_body("make it red")).json())
    assert with_history != fresh


def test_two_earlier_model_turns_are_both_checked(emulator: EmulatorServer, turn: dict[str, Any]) -> None:
    second = post(emulator, Route.NATIVE, history(turn), key="turn-2").json()["candidates"][0]["content"]
    middle = {"role": "user", "parts": [{"text": "now make it red"}]}
    altered = copy.deepcopy(second)
    tamper_text(altered)
    body = assert_error(post(emulator, Route.NATIVE, history(turn, middle, altered)), 400)
    assert "contents[3]" in body["error"]["message"]


# --- model turns are tied to their conversation and model ------------------------------------------


def user_turn(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def chain(
    server: EmulatorServer, *prompts: str, model: str = "native-image-2", key: str = "chain"
) -> list[dict[str, Any]]:
    """A conversation built as a client does: each turn sends the history as returned plus a new prompt.

    Returns the contents so far: user, model, user, model, ... (one model turn per prompt).
    """
    contents: list[dict[str, Any]] = []
    for n, prompt in enumerate(prompts):
        contents.append(user_turn(prompt))
        response = post(server, Route.NATIVE, {"contents": contents}, model=model, key=f"{key}-{n}")
        assert response.status_code == 200, response.text
        contents.append(response.json()["candidates"][0]["content"])
    return contents


def send(
    server: EmulatorServer, contents: list[dict[str, Any]], model: str = "native-image-2"
) -> httpx.Response:
    return post(server, Route.NATIVE, {"contents": [*contents, user_turn("and now in blue")]}, model=model)


def test_a_three_turn_chain_is_accepted(emulator: EmulatorServer) -> None:
    contents = chain(emulator, "a paper boat", "make it red", "add a sail")
    assert [c["role"] for c in contents] == ["user", "model"] * 3
    assert send(emulator, contents).status_code == 200
    assert len(emulator.ledger()) == 4


def test_a_chain_on_another_model_is_accepted(emulator: EmulatorServer) -> None:
    contents = chain(emulator, "a paper boat", "make it red", model="native-image-2.1")
    assert send(emulator, contents, model="native-image-2.1").status_code == 200


def test_a_chain_survives_a_restart_with_the_same_seed(emulator: EmulatorServer) -> None:
    with EmulatorServer(emulator_settings(seed=0)) as before_restart:
        contents = chain(before_restart, "a paper boat", "make it red")
    assert send(emulator, contents).status_code == 200
    with EmulatorServer(emulator_settings(seed=1)) as other_seed:
        assert_error(send(other_seed, contents), 400, "invalid_request")


def _refused(response: httpx.Response, where: str, says: str = "") -> None:
    message = assert_error(response, 400, "invalid_request")["error"]["message"]
    assert where in message, message
    assert says in message, message


def test_a_turn_from_another_conversation_is_400(emulator: EmulatorServer) -> None:
    ours = chain(emulator, "a paper boat", key="ours")
    theirs = chain(emulator, "a red kite", key="theirs")
    billed = len(emulator.ledger())
    # their model turn pasted after our first user turn
    _refused(send(emulator, [ours[0], theirs[1]]), "contents[1]", "does not match")
    # their model turn appended to our conversation as a later turn
    _refused(send(emulator, [*ours, user_turn("make it red"), theirs[1]]), "contents[3]", "does not match")
    assert len(emulator.ledger()) == billed


def test_a_turn_from_another_model_is_400(emulator: EmulatorServer) -> None:
    contents = chain(emulator, "a paper boat", model="native-image-2")
    _refused(send(emulator, contents, model="native-image-2.1"), "contents[1]", "does not match")
    _refused(send(emulator, contents, model="native-image-pro"), "contents[1]", "does not match")


def test_swapped_model_turns_are_400(emulator: EmulatorServer) -> None:
    u1, m1, u2, m2 = chain(emulator, "a paper boat", "make it red")
    _refused(send(emulator, [u1, m2, u2, m1]), "contents[1]", "does not match")


def test_a_duplicated_model_turn_is_400(emulator: EmulatorServer) -> None:
    u1, m1, u2, _m2 = chain(emulator, "a paper boat", "make it red")
    _refused(send(emulator, [u1, m1, u2, m1]), "contents[3]", "does not match")


def test_a_dropped_first_user_turn_is_400(emulator: EmulatorServer) -> None:
    _u1, m1, u2, m2 = chain(emulator, "a paper boat", "make it red")
    _refused(send(emulator, [m1, u2, m2]), "contents[0]", "no user turn before it")
    # without the first exchange at all, the later model turn no longer answers what is sent before it
    _refused(send(emulator, [u2, m2]), "contents[1]", "does not match")


def test_an_altered_earlier_user_turn_is_400(emulator: EmulatorServer) -> None:
    u1, m1, u2, m2 = chain(emulator, "a paper boat", "make it red")
    _refused(send(emulator, [user_turn("a paper plane"), m1, u2, m2]), "contents[1]", "does not match")
    _refused(send(emulator, [u1, m1, user_turn("make it green"), m2]), "contents[3]", "does not match")


def test_two_model_turns_in_a_row_are_400(emulator: EmulatorServer) -> None:
    u1, m1, _u2, m2 = chain(emulator, "a paper boat", "make it red")
    _refused(send(emulator, [u1, m1, m2]), "contents[2]", "right after another model turn")
    _refused(send(emulator, [u1, m1, copy.deepcopy(m1)]), "contents[2]", "right after another model turn")


def test_history_may_omit_the_default_user_role(emulator: EmulatorServer) -> None:
    # `role` defaults to `user`: a first request without it and a history that spells it out agree.
    first = {"parts": [{"text": "a paper boat"}]}
    response = post(emulator, Route.NATIVE, {"contents": [first]})
    turn = response.json()["candidates"][0]["content"]
    assert send(emulator, [user_turn("a paper boat"), turn]).status_code == 200
    assert send(emulator, [first, turn]).status_code == 200


# --- the signer on its own -------------------------------------------------------------------------


def test_signer_round_trip_and_checks() -> None:
    signer = Signer.for_seed(0)
    request = [{"role": "user", "parts": [{"text": "a boat"}]}]
    digests = history_digests(request, "native-image-2")
    parts = [
        {"text": "thinking", "thought": True},
        {"text": "here it is"},
        {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
    ]
    signed = signer.sign(parts, digests[-1])
    assert [SIGNATURE_KEY in p for p in signed] == [False, True, True]
    assert signer.verify(signed, "contents[1]", digests[-1]) is None
    assert Signer.for_seed(1).verify(signed, "contents[1]", digests[-1]) is not None
    assert Signer.for_seed(0, secret="s").verify(signed, "contents[1]", digests[-1]) is not None
    assert signer.verify([dict(p) for p in signed[1:]], "contents[1]", digests[-1]) is not None
    # the conversation and the model are part of what is signed
    assert signer.verify(signed, "contents[1]", digests[0]) is not None
    assert signer.verify(signed, "contents[1]", history_digests(request, "native-image-pro")[-1]) is not None
    other = history_digests([{"role": "user", "parts": [{"text": "a kite"}]}], "native-image-2")
    assert signer.verify(signed, "contents[1]", other[-1]) is not None


def test_history_digests_ignore_signatures_and_nulls() -> None:
    plain = [{"role": "user", "parts": [{"text": "a"}]}, {"role": "model", "parts": [{"text": "b"}]}]
    noisy = [
        {"parts": [{"text": "a", "inlineData": None}]},
        {"role": "model", "parts": [{"text": "b", SIGNATURE_KEY: "xyz", "thought": None}]},
    ]
    assert history_digests(plain, "m") == history_digests(noisy, "m")
    assert len(history_digests(plain, "m")) == 3
    assert history_digests(plain, "m") != history_digests(plain, "n")
    assert history_digests(plain, "m")[2] != history_digests(list(reversed(plain)), "m")[2]
