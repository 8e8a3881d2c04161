"""GatewayClient answers (against the shared fake service): what each route's reader takes from a
success body, and what a malformed one becomes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from helpers.fake_gateway import (
    JPEG,
    PNG,
    PNG_WIDE,
    ROUTES,
    USAGE_METADATA,
    FakeService,
    Reply,
    b64,
    chat_body,
    image_part,
    images_body,
    native_body,
    text_part,
)

from imagebatch.gateway import (
    ImageResult,
    NoImageResult,
    TextResult,
)
from imagebatch.gateway.errors import (
    ResponseFormatError,
)

# === readers: native =====================================================================================


def run_native(service: FakeService, answer: Any, **headers: str) -> Any:
    return ROUTES["native"](service.reply(Reply(json=answer, headers=headers)).client())


def test_native_thought_parts_are_skipped_even_with_images(service: FakeService) -> None:
    answer = native_body(
        text_part("thinking", thought=True),
        image_part(JPEG, "image/jpeg", thought=True),
        text_part("Here you go"),
        image_part(PNG, thoughtSignature="sig"),
    )
    result = run_native(service, answer)
    assert isinstance(result, ImageResult)
    assert [i.data for i in result.images] == [PNG]
    assert result.text == "Here you go"


def test_native_only_thought_images_is_no_image(service: FakeService) -> None:
    answer = native_body(image_part(PNG, thought=True), text_part("draft", thought=True))
    result = run_native(service, answer)
    assert isinstance(result, NoImageResult)
    assert result.text is None


def test_native_image_second_after_text(service: FakeService) -> None:
    result = run_native(service, native_body(text_part("A red square."), image_part(PNG)))
    assert isinstance(result, ImageResult)
    assert [(i.data, i.mime_type, i.width, i.height) for i in result.images] == [(PNG, "image/png", 8, 8)]
    assert result.text == "A red square."
    assert result.finish_reason == "STOP"


def test_native_two_images_in_order(service: FakeService) -> None:
    result = run_native(service, native_body(image_part(PNG_WIDE), text_part("and"), image_part(PNG)))
    assert [(i.data, i.width, i.height) for i in result.images] == [(PNG_WIDE, 8, 4), (PNG, 8, 8)]


def test_native_jpeg_declared_as_jpeg(service: FakeService) -> None:
    (image,) = run_native(service, native_body(image_part(JPEG, "image/jpeg"))).images
    assert (image.data, image.mime_type, image.width, image.height) == (JPEG, "image/jpeg", 6, 8)


def test_native_png_declared_as_jpeg_is_read_as_png(service: FakeService) -> None:
    (image,) = run_native(service, native_body(image_part(PNG, "image/jpeg"))).images
    assert image.mime_type == "image/png"


def test_native_200_without_image_is_a_distinct_result(service: FakeService) -> None:
    feedback = {"safetyRatings": [{"category": "X", "probability": "HIGH"}]}
    answer = native_body(text_part("I can't draw that."), finish="IMAGE_SAFETY", promptFeedback=feedback)
    result = run_native(service, answer, **{"x-request-id": "ni-1"})
    assert isinstance(result, NoImageResult)
    assert result.text == "I can't draw that."
    assert result.finish_reason == "IMAGE_SAFETY"
    assert result.prompt_feedback == feedback
    assert result.usage == USAGE_METADATA
    assert result.request_id == "ni-1"


def test_native_blocked_prompt_without_candidates(service: FakeService) -> None:
    result = run_native(service, {"promptFeedback": {"blockReason": "SAFETY"}})
    assert isinstance(result, NoImageResult)
    assert result.prompt_feedback == {"blockReason": "SAFETY"}
    assert result.finish_reason is None


def test_native_model_content_is_the_candidate_content_as_returned(service: FakeService) -> None:
    answer = native_body(
        text_part("plan", thought=True, thoughtSignature="AAA/+=="),
        image_part(PNG, thoughtSignature="BBB"),
        {"thoughtSignature": "CCC", "text": "done", "futureField": {"kept": True}, "nullable": None},
    )
    expected = copy.deepcopy(answer["candidates"][0]["content"])
    result = run_native(service, answer)
    assert result.model_content == expected
    # Not a re-serialisation: key order, nulls and unknown fields are as the service sent them.
    assert list(result.model_content["parts"][2]) == ["thoughtSignature", "text", "futureField", "nullable"]


def test_native_usage_is_passed_through_untouched(service: FakeService) -> None:
    usage = {"promptTokenCount": 3, "odd": {"nested": [1, None, "x"]}, "totalTokenCount": 1293}
    result = run_native(service, {**native_body(image_part(PNG)), "usageMetadata": usage})
    assert result.usage == usage


# === readers: chat, images, text =========================================================================


def run(service: FakeService, name: str, answer: Any) -> Any:
    return ROUTES[name](service.reply(Reply(json=answer)).client())


def test_chat_one_image_from_markdown_data_url(service: FakeService) -> None:
    content = f"Here it is:\n\n![image](data:image/png;base64,{b64(PNG)})\n"
    result = run(service, "chat", chat_body(content, usage={"total_tokens": 9}))
    assert isinstance(result, ImageResult)
    assert [(i.data, i.mime_type) for i in result.images] == [(PNG, "image/png")]
    assert result.text == "Here it is:"
    assert result.usage == {"total_tokens": 9}
    assert result.finish_reason == "stop"


def test_chat_two_images_and_jpeg(service: FakeService) -> None:
    content = f"![a](data:image/jpeg;base64,{b64(JPEG)}) and ![b](data:image/png;base64,{b64(PNG_WIDE)})"
    result = run(service, "chat", chat_body(content))
    assert [(i.data, i.mime_type, i.width) for i in result.images] == [
        (JPEG, "image/jpeg", 6),
        (PNG_WIDE, "image/png", 8),
    ]
    assert result.text == "and"


def test_chat_without_image_is_no_image_with_text(service: FakeService) -> None:
    result = run(service, "chat", chat_body("I cannot help with that."))
    assert isinstance(result, NoImageResult)
    assert result.text == "I cannot help with that."


def test_images_route_reads_b64_json_and_tolerates_extra_fields(service: FakeService) -> None:
    answer = images_body(PNG_WIDE, revised_prompt="a red square, flat", seed=7)
    answer["usage"] = {"images": 1}
    answer["background"] = "opaque"
    result = run(service, "images_generations", answer)
    assert isinstance(result, ImageResult)
    assert [(i.data, i.mime_type, i.width, i.height) for i in result.images] == [
        (PNG_WIDE, "image/png", 8, 4)
    ]
    assert result.usage == {"images": 1}


def test_images_edit_reads_b64_json(service: FakeService) -> None:
    result = run(service, "images_edits", images_body(PNG, revised_prompt="x"))
    assert [i.data for i in result.images] == [PNG]


def test_messages_text_and_usage(service: FakeService) -> None:
    answer = {
        "id": "msg_1",
        "content": [
            {"type": "text", "text": "Hel"},
            {"type": "tool_use", "id": "t", "input": {}},
            {"type": "text", "text": "lo"},
            {"type": "text", "text": None},
        ],
        "usage": {"input_tokens": 3, "output_tokens": 2, "cache": {"x": 1}},
    }
    result = run(service, "messages", answer)
    assert isinstance(result, TextResult)
    assert result.text == "Hello"
    assert result.usage == answer["usage"]
    assert result.raw == answer


@pytest.mark.parametrize(
    "answer",
    [
        {"output_text": "Hello", "usage": {"total_tokens": 4}},
        {
            "output": [
                {"type": "reasoning", "summary": []},
                {"type": "message", "content": [{"type": "output_text", "text": "Hel"}, {"text": "lo"}]},
            ],
            "usage": {"total_tokens": 4},
        },
    ],
    ids=["output_text", "output"],
)
def test_responses_text_and_usage(service: FakeService, answer: dict[str, Any]) -> None:
    result = run(service, "responses", answer)
    assert result.text == "Hello"
    assert result.usage == {"total_tokens": 4}


# === malformed success bodies ============================================================================

MALFORMED = [
    ("native", Reply(content=b"not json")),
    ("native", Reply(json=[1, 2])),
    ("native", Reply(json={"candidates": {"content": {}}})),
    ("native", Reply(json=native_body({"inlineData": {"mimeType": "image/png", "data": "%%%not base64"}}))),
    ("native", Reply(json=native_body(image_part(b"GIF89a not an image")))),
    ("native", Reply(json=native_body({"inlineData": {"mimeType": "image/png"}}))),
    ("native", Reply(json=native_body(image_part(PNG[:20])))),
    ("chat", Reply(json={"choices": []})),
    ("chat", Reply(json={"id": "x"})),
    ("chat", Reply(json=chat_body(f"![x](data:image/png;base64,{b64(b'hello world')})"))),
    ("images_generations", Reply(json={"created": 1, "data": []})),
    ("images_generations", Reply(json={"created": 1, "data": [{"url": "https://cdn.test/a.png"}]})),
    ("images_generations", Reply(json=images_body(b"\x00\x01 not an image"))),
    ("images_edits", Reply(content=b"")),
    ("messages", Reply(json=["content"])),
    ("messages", Reply(content=b"{truncated")),
    ("responses", Reply(json={"output": 3})),
    ("responses", Reply(json="hello")),
]


@pytest.mark.parametrize(("name", "reply"), MALFORMED)
def test_malformed_success_body_is_a_format_error(service: FakeService, name: str, reply: Reply) -> None:
    with pytest.raises(ResponseFormatError):
        ROUTES[name](service.reply(reply).client())
    assert len(service.requests) == 1
