"""The emulator driven by the official SDKs, as a user trying their own client against `imagebatch
emulator` would (issue 10): google-genai on the native route, openai on chat, images and responses,
anthropic on messages. Real HTTP to the session's emulator on 127.0.0.1; the SDKs are the `sdk`
dependency group (installed by `uv sync`, not a runtime dependency)."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from helpers.images import mask, open_image, png

from imagebatch.emulator import EmulatorServer
from imagebatch.gateway.constants import COMPAT_VERSION_HEADER, DEFAULT_COMPAT_VERSION

genai = pytest.importorskip("google.genai", reason="the sdk dependency group is not installed")
openai = pytest.importorskip("openai", reason="the sdk dependency group is not installed")
anthropic = pytest.importorskip("anthropic", reason="the sdk dependency group is not installed")
types = genai.types


@pytest.fixture
def native(emulator: EmulatorServer) -> Any:
    """google-genai pointed at the emulator: the spec's root with `v1beta`, the key in the header the
    spec names (the SDK's own `x-goog-api-key` is ignored by the service)."""
    emulator.configure(jpeg_rate=0.0, max_images_policy="cap")
    options = types.HttpOptions(
        base_url=emulator.url, api_version="v1beta", headers={"x-native-api-key": emulator.api_key}
    )
    client = genai.Client(api_key="unused-by-the-service", http_options=options)
    yield client
    client.close()


def images_of(response: Any) -> list[tuple[str, bytes]]:
    parts = response.candidates[0].content.parts
    return [(p.inline_data.mime_type, p.inline_data.data) for p in parts if p.inline_data and not p.thought]


def test_google_genai_text_to_image(native: Any) -> None:
    config = types.GenerateContentConfig(
        response_modalities=["IMAGE"], image_config=types.ImageConfig(aspect_ratio="16:9", image_size="1K")
    )
    response = native.models.generate_content(model="native-image-2", contents="a red boat", config=config)
    [(mime, data)] = images_of(response)
    assert mime == "image/png" and open_image(data).size == (1024, 576)


def test_google_genai_reference_edit(native: Any) -> None:
    reference = types.Part.from_bytes(data=png(64, 64, (10, 200, 30)), mime_type="image/png")
    config = types.GenerateContentConfig(response_modalities=["IMAGE"])
    response = native.models.generate_content(
        model="native-image-2.1", contents=[reference, "make it blue"], config=config
    )
    assert len(images_of(response)) == 1


def test_google_genai_two_turn_chat_edit(native: Any, emulator: EmulatorServer) -> None:
    """A chat sends the first model turn back, with its signatures, as the SDK encodes it."""
    chat = native.chats.create(
        model="native-image-2", config=types.GenerateContentConfig(response_modalities=["IMAGE"])
    )
    first = images_of(chat.send_message("a paper boat"))
    second = images_of(chat.send_message("now make it red"))
    assert first and second and first[0][1] != second[0][1]
    sent = [r for r in emulator.requests() if r["route"] == "native"]
    assert [r["status"] for r in sent[-2:]] == [200, 200]


@pytest.fixture
def oai(emulator: EmulatorServer) -> Any:
    client = openai.OpenAI(api_key=emulator.api_key, base_url=f"{emulator.url}/v1", max_retries=0)
    yield client
    client.close()


def test_openai_images_generate_and_edit_with_a_mask(oai: Any) -> None:
    made = oai.images.generate(model="compat-image-2", prompt="a lamp", size="1024x1024")
    assert open_image(base64.b64decode(made.data[0].b64_json)).size == (1024, 1024)
    edited = oai.images.edit(
        model="compat-image-2",
        prompt="paint the shade green",
        image=("room.png", io.BytesIO(png(64, 64)), "image/png"),
        mask=("mask.png", io.BytesIO(mask(64, 64)), "image/png"),
        size="1024x1024",
    )
    assert open_image(base64.b64decode(edited.data[0].b64_json)).size == (1024, 1024)


def test_openai_chat_image(oai: Any) -> None:
    answer = oai.chat.completions.create(
        model="native-image-2", messages=[{"role": "user", "content": "a green kite"}]
    )
    assert "data:image/" in answer.choices[0].message.content


def test_openai_responses(oai: Any) -> None:
    answer = oai.responses.create(model="text-model-b", input="describe a kite")
    assert answer.output_text and answer.usage.total_tokens > 0


def test_anthropic_messages(emulator: EmulatorServer) -> None:
    """The messages route wants `x-api-key` and `compat-version` and refuses `Authorization: Bearer`,
    which this SDK sends for an `api_key`: the key goes in the header the spec names instead."""
    headers = {"x-api-key": emulator.api_key, COMPAT_VERSION_HEADER: DEFAULT_COMPAT_VERSION}
    headers["Authorization"] = anthropic.omit
    with anthropic.Anthropic(
        api_key=None, base_url=emulator.url, default_headers=headers, max_retries=0
    ) as client:
        answer = client.messages.create(
            model="claude-compat-small", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
    assert answer.content[0].type == "text" and answer.usage.output_tokens > 0
