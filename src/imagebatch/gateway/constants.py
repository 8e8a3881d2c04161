"""Every tunable number and every fixed value the spec gives, in one place, and the names of the
environment variables imagebatch reads (the lowest module every room may import).

The client and the manifest checker read these; the emulator keeps its own reading of the spec's rules
(`emulator.spec`), compared with this one by tests/emulator/test_spec_agreement.py.
"""

from __future__ import annotations

from enum import StrEnum


class Route(StrEnum):
    """The six routes of the service."""

    NATIVE = "native"
    CHAT = "chat"
    IMAGES_GENERATIONS = "images_generations"
    IMAGES_EDITS = "images_edits"
    MESSAGES = "messages"
    RESPONSES = "responses"

    @property
    def path(self) -> str:
        return ROUTE_PATHS[self]

    @property
    def generates_images(self) -> bool:
        return self in IMAGE_ROUTES


ROUTE_PATHS: dict[Route, str] = {
    Route.NATIVE: "/v1beta/models/{model}:generateContent",
    Route.CHAT: "/v1/chat/completions",
    Route.IMAGES_GENERATIONS: "/v1/images/generations",
    Route.IMAGES_EDITS: "/v1/images/edits",
    Route.MESSAGES: "/v1/messages",
    Route.RESPONSES: "/v1/responses",
}
IMAGE_ROUTES = frozenset({Route.NATIVE, Route.CHAT, Route.IMAGES_GENERATIONS, Route.IMAGES_EDITS})
TEXT_ROUTES = frozenset({Route.MESSAGES, Route.RESPONSES})

# --- models and what each one can do -------------------------------------------------------------
NATIVE_MODELS: tuple[str, ...] = ("native-image-pro", "native-image-2", "native-image-2.1")
DEFAULT_NATIVE_MODEL = "native-image-2.1"
COMPAT_IMAGE_MODEL = "compat-image-2"
IMAGE_MODELS: tuple[str, ...] = (*NATIVE_MODELS, COMPAT_IMAGE_MODEL)

# Which route serves which model: the client's one table of that rule (request models, client and the
# manifest checker all ask `serves` or `model_refusal`). The text routes relay any model of the service's
# catalog, which the spec does not list: every model that is not an image model.
ROUTE_MODELS: dict[Route, tuple[str, ...] | None] = {
    Route.NATIVE: NATIVE_MODELS,
    Route.CHAT: NATIVE_MODELS,
    Route.IMAGES_GENERATIONS: (COMPAT_IMAGE_MODEL,),
    Route.IMAGES_EDITS: (COMPAT_IMAGE_MODEL,),
    Route.MESSAGES: None,
    Route.RESPONSES: None,
}


def serves(route: Route, model: str | None) -> bool:
    """Whether the service serves `model` on `route`."""
    allowed = ROUTE_MODELS[route]
    if allowed is None:
        return bool(model) and model not in IMAGE_MODELS
    return model in allowed


def model_refusal(route: Route, model: str) -> tuple[str, str] | None:
    """How the service refuses `model` on `route`, as (error code, message), or None when it serves it.

    The codes follow the spec where it speaks: a native model on an images route is `unsupported_endpoint`
    (400); the others are the emulator's documented choices: a public image model on the wrong route is
    `invalid_request` (400), a model outside the set is `model_not_found` (404).
    """
    if serves(route, model):
        return None
    if route in (Route.IMAGES_GENERATIONS, Route.IMAGES_EDITS) and model in NATIVE_MODELS:
        why = f"model {model} is not supported on the images routes; use generateContent"
        return "unsupported_endpoint", why
    if route is Route.CHAT and model == COMPAT_IMAGE_MODEL:
        return "invalid_request", f"model {model} is served on the images routes, not chat"
    if ROUTE_MODELS[route] is None:
        return "model_not_found", f"model {model} is an image model, not a text model"
    allowed = ROUTE_MODELS[route] or ()
    what = "a native image model" if allowed == NATIVE_MODELS else f"served on the {route} route"
    return "model_not_found", f"model {model!r} is not {what} (models: {', '.join(allowed)})"


BASE_ASPECT_RATIOS: tuple[str, ...] = (
    "1:1", "2:3", "3:2", "3:4", "4:3", "4:5", "5:4", "9:16", "16:9", "21:9",
)  # fmt: skip
EXTENDED_ASPECT_RATIOS: tuple[str, ...] = (*BASE_ASPECT_RATIOS, "1:4", "4:1", "1:8", "8:1")
ASPECT_RATIOS: dict[str, tuple[str, ...]] = {
    "native-image-pro": BASE_ASPECT_RATIOS,
    "native-image-2": EXTENDED_ASPECT_RATIOS,
    "native-image-2.1": EXTENDED_ASPECT_RATIOS,
}
DEFAULT_ASPECT_RATIO = "1:1"
IMAGE_SIZES: tuple[str, ...] = ("1K", "2K", "4K")  # case-sensitive
DEFAULT_IMAGE_SIZE = "1K"

# Images API sizes and their nominal ratio (None: the server chooses).
IMAGES_API_SIZES: dict[str, str | None] = {
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
DEFAULT_IMAGES_API_SIZE = "1024x1024"

# --- limits ---------------------------------------------------------------------------------------
MAX_IMAGES_HEADER = "X-Service-Max-Images"
MAX_IMAGES_MIN, MAX_IMAGES_MAX = 1, 4
# "each under 50 MB": we read MB as 10**6 bytes, the stricter reading, so a file the client accepts is
# never one the service refuses.
MAX_UPLOAD_BYTES = 50 * 1000 * 1000
DEFAULT_MAX_TOKENS = 1024

# --- auth -----------------------------------------------------------------------------------------
NATIVE_KEY_HEADER = "x-native-api-key"
MESSAGES_KEY_HEADER = "x-api-key"
COMPAT_VERSION_HEADER = "compat-version"
DEFAULT_COMPAT_VERSION = "imagebatch/2.0.76 (external, cli)"
IDEMPOTENCY_HEADER = "Idempotency-Key"
REQUEST_ID_HEADER = "x-request-id"

# --- timeouts (seconds) ---------------------------------------------------------------------------
IMAGE_TIMEOUT = 650.0
TEXT_TIMEOUT = 3000.0
CONNECT_TIMEOUT = 30.0

# --- retries --------------------------------------------------------------------------------------
RETRY_DELAYS: tuple[float, ...] = (3.0, 8.0, 15.0)
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})  # plus every 5xx

# --- imagebatch's environment variables -----------------------------------------------------------
ENV_API_KEY = "IMAGEBATCH_API_KEY"
"""The service's API key: of a run without a Secret block, and the emulator's without `--api-key`."""
ENV_BASE_URL = "IMAGEBATCH_BASE_URL"
"""The service root of a run without `--base-url` (neither: the embedded emulator)."""
ENV_PRICES = "IMAGEBATCH_PRICES"
"""The price table of a run without `--prices`."""
ENV_REVIEWER = "IMAGEBATCH_REVIEWER"
"""The reviewer's name `imagebatch review` records without `--reviewer` (neither: the login name)."""
ENV_HEARTBEAT_WINDOW = "IMAGEBATCH_HEARTBEAT_WINDOW"
"""The heartbeat automation's window, in seconds, when deploying (`platform.deploy.heartbeat_window`)."""

# --- the object stores' own variables (their standard credential chains) ----------------------------------
STORE_VARIABLE_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_")
"""The prefixes of the variables a store reads its address and credentials from."""
STORE_SECRETS = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_SECRET",
)
"""The variables of the stores' standard credential chains that hold a secret: a process that imagebatch
starts itself (a shard the parent runs) gets them on its stdin, never in its environment."""
AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"
"""An S3-compatible server's address (MinIO, R2, a local one): its objects have no AWS console page."""
AWS_REGIONS = ("AWS_REGION", "AWS_DEFAULT_REGION")
"""Where S3's region is named, in the order the AWS SDKs read them."""

STORE_ENDPOINTS = {
    "s3": ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3"),
    "gs": ("GOOGLE_BASE_URL",),
    "az": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT"),
}
"""The variables a store's client reads its server's address from (obstore's names, by scheme)."""
