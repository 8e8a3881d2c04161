"""The emulator's own reading of the spec's tables (docs/spec/service-interface.md): which model each route
serves, the ratios and sizes of each model, the images API's sizes, the bounds and the input types.

Written from the spec, not taken from the client's `gateway.constants`: were the two to share one table, a
wrong value would pass both the client and the emulator that tests it. tests/emulator/test_spec_agreement.py
compares this reading with the client's, rule by rule. What the emulator shares with the wire is vocabulary
only: the route names and paths (`Route`), header names and environment variables' names.
"""

from __future__ import annotations

from imagebatch.gateway.constants import Route
from imagebatch.gateway.imagefile import ImageInfo

# "Native image route ... for three models" (What the service does); "default `native-image-2.1`"
# (Endpoints, row 1).
NATIVE_MODELS: tuple[str, ...] = ("native-image-pro", "native-image-2", "native-image-2.1")
DEFAULT_NATIVE_MODEL = "native-image-2.1"
# "Images API routes ... serve model `compat-image-2`."
COMPAT_IMAGE_MODEL = "compat-image-2"
IMAGE_MODELS = frozenset({*NATIVE_MODELS, COMPAT_IMAGE_MODEL})

# Which models each route serves; None: the text relays, whose catalog the spec does not list (the
# emulator serves any model that is not one of the image models).
ROUTE_MODELS: dict[Route, frozenset[str] | None] = {
    Route.NATIVE: frozenset(NATIVE_MODELS),
    Route.CHAT: frozenset(NATIVE_MODELS),  # chat route: "One of the three native model IDs"
    Route.IMAGES_GENERATIONS: frozenset({COMPAT_IMAGE_MODEL}),
    Route.IMAGES_EDITS: frozenset({COMPAT_IMAGE_MODEL}),
    Route.MESSAGES: None,
    Route.RESPONSES: None,
}

# "Aspect ratios and sizes by model": ten ratios for the pro model, those ten and four more for the others.
_TEN = ("1:1", "2:3", "3:2", "3:4", "4:3", "4:5", "5:4", "9:16", "16:9", "21:9")
_FOURTEEN = (*_TEN, "1:4", "4:1", "1:8", "8:1")
ASPECT_RATIOS: dict[str, frozenset[str]] = {
    "native-image-pro": frozenset(_TEN),
    "native-image-2": frozenset(_FOURTEEN),
    "native-image-2.1": frozenset(_FOURTEEN),
}
DEFAULT_ASPECT_RATIO = "1:1"
IMAGE_SIZES = ("1K", "2K", "4K")  # "Case-sensitive `1K`, `2K`, `4K`; default `1K`"
DEFAULT_IMAGE_SIZE = "1K"

# The images API's `size` values and their nominal ratio (None: "auto", the server chooses).
IMAGES_SIZES: dict[str, str | None] = {
    "auto": None,
    "1024x1024": "1:1",
    "2048x2048": "1:1",
    "1536x1024": "3:2",
    "1024x1536": "2:3",
    "1536x1152": "4:3",
    "1152x1536": "3:4",
    "2048x1152": "16:9",
    "3840x2160": "16:9",
    "2160x3840": "9:16",
}
DEFAULT_IMAGES_SIZE = "1024x1024"

MAX_IMAGES_RANGE = range(1, 5)  # `X-Service-Max-Images`: "integer 1 to 4, default 1"
INPUT_MIME_TYPES = frozenset({"image/png", "image/jpeg"})  # "Image MIME types for input" (native route)
# "each under 50 MB": MB read as 10**6 bytes, the stricter reading (a file refused here is one the
# service might refuse).
MAX_UPLOAD_BYTES = 50 * 1000 * 1000
DEFAULT_MAX_TOKENS = 1024  # messages route: "At least 1; default 1024"


def refusal(route: Route, model: str) -> tuple[int, str, str] | None:
    """How the emulator refuses `model` on `route`, as (status, error code, message); None if served.

    The spec gives `unsupported_endpoint` (400) for a native model on an images route, and 404 for "a
    model ID outside the public set"; an image model of the set on another wrong route is the emulator's
    choice: `invalid_request` (400), as for any invalid parameter (docs/emulator.md).
    """
    allowed = ROUTE_MODELS[route]
    if allowed is None:
        if model and model not in IMAGE_MODELS:
            return None
        return 404, "model_not_found", f"model {model} is an image model, not a text model"
    if model in allowed:
        return None
    if route in (Route.IMAGES_GENERATIONS, Route.IMAGES_EDITS) and model in NATIVE_MODELS:
        return (
            400,
            "unsupported_endpoint",
            f"model {model} is not served on the images routes; use generateContent",
        )
    if route is Route.CHAT and model == COMPAT_IMAGE_MODEL:
        return 400, "invalid_request", f"model {model} is served on the images routes, not chat"
    return (
        404,
        "model_not_found",
        f"model {model!r} is not served on the {route} route ({', '.join(sorted(allowed))})",
    )


def mask_refusal(mask: ImageInfo, first: ImageInfo | None) -> str | None:
    """Why an edit's `mask` is refused, or None: it "must contain an alpha channel" and have the "same file
    format and pixel dimensions as the source image" (the first, with several `image[]`)."""
    if not mask.has_alpha:
        return "the mask has no alpha channel; transparent pixels mark the area to redraw"
    if first is not None and mask.mime_type != first.mime_type:
        return f"the mask is {mask.mime_type} but the first reference image is {first.mime_type}"
    if first is not None and (mask.width, mask.height) != (first.width, first.height):
        return (
            f"the mask is {mask.width}x{mask.height} but the first reference image is "
            f"{first.width}x{first.height}; they must be the same size"
        )
    return None
