"""The images routes for `compat-image-2`: `POST /v1/images/generations` (JSON) and
`POST /v1/images/edits` (multipart, with reference images and an optional mask)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile
from starlette.responses import Response

from imagebatch.gateway.constants import Route
from imagebatch.gateway.imagefile import ImageInfo, NotAnImageError, inspect_image

from .bodies import ImagesRequest
from .chance import digest
from .deps import EmulatorDep, JsonBodyDep, RecordDep, bearer_auth, mark_route
from .errors import ServiceError
from .generation import Attempt, b64, begin, finish, no_query, render, text_tokens, validate
from .render import RenderSpec, images_pixel_size
from .spec import MAX_UPLOAD_BYTES, mask_refusal
from .state import EmulatorState, RequestLogEntry

router = APIRouter(tags=["images"])

IMAGE_OUTPUT_TOKENS = 1056
INPUT_IMAGE_TOKENS = 194
FILE_FIELDS = ("image", "image[]", "mask", "mask[]")


def _usage(prompt: str, input_images: int, output_images: int) -> dict[str, Any]:
    text = text_tokens(prompt)
    image_in = INPUT_IMAGE_TOKENS * input_images
    output = IMAGE_OUTPUT_TOKENS * output_images
    return {
        "total_tokens": text + image_in + output,
        "input_tokens": text + image_in,
        "output_tokens": output,
        "input_tokens_details": {"text_tokens": text, "image_tokens": image_in},
    }


async def _generate(
    emu: EmulatorState,
    record: RequestLogEntry,
    attempt: Attempt,
    params: ImagesRequest,
    references: tuple[bytes, ...] = (),
    mask: bytes | None = None,
) -> Response:
    if attempt.fault == "no_image":
        # This route has no 200 without an image (data[0].b64_json is the answer), so a refused image
        # is a 400 content-policy error, as images APIs of this kind answer; nothing is billed.
        raise ServiceError(
            400, "the request was rejected by the safety system (emulated fault)", "content_policy_violation"
        )
    width, height = images_pixel_size(params.size)
    spec = RenderSpec(
        width, height, params.prompt, emu.settings.seed, label=params.model, references=references, mask=mask
    )
    _, data = await render(emu, spec)
    usage = _usage(params.prompt, len(references), 1)
    answer = {
        "created": int(time.time()),
        "data": [{"b64_json": b64(data), "revised_prompt": f"{params.prompt} (rendered by the emulator)"}],
        "usage": usage,
        "size": f"{width}x{height}",
        "output_format": "png",
    }
    return await finish(emu, record, attempt, JSONResponse(answer), images=1, usage=usage)


@router.post(
    "/v1/images/generations",
    dependencies=[Depends(mark_route(Route.IMAGES_GENERATIONS)), Depends(bearer_auth), Depends(no_query)],
)
async def images_generations(
    request: Request,
    emu: EmulatorDep,
    record: RecordDep,
    body: JsonBodyDep,
) -> Response:
    params = validate(ImagesRequest, body)
    attempt = await begin(
        emu, record, route=Route.IMAGES_GENERATIONS, model=params.model, prompt=params.prompt,
        fingerprint=await request.body(),
    )  # fmt: skip
    return await _generate(emu, record, attempt, params)


def _single(fields: dict[str, list[Any]], name: str) -> Any:
    values = fields.get(name, [])
    if len(values) > 1:
        raise ServiceError(400, f"field {name!r} was sent {len(values)} times; send it once")
    return values[0] if values else None


async def _read_file(upload: UploadFile, label: str) -> tuple[bytes, ImageInfo]:
    """The bytes and facts of one uploaded file; 400 if 50 MB or more, or not a PNG/JPEG by its bytes."""
    if upload.size is not None and upload.size >= MAX_UPLOAD_BYTES:
        raise ServiceError(400, f"{label} is {upload.size} bytes; each file must be under 50 MB")
    data = await upload.read()
    if len(data) >= MAX_UPLOAD_BYTES:
        raise ServiceError(400, f"{label} is {len(data)} bytes; each file must be under 50 MB")
    try:
        return data, inspect_image(data)
    except NotAnImageError as exc:
        # The spec limits input types only on the native route; refusing other types (WebP, GIF, ...)
        # here too is a deliberate, conservative choice (README, "Choices where the spec is silent").
        raise ServiceError(400, f"{label}: {exc}; this route takes PNG or JPEG files") from None


async def _parse_edit_form(
    form: Any,
) -> tuple[ImagesRequest, dict[str, Any], tuple[bytes, ...], bytes | None]:
    """Check the multipart fields of an edit; return (parameters, text fields, references, mask)."""
    texts: dict[str, list[str]] = defaultdict(list)
    files: dict[str, list[UploadFile]] = defaultdict(list)
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            files[name].append(value)
        else:
            texts[name].append(value)

    # Text fields first: they decide the model (404 / unsupported_endpoint) before files are looked at.
    for name in texts:
        if name in FILE_FIELDS:
            raise ServiceError(400, f"field {name!r} must be a file")
    for name in files:
        if name not in FILE_FIELDS:
            raise ServiceError(400, f"unexpected file field {name!r}; files go in image, image[] or mask")
    fields: dict[str, Any] = {name: _single(texts, name) for name in texts}
    if isinstance(fields.get("n"), str) and fields["n"].strip().isdigit():
        fields["n"] = int(fields["n"])  # multipart carries every value as text
    params = validate(ImagesRequest, fields)

    if files.get("mask[]"):
        raise ServiceError(400, "mask[] is not accepted: send exactly one file in the field 'mask'")
    if files.get("image") and files.get("image[]"):
        raise ServiceError(
            400, "send the reference images either as 'image' or as repeated 'image[]', not both"
        )
    if len(files.get("image", [])) > 1:
        raise ServiceError(400, "field 'image' takes one file; repeat 'image[]' for several")
    field = "image" if files.get("image") else "image[]"
    uploads = files.get(field, [])
    if not uploads:
        raise ServiceError(400, "missing required field 'image' (or 'image[]'): at least one reference image")
    read = [
        await _read_file(u, "image" if field == "image" else f"image[{i}]") for i, u in enumerate(uploads)
    ]

    mask_upload = _single(files, "mask")
    mask: bytes | None = None
    if mask_upload is not None:
        mask, mask_info = await _read_file(mask_upload, "mask")
        problem = mask_refusal(mask_info, read[0][1])
        if problem:
            raise ServiceError(400, problem)
    return params, fields, tuple(data for data, _ in read), mask


@router.post(
    "/v1/images/edits",
    dependencies=[Depends(mark_route(Route.IMAGES_EDITS)), Depends(bearer_auth), Depends(no_query)],
)
async def images_edits(
    request: Request,
    emu: EmulatorDep,
    record: RecordDep,
) -> Response:
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "multipart/form-data":
        raise ServiceError(
            400, f"the edits route takes multipart/form-data, not {media_type or 'no content type'!r}"
        )
    # The context manager closes the spooled upload files as soon as their bytes are read.
    async with request.form() as form:
        params, fields, references, mask = await _parse_edit_form(form)
    fingerprint = digest(sorted(fields.items()), *(digest(r) for r in references), digest(mask or b""))
    attempt = await begin(
        emu,
        record,
        route=Route.IMAGES_EDITS,
        model=params.model,
        prompt=params.prompt,
        fingerprint=fingerprint,
    )
    return await _generate(emu, record, attempt, params, references, mask)
