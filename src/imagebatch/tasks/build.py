"""From a planned request to a request on the wire: each input image read once, checked against the hash
its idempotency key was made from, and handed to the route's builder in `imagebatch.gateway.requests`.

A file changed after the manifest was checked would be sent under a key that names other bytes; that is
refused (`InputChangedError`) rather than sent.
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


class InputChangedError(Exception):
    """A reference image or mask changed since the manifest was checked (its key names other bytes)."""


def read_input(path: Path, sha256: str | None) -> ImageUpload:
    """Read an input image once; refuse it when its bytes are not those the plan hashed."""
    data = path.read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise InputChangedError(f"{path} changed after the manifest was checked: rerun to plan it again")
    return ImageUpload(data=data, filename=path.name, mime_type=sniff_mime(data) or "image/png")


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
