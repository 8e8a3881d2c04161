"""The kept conversation of a native answer: images stored once, as references, put back exactly."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from helpers.images import jpeg, png

from imagebatch.work.conversation import HistoryError, compact_model, compact_user, inline
from imagebatch.work.store import OutputStore

IMAGE = next(data for w in range(40, 50) if len(data := png(w, 30)) % 3)
"""A PNG whose base64 ends in padding (so it has spare bits another spelling could set)."""
INPUT = jpeg(20, 20)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def store(tmp_path: Path) -> OutputStore:
    store = OutputStore(tmp_path / "out")
    store.backend.prepare()
    store.write_file("job/0-abc.png", IMAGE)
    (tmp_path / "ref.jpg").write_bytes(INPUT)
    return store


FILES = [("images/job/0-abc.png", IMAGE)]


def model_content(data: str = b64(IMAGE)) -> dict[str, object]:
    thought = b64(png(8, 8))
    return {
        "role": "model",
        "parts": [
            {"text": "composing", "thought": True},
            {
                "inlineData": {"mimeType": "image/png", "data": thought},
                "thought": True,
                "thoughtSignature": "c2ln",
            },
            {"text": "Here it is.", "thoughtSignature": "dGV4dA=="},
            {"inlineData": {"mimeType": "image/png", "data": data}, "thoughtSignature": "aW1n"},
        ],
    }


def test_images_are_kept_as_references_and_put_back_exactly(store: OutputStore, tmp_path: Path) -> None:
    user = {
        "role": "user",
        "parts": [{"text": "a mug"}, {"inlineData": {"mimeType": "image/jpeg", "data": b64(INPUT)}}],
    }
    contents = [user, model_content()]
    kept = [compact_user(user, [(tmp_path / "ref.jpg", hashlib.sha256(INPUT).hexdigest())]),
            compact_model(contents[1], FILES)]  # fmt: skip
    assert kept[0]["parts"][1]["inlineData"]["data"]["input"] == str(tmp_path / "ref.jpg")
    assert kept[1]["parts"][3]["inlineData"]["data"]["file"] == "images/job/0-abc.png"
    assert kept[1]["parts"][1] == contents[1]["parts"][1]  # the thought image has no file: kept inline
    assert [list(p) for p in kept[1]["parts"]] == [list(p) for p in contents[1]["parts"]]  # keys in order
    assert len(json.dumps(kept)) < len(json.dumps(contents))
    assert json.dumps(inline(kept, store)) == json.dumps(contents)  # byte for byte, key order included


def test_base64_that_reencoding_would_not_give_back_stays_inline(store: OutputStore, tmp_path: Path) -> None:
    standard = b64(IMAGE)  # a spelling with other spare bits before its padding: the same bytes decoded
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    body = standard.rstrip("=")
    spare = alphabet[alphabet.index(body[-1]) ^ 1]  # the lowest bit of the last character is a spare one
    other = body[:-1] + spare + standard[len(body) :]
    content = model_content(other)
    assert base64.b64decode(other) == IMAGE and other != standard
    kept = compact_model(content, FILES)
    assert kept["parts"][3] == content["parts"][3]  # the bytes have a file, but this spelling is kept whole
    assert compact_model(model_content(), FILES)["parts"][3] != content["parts"][3]


def test_a_reference_whose_file_changed_or_went_is_refused(store: OutputStore, tmp_path: Path) -> None:
    kept = [compact_model(model_content(), FILES)]
    (store.backend.root / "images" / "job" / "0-abc.png").write_bytes(png(41, 30))
    with pytest.raises(HistoryError, match="changed"):
        inline(kept, store)
    (store.backend.root / "images" / "job" / "0-abc.png").unlink()
    with pytest.raises(HistoryError, match="gone"):
        inline(kept, store)
    user = compact_user(
        {"role": "user", "parts": [{"inlineData": {"mimeType": "image/jpeg", "data": b64(INPUT)}}]},
        [(tmp_path / "ref.jpg", hashlib.sha256(INPUT).hexdigest())],
    )
    (tmp_path / "ref.jpg").write_bytes(jpeg(21, 20))
    with pytest.raises(HistoryError, match="changed"):
        inline([user], store)
