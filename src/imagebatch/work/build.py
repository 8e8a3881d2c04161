"""From a planned request to a request on the wire: each input image read once, checked against the hash
its idempotency key was made from, and handed to the route's builder in `imagebatch.gateway.requests`.

A file changed after the manifest was checked would be sent under a key that names other bytes; that is
refused (`InputChangedError`) rather than sent, and so is one that is no longer a regular file or has grown
past the most any route takes (the read is bounded, as at check time: `manifest.files.read_reference`).
An object in a store (`s3://...`) is read again the same way, through the store, and compared the same. The
request is then recorded `failed` with that message; nothing was sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imagebatch.gateway import ImageUpload, requests
from imagebatch.gateway.constants import Route
from imagebatch.gateway.imagefile import sniff_mime
from imagebatch.gateway.requests import GatewayRequest
from imagebatch.manifest import PlannedRequest
from imagebatch.manifest.files import READ_LIMIT, InputFileError, read_reference
from imagebatch.manifest.models import FileRef


class InputChangedError(Exception):
    """A reference image or mask changed since the manifest was checked (its key names other bytes), or
    can no longer be read as one (gone, not a regular file, grown too big)."""


def read_input(path: FileRef, sha256: str | None) -> ImageUpload:
    """Read an input image once (a bounded read of a regular file, or of an object in a store); refuse it
    when its bytes are not those the plan hashed."""
    try:
        data = read_reference(path, READ_LIMIT)
    except (InputFileError, OSError) as exc:
        why = str(exc) if isinstance(exc, InputFileError) else exc.strerror or type(exc).__name__
        raise InputChangedError(
            f"{path} changed after the manifest was checked ({why}): rerun to check it again"
        ) from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise InputChangedError(f"{path} changed after the manifest was checked: rerun to plan it again")
    name = path.name if isinstance(path, Path) else path.rsplit("/", 1)[-1]
    return ImageUpload(data=data, filename=name, mime_type=sniff_mime(data) or "image/png")


def inputs(req: PlannedRequest) -> tuple[list[ImageUpload], ImageUpload | None]:
    """The request's reference images and mask, read once each."""
    hashes: Sequence[str | None] = req.reference_sha256 or [None] * len(req.reference_images)
    images = [read_input(p, h) for p, h in zip(req.reference_images, hashes, strict=True)]
    mask = read_input(req.mask, req.mask_sha256) if req.mask else None
    return images, mask


def build_request(req: PlannedRequest, history: Sequence[Mapping[str, Any]] = ()) -> GatewayRequest:
    """The wire request of `req`; `history` is an edit chain's earlier turns (native route only)."""
    route, model, prompt = req.route, req.model, req.prompt
    if route is Route.NATIVE:
        images, _ = inputs(req)
        return requests.native(
            model,
            prompt,
            images=images,
            history=history,
            image_size=req.image_size,
            aspect_ratio=req.aspect_ratio,
            max_images=req.max_images,
        )
    if route is Route.CHAT:
        return requests.chat(
            model, prompt, image_size=req.image_size, aspect_ratio=req.aspect_ratio, max_images=req.max_images
        )
    if route is Route.IMAGES_GENERATIONS:
        return requests.images_generation(prompt, model=model, size=req.size)
    if route is Route.IMAGES_EDITS:
        images, mask = inputs(req)
        return requests.images_edit(prompt, images, mask=mask, model=model, size=req.size)
    if route is Route.MESSAGES:
        return requests.messages(model, prompt, max_tokens=req.max_tokens)
    return requests.responses(model, prompt)
