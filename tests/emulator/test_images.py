"""Emulator over real HTTP: answer shapes per route, real images at the documented sizes, determinism,
reference images and masks, the JPEG mix, the X-Service-Max-Images cap, the render cache."""

from __future__ import annotations

import base64
import io
import random

import pytest
from helpers.emulator import (
    VALID_BODIES,
    b64,
    chat_images,
    edit_files,
    emulator_settings,
    final_images,
    native_body,
    open_image,
    png,
    post,
)
from PIL import Image, ImageStat

from imagebatch.emulator import EmulatorServer, images_pixel_size, native_pixel_size
from imagebatch.gateway.compat_models import ChatResponse, ImagesResponse
from imagebatch.gateway.constants import ASPECT_RATIOS, IMAGE_SIZES, IMAGES_API_SIZES, Route
from imagebatch.gateway.imagefile import sniff_mime
from imagebatch.gateway.models import NativeResponse

# --- pixel sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", IMAGE_SIZES)
@pytest.mark.parametrize("ratio", ASPECT_RATIOS["native-image-2"])
def test_native_pixel_size_rule(size: str, ratio: str) -> None:
    width, height = native_pixel_size(size, ratio)
    a, b = (int(x) for x in ratio.split(":"))
    assert max(width, height) == {"1K": 1024, "2K": 2048, "4K": 4096}[size]
    assert width % 8 == 0 and height % 8 == 0
    assert abs(width / height - a / b) < 0.02 * (a / b)
    assert (width >= height) == (a >= b)


@pytest.mark.parametrize(
    ("size", "ratio", "expected"),
    [
        ("1K", "1:1", (1024, 1024)),
        ("2K", "16:9", (2048, 1152)),
        ("4K", "9:16", (2304, 4096)),
        ("1K", "21:9", (1024, 440)),
        ("1K", "1:8", (128, 1024)),
        ("2K", "4:5", (1640, 2048)),
    ],
)
def test_native_pixel_size_examples(size: str, ratio: str, expected: tuple[int, int]) -> None:
    assert native_pixel_size(size, ratio) == expected


@pytest.mark.parametrize("ratio", ASPECT_RATIOS["native-image-2"])
def test_native_images_have_the_documented_size_for_each_ratio(emulator: EmulatorServer, ratio: str) -> None:
    emulator.configure(max_images_policy="cap")
    response = post(emulator, Route.NATIVE, native_body(ratio=ratio), headers={"X-Service-Max-Images": "2"})
    images = final_images(response.json())
    assert len(images) == 2
    for _, data in images:
        assert open_image(data).size == native_pixel_size("1K", ratio)


@pytest.mark.parametrize(("size", "ratio"), [("2K", "1:1"), ("4K", "16:9"), ("4K", "1:8"), ("2K", "3:4")])
def test_native_images_have_the_documented_size_for_each_size(
    emulator: EmulatorServer, size: str, ratio: str
) -> None:
    response = post(emulator, Route.NATIVE, native_body(size=size, ratio=ratio), model="native-image-2.1")
    [(_, data)] = final_images(response.json())
    assert open_image(data).size == native_pixel_size(size, ratio)


@pytest.mark.parametrize("size", IMAGES_API_SIZES)
def test_images_route_sizes_are_exact(emulator: EmulatorServer, size: str) -> None:
    body = {**VALID_BODIES[Route.IMAGES_GENERATIONS], "size": size}
    response = post(emulator, Route.IMAGES_GENERATIONS, body)
    data = base64.b64decode(response.json()["data"][0]["b64_json"])
    expected = (1024, 1024) if size == "auto" else tuple(int(x) for x in size.split("x"))
    assert open_image(data).size == expected == images_pixel_size(size)


def test_chat_image_size_follows_native_image_config(emulator: EmulatorServer) -> None:
    body = {
        **VALID_BODIES[Route.CHAT],
        "native": {"image_config": {"image_size": "2K", "aspect_ratio": "3:2"}},
    }
    [(_, data)] = chat_images(post(emulator, Route.CHAT, body).json())
    assert open_image(data).size == native_pixel_size("2K", "3:2") == (2048, 1368)


# --- answer shapes ---------------------------------------------------------------------------------


def test_native_answer_shape(emulator: EmulatorServer) -> None:
    response = post(emulator, Route.NATIVE, key="shape-1")
    assert response.status_code == 200
    answer = response.json()
    NativeResponse.model_validate(answer)
    [candidate] = answer["candidates"]
    assert candidate["finishReason"] == "STOP"
    assert candidate["content"]["role"] == "model"
    parts = candidate["content"]["parts"]
    assert parts[0].get("thought") is True and isinstance(parts[0]["text"], str)
    assert any("text" in p and not p.get("thought") for p in parts)
    finals = [p for p in parts if "inlineData" in p and not p.get("thought")]
    assert finals and all(p["thoughtSignature"] for p in finals)
    for part in finals:
        data = base64.b64decode(part["inlineData"]["data"])
        assert sniff_mime(data) == part["inlineData"]["mimeType"]
    assert parts.index(finals[0]) > 0  # the image is never the first part here
    usage = answer["usageMetadata"]
    assert usage["totalTokenCount"] == (
        usage["promptTokenCount"] + usage["candidatesTokenCount"] + usage["thoughtsTokenCount"]
    )
    assert isinstance(answer["promptFeedback"], dict)
    [entry] = emulator.ledger()
    assert entry["usage"] == usage
    assert entry["images"] == len(finals)


def test_native_answers_vary_in_part_order_and_thought_images(emulator: EmulatorServer) -> None:
    text_first, image_first, with_thought_image = 0, 0, 0
    for i in range(12):
        parts = post(emulator, Route.NATIVE, key=f"order-{i}").json()["candidates"][0]["content"]["parts"]
        kinds = [
            ("thought-" if p.get("thought") else "") + ("image" if "inlineData" in p else "text")
            for p in parts
        ]
        finals = [k for k in kinds if not k.startswith("thought")]
        text_first += finals[0] == "text"
        image_first += finals[0] == "image"
        with_thought_image += "thought-image" in kinds
    assert text_first and image_first and with_thought_image


def test_thought_images_are_intermediate_and_small(emulator: EmulatorServer) -> None:
    emulator.configure(thought_image_rate=1.0, jpeg_rate=0.0)
    parts = post(emulator, Route.NATIVE).json()["candidates"][0]["content"]["parts"]
    [thought_image] = [p for p in parts if p.get("thought") and "inlineData" in p]
    assert "thoughtSignature" not in thought_image
    draft = open_image(base64.b64decode(thought_image["inlineData"]["data"]))
    assert max(draft.size) == 256


def test_chat_answer_shape(emulator: EmulatorServer) -> None:
    answer = post(emulator, Route.CHAT).json()
    ChatResponse.model_validate(answer)
    choice = answer["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    assert "![image](data:image/" in choice["message"]["content"]
    assert "thoughtSignature" not in str(answer)  # chat answers cannot carry signed history
    assert set(answer["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert "data" not in answer


def test_images_answer_shape(emulator: EmulatorServer) -> None:
    answer = post(emulator, Route.IMAGES_GENERATIONS).json()
    ImagesResponse.model_validate(answer)
    assert isinstance(answer["created"], int)
    [item] = answer["data"]
    assert sniff_mime(base64.b64decode(item["b64_json"])) == "image/png"
    assert item["revised_prompt"]
    assert answer["usage"]["total_tokens"] > 0


def test_messages_answer_shape(emulator: EmulatorServer) -> None:
    answer = post(emulator, Route.MESSAGES).json()
    assert answer["id"].startswith("msg_")
    assert answer["type"] == "message" and answer["role"] == "assistant"
    assert answer["model"] == VALID_BODIES[Route.MESSAGES]["model"]
    [block] = answer["content"]
    assert block["type"] == "text" and block["text"]
    assert answer["stop_reason"] == "end_turn"
    assert answer["usage"]["input_tokens"] > 0 and answer["usage"]["output_tokens"] > 0
    assert emulator.ledger()[0]["route"] == "messages"


def test_messages_max_tokens_cuts_the_reply(emulator: EmulatorServer) -> None:
    answer = post(emulator, Route.MESSAGES, {**VALID_BODIES[Route.MESSAGES], "max_tokens": 2}).json()
    assert answer["stop_reason"] == "max_tokens"
    assert answer["usage"]["output_tokens"] <= 2


def test_messages_accept_content_blocks(emulator: EmulatorServer) -> None:
    body = {
        **VALID_BODIES[Route.MESSAGES],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    assert post(emulator, Route.MESSAGES, body).status_code == 200


def test_responses_answer_shape(emulator: EmulatorServer) -> None:
    answer = post(emulator, Route.RESPONSES).json()
    assert answer["object"] == "response" and answer["status"] == "completed"
    [message] = answer["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    [content] = message["content"]
    assert content["type"] == "output_text" and content["text"] == answer["output_text"]
    assert (
        answer["usage"]["total_tokens"] == answer["usage"]["input_tokens"] + answer["usage"]["output_tokens"]
    )


# --- determinism -----------------------------------------------------------------------------------


def _native_png(server: EmulatorServer, prompt: str, key: str) -> bytes:
    [(mime, data)] = final_images(post(server, Route.NATIVE, native_body(prompt), key=key).json())
    assert mime == "image/png"
    return data


def test_same_prompt_parameters_and_seed_give_the_same_image(emulator: EmulatorServer) -> None:
    emulator.configure(jpeg_rate=0.0)
    first = _native_png(emulator, "a lighthouse at dusk", "det-1")
    assert _native_png(emulator, "a lighthouse at dusk", "det-2") == first
    assert _native_png(emulator, "a lighthouse at noon", "det-3") != first
    with EmulatorServer(emulator_settings(seed=0, jpeg_rate=0.0)) as twin:
        assert _native_png(twin, "a lighthouse at dusk", "det-4") == first
    with EmulatorServer(emulator_settings(seed=1, jpeg_rate=0.0)) as other:
        assert _native_png(other, "a lighthouse at dusk", "det-5") != first


def test_images_show_the_prompt_colour(emulator: EmulatorServer) -> None:
    emulator.configure(jpeg_rate=0.0)
    a = open_image(_native_png(emulator, "a green field", "c1")).convert("RGB")
    b = open_image(_native_png(emulator, "a purple sky", "c2")).convert("RGB")
    assert ImageStat.Stat(a).mean != ImageStat.Stat(b).mean


def test_render_cache_serves_repeats(emulator: EmulatorServer) -> None:
    emulator.configure(jpeg_rate=0.0)
    body = native_body("cache me", size="4K")
    post(emulator, Route.NATIVE, body, key="cache-1")
    renders = emulator.state.renderer.renders
    post(emulator, Route.NATIVE, body, key="cache-1")
    assert emulator.state.renderer.renders == renders


# --- JPEG mix and X-Service-Max-Images ----------------------------------------------------------------


@pytest.mark.parametrize(("rate", "mime"), [(1.0, "image/jpeg"), (0.0, "image/png")])
@pytest.mark.parametrize("route", [Route.NATIVE, Route.CHAT])
def test_jpeg_rate_extremes(emulator: EmulatorServer, route: Route, rate: float, mime: str) -> None:
    emulator.configure(jpeg_rate=rate, max_images_policy="cap")
    answer = post(emulator, route, headers={"X-Service-Max-Images": "3"}).json()
    images = final_images(answer) if route is Route.NATIVE else chat_images(answer)
    assert [m for m, _ in images] == [mime] * 3
    assert all(sniff_mime(data) == mime for _, data in images)


def test_default_jpeg_rate_mixes_formats(emulator: EmulatorServer) -> None:
    emulator.configure(max_images_policy="cap")
    mimes = [
        mime
        for i in range(10)
        for mime, _ in final_images(
            post(emulator, Route.NATIVE, key=f"mix-{i}", headers={"X-Service-Max-Images": "4"}).json()
        )
    ]
    assert len(mimes) == 40
    assert 0.1 <= mimes.count("image/jpeg") / 40 <= 0.45  # settings default 0.25, deterministic per seed


def test_images_route_is_always_png(emulator: EmulatorServer) -> None:
    emulator.configure(jpeg_rate=1.0)
    data = base64.b64decode(post(emulator, Route.IMAGES_GENERATIONS).json()["data"][0]["b64_json"])
    assert sniff_mime(data) == "image/png"


@pytest.mark.parametrize("cap", [1, 2, 3, 4])
@pytest.mark.parametrize("route", [Route.NATIVE, Route.CHAT])
def test_cap_policy_delivers_exactly_the_cap(emulator: EmulatorServer, route: Route, cap: int) -> None:
    emulator.configure(max_images_policy="cap")
    answer = post(emulator, route, headers={"X-Service-Max-Images": str(cap)}).json()
    images = final_images(answer) if route is Route.NATIVE else chat_images(answer)
    assert len(images) == cap
    assert emulator.ledger()[0]["images"] == cap
    assert len({data for _, data in images}) == cap  # the images of one answer differ


def test_random_policy_delivers_between_one_and_the_cap(emulator: EmulatorServer) -> None:
    counts = []
    for i in range(12):
        response = post(emulator, Route.NATIVE, key=f"count-{i}", headers={"X-Service-Max-Images": "4"})
        counts.append(len(final_images(response.json())))
    assert set(counts) <= {1, 2, 3, 4}
    assert len(set(counts)) >= 2  # fewer than asked happens
    assert [e["images"] for e in emulator.ledger()] == counts
    # The same key gets the same count again (deterministic from seed and key).
    again = post(emulator, Route.NATIVE, key="count-0", headers={"X-Service-Max-Images": "4"})
    assert len(final_images(again.json())) == counts[0]


def test_no_header_means_one_image(emulator: EmulatorServer) -> None:
    emulator.configure(max_images_policy="cap")
    assert len(final_images(post(emulator, Route.NATIVE).json())) == 1
    assert len(chat_images(post(emulator, Route.CHAT).json())) == 1


# --- reference images and masks ---------------------------------------------------------------------

RED, BLUE = (220, 20, 20), (20, 20, 220)


def _mean(data: bytes) -> list[float]:
    return ImageStat.Stat(open_image(data).convert("RGB")).mean


def test_native_edits_use_the_reference_image(emulator: EmulatorServer) -> None:
    emulator.configure(jpeg_rate=0.0)

    def edited(colour: tuple[int, int, int]) -> bytes:
        part = {"inlineData": {"mimeType": "image/png", "data": b64(png(64, 64, colour))}}
        body = native_body("make it dramatic")
        body["contents"][0]["parts"].append(part)
        [(_, data)] = final_images(post(emulator, Route.NATIVE, body).json())
        return data

    red, blue = _mean(edited(RED)), _mean(edited(BLUE))
    assert red[0] > blue[0] + 40 and blue[2] > red[2] + 40


def _edit(emulator: EmulatorServer, files: list, size: str = "1024x1024") -> Image.Image:
    response = post(emulator, Route.IMAGES_EDITS, files=files, data={"prompt": "add a moon", "size": size})
    assert response.status_code == 200, response.text
    return open_image(base64.b64decode(response.json()["data"][0]["b64_json"])).convert("RGB")


def test_images_edits_use_the_reference_image(emulator: EmulatorServer) -> None:
    red = ImageStat.Stat(_edit(emulator, edit_files(png(64, 64, RED)))).mean
    blue = ImageStat.Stat(_edit(emulator, edit_files(png(64, 64, BLUE)))).mean
    assert red[0] > blue[0] + 40 and blue[2] > red[2] + 40


def _half_mask(size: int) -> bytes:
    mask = Image.new("RGBA", (size, size), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (0, 0, size // 2, size))  # left half transparent: redraw it
    out = io.BytesIO()
    mask.save(out, "PNG")
    return out.getvalue()


def test_mask_keeps_opaque_area_and_changes_transparent_area(emulator: EmulatorServer) -> None:
    rng = random.Random(0)
    source = Image.frombytes("RGB", (1024, 1024), rng.randbytes(1024 * 1024 * 3))
    buffer = io.BytesIO()
    source.save(buffer, "PNG", compress_level=1)
    result = _edit(emulator, edit_files(buffer.getvalue(), mask=_half_mask(1024)))
    assert result.size == (1024, 1024)
    kept_box, redrawn_box = (512, 0, 1024, 1024), (0, 0, 512, 1024)
    assert result.crop(kept_box).tobytes() == source.crop(kept_box).tobytes()
    redrawn, original = result.crop(redrawn_box).tobytes(), source.crop(redrawn_box).tobytes()
    same = sum(1 for i in range(0, len(redrawn), 3) if redrawn[i : i + 3] == original[i : i + 3])
    assert same / (512 * 1024) < 0.01


def test_mask_is_scaled_with_the_source_to_the_output_size(emulator: EmulatorServer) -> None:
    result = _edit(emulator, edit_files(png(64, 64, RED), mask=_half_mask(64)), size="1536x1024")
    assert result.size == (1536, 1024)
    right = result.crop((768, 0, 1536, 1024))
    assert right.getcolors() == [(768 * 1024, RED)]
    assert result.crop((0, 0, 768, 1024)).getcolors(2**20) != [(768 * 1024, RED)]


def test_several_reference_images(emulator: EmulatorServer) -> None:
    files = edit_files(png(64, 64, RED), png(64, 64, BLUE), field="image[]")
    only_first = _edit(emulator, edit_files(png(64, 64, RED)))
    assert _edit(emulator, files).tobytes() != only_first.tobytes()  # the second one shows too
    [entry, _] = emulator.ledger()
    assert entry["route"] == "images_edits"
