"""The emulator's reading of the spec (`emulator.spec`, `emulator.bodies`) against the client's
(`gateway.constants`, `gateway.models`, `gateway.compat_models`), rule by rule: the two are written apart
so that a wrong rule cannot pass both, and a disagreement fails here under the rule's name."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from helpers.images import b64, png
from pydantic import ValidationError

from imagebatch.emulator import bodies, spec
from imagebatch.gateway import compat_models, constants, models
from imagebatch.gateway.constants import Route
from imagebatch.gateway.imagefile import ImageInfo, mask_problems

TABLES: dict[str, tuple[Any, Any]] = {
    "native model ids": (set(spec.NATIVE_MODELS), set(constants.NATIVE_MODELS)),
    "default native model": (spec.DEFAULT_NATIVE_MODEL, constants.DEFAULT_NATIVE_MODEL),
    "images API model id": (spec.COMPAT_IMAGE_MODEL, constants.COMPAT_IMAGE_MODEL),
    "image model ids": (set(spec.IMAGE_MODELS), set(constants.IMAGE_MODELS)),
    "aspect ratios per model": (
        {m: set(r) for m, r in spec.ASPECT_RATIOS.items()},
        {m: set(r) for m, r in constants.ASPECT_RATIOS.items()},
    ),
    "default aspect ratio": (spec.DEFAULT_ASPECT_RATIO, constants.DEFAULT_ASPECT_RATIO),
    "image sizes": (set(spec.IMAGE_SIZES), set(constants.IMAGE_SIZES)),
    "default image size": (spec.DEFAULT_IMAGE_SIZE, constants.DEFAULT_IMAGE_SIZE),
    "images API sizes and their ratios": (spec.IMAGES_SIZES, constants.IMAGES_API_SIZES),
    "default images API size": (spec.DEFAULT_IMAGES_SIZE, constants.DEFAULT_IMAGES_API_SIZE),
    "X-Service-Max-Images bounds": (
        (spec.MAX_IMAGES_RANGE[0], spec.MAX_IMAGES_RANGE[-1]),
        (constants.MAX_IMAGES_MIN, constants.MAX_IMAGES_MAX),
    ),
    "input image mime types": (
        set(spec.INPUT_MIME_TYPES),
        set(get_args(models.InlineData.model_fields["mimeType"].annotation)),
    ),
    "upload size limit": (spec.MAX_UPLOAD_BYTES, constants.MAX_UPLOAD_BYTES),
    "default max_tokens": (spec.DEFAULT_MAX_TOKENS, constants.DEFAULT_MAX_TOKENS),
    "unsupported native part keys": (set(bodies.UNSUPPORTED_PART_KEYS), set(models.UNSUPPORTED_PART_KEYS)),
    "chat keys refused as misnested": (
        set(bodies.CHAT_MISNESTED_KEYS),
        set(compat_models.CHAT_MISNESTED_KEYS),
    ),
    "chat keys refused as unsupported": (
        set(bodies.CHAT_UNSUPPORTED_KEYS),
        set(compat_models.CHAT_UNSUPPORTED_KEYS),
    ),
}


@pytest.mark.parametrize("rule", TABLES)
def test_the_two_readings_agree_on_each_table(rule: str) -> None:
    emulator, client = TABLES[rule]
    assert emulator == client, f"{rule}: the emulator reads {emulator!r}, the client {client!r}"


MODELS = [*constants.IMAGE_MODELS, *spec.IMAGE_MODELS, "some-text-model", "native-image-3"]


@pytest.mark.parametrize("route", list(Route))
def test_each_route_serves_and_refuses_the_same_models_with_the_same_code(route: Route) -> None:
    for model in sorted(set(MODELS)):
        said = spec.refusal(route, model)
        client = constants.model_refusal(route, model)
        emulator_code = None if said is None else said[1]
        client_code = None if client is None else client[0]
        assert emulator_code == client_code, f"model {model} on {route}: emulator {said}, client {client}"


def _accepts(validate: Any, *args: Any) -> bool:
    try:
        validate(*args)
    except ValidationError:
        return False
    return True


def _native(ratio: str | None = None, size: str | None = None, mime: str = "image/png") -> dict[str, Any]:
    config = {k: v for k, v in (("aspectRatio", ratio), ("imageSize", size)) if v is not None}
    parts: list[dict[str, Any]] = [
        {"text": "a fox"},
        {"inlineData": {"mimeType": mime, "data": b64(png(8, 8))}},
    ]
    return {"contents": [{"parts": parts}], "generationConfig": {"imageConfig": config}}


ALL_RATIOS = sorted({r for rs in constants.ASPECT_RATIOS.values() for r in rs} | {"2:1", "1:1 ", "16/9"})


@pytest.mark.parametrize("model", constants.NATIVE_MODELS)
def test_native_bodies_aspect_ratio_rule_agrees_per_model(model: str) -> None:
    for ratio in ALL_RATIOS:
        emulator = _accepts(bodies.native_request, _native(ratio=ratio), model)
        client = _accepts(models.validate_native_request, _native(ratio=ratio), model)
        assert emulator == client, f"ratio {ratio} for {model}: emulator accepts={emulator}, client={client}"


@pytest.mark.parametrize(
    ("rule", "body"),
    [
        *[(f"image size {s!r}", _native(size=s)) for s in ("1K", "2K", "4K", "1k", "8K", "")],
        *[(f"inline mime type {m!r}", _native(mime=m)) for m in ("image/png", "image/jpeg", "image/webp")],
        (
            "candidateCount 2",
            {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}},
        ),
        ("root-level n", {"contents": [{"parts": [{"text": "x"}]}], "n": 1}),
        ("empty parts", {"contents": [{"parts": []}]}),
    ],
)
def test_native_body_rules_agree(rule: str, body: dict[str, Any]) -> None:
    emulator = _accepts(bodies.native_request, body, "native-image-2")
    client = _accepts(models.validate_native_request, body, "native-image-2")
    assert emulator == client, f"{rule}: emulator accepts={emulator}, client={client}"


IMAGES_SIZES = sorted({*constants.IMAGES_API_SIZES, *spec.IMAGES_SIZES, "512x512", "1024X1024"})


@pytest.mark.parametrize("size", IMAGES_SIZES)
def test_images_request_size_rule_agrees(size: str) -> None:
    body = {"model": "compat-image-2", "prompt": "a fox", "size": size}
    emulator = _accepts(bodies.ImagesRequest.model_validate, body)
    client = _accepts(compat_models.ImagesRequest.model_validate, body)
    assert emulator == client, f"images size {size!r}: emulator accepts={emulator}, client={client}"


CHAT_CASES = {
    "chat n 2": {"n": 2},
    "chat stream true": {"stream": True},
    "chat ratio 8:1 on native-image-pro": {"native": {"image_config": {"aspect_ratio": "8:1"}}},
    "chat size 1k": {"native": {"image_config": {"image_size": "1k"}}},
    "chat misnested imageConfig": {"imageConfig": {}},
    "chat tools": {"tools": []},
}


@pytest.mark.parametrize("rule", CHAT_CASES)
def test_chat_body_rules_agree(rule: str) -> None:
    body = {
        "model": "native-image-pro",
        "messages": [{"role": "user", "content": "a fox"}],
        **CHAT_CASES[rule],
    }
    emulator = _accepts(bodies.ChatRequest.model_validate, body)
    client = _accepts(compat_models.ChatRequest.model_validate, body)
    assert emulator == client, f"{rule}: emulator accepts={emulator}, client={client}"


@pytest.mark.parametrize("max_tokens", [0, 1, 1024, -1, 1.5, True])
def test_messages_max_tokens_rule_agrees(max_tokens: Any) -> None:
    body = {"model": "t", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
    emulator = _accepts(bodies.MessagesRequest.model_validate, body)
    client = _accepts(compat_models.MessagesRequest.model_validate, body)
    assert emulator == client, f"max_tokens {max_tokens!r}: emulator accepts={emulator}, client={client}"


SOURCE = ImageInfo("image/png", 32, 32, has_alpha=False)
MASKS = {
    "mask with alpha, same size": ImageInfo("image/png", 32, 32, has_alpha=True),
    "mask without alpha": ImageInfo("image/png", 32, 32, has_alpha=False),
    "mask of another size": ImageInfo("image/png", 16, 32, has_alpha=True),
    "mask of another format": ImageInfo("image/jpeg", 32, 32, has_alpha=True),
}


@pytest.mark.parametrize("rule", MASKS)
def test_mask_rules_agree(rule: str) -> None:
    emulator_refuses = spec.mask_refusal(MASKS[rule], SOURCE) is not None
    client_refuses = bool(mask_problems(MASKS[rule], SOURCE))
    assert emulator_refuses == client_refuses, f"{rule}: emulator refuses={emulator_refuses}"
