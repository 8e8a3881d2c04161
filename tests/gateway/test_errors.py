"""The error tree, the reading of error bodies (`error.message`, then `message`, then status text)."""

from __future__ import annotations

import json

import pytest

from imagebatch.gateway.errors import (
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    GatewayError,
    InsufficientFundsError,
    NotFoundError,
    OutcomeUnknownError,
    RateLimitError,
    RequestValidationError,
    ResponseFormatError,
    ServerError,
    ServiceUnreachableError,
    UnsupportedEndpointError,
    error_for_status,
    parse_error_body,
    redact,
)


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    ("status", "content", "expected"),
    [
        (400, body({"error": {"message": "A", "type": "t", "code": "c"}, "message": "B"}), ("A", "c", "t")),
        (400, body({"error": {"type": "t", "code": "c"}, "message": "B"}), ("B", "c", "t")),
        (400, body({"error": {"message": "", "code": "c"}, "message": "B"}), ("B", "c", None)),
        (400, body({"error": {"message": 5}, "message": "B"}), ("B", None, None)),
        (400, body({"error": "flat string", "message": "B"}), ("B", None, None)),
        (429, body({"message": "B"}), ("B", None, None)),
        (400, body({"error": {"code": "invalid_request"}}), ("Bad Request", "invalid_request", None)),
        (402, body({}), ("Payment Required", None, None)),
        (404, body(["not", "an", "object"]), ("Not Found", None, None)),
        (502, b"<html>Bad gateway</html>", ("Bad Gateway", None, None)),
        (500, b"", ("Internal Server Error", None, None)),
        (503, b"\xff\xfe binary", ("Service Unavailable", None, None)),
        (599, b"", ("HTTP 599", None, None)),
    ],
)
def test_message_precedence(
    status: int, content: bytes, expected: tuple[str, str | None, str | None]
) -> None:
    assert parse_error_body(status, content) == expected


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, None, BadRequestError),
        (400, "invalid_request", BadRequestError),
        (400, "unsupported_endpoint", UnsupportedEndpointError),
        (401, None, AuthenticationError),
        (402, None, InsufficientFundsError),
        (404, None, NotFoundError),
        (429, None, RateLimitError),
        (500, None, ServerError),
        (502, None, ServerError),
        (503, None, ServerError),
        (599, None, ServerError),
        (408, None, APIStatusError),
        (409, None, APIStatusError),
        (401, "unsupported_endpoint", AuthenticationError),
    ],
)
def test_status_maps_to_one_class(status: int, code: str | None, cls: type[APIStatusError]) -> None:
    exc = error_for_status(
        status, body({"error": {"message": "m", "code": code}}), request_id="r", attempts=2
    )
    assert type(exc) is cls
    assert (exc.status_code, exc.code, exc.message, exc.request_id, exc.attempts) == (
        status,
        code,
        "m",
        "r",
        2,
    )


def test_str_of_a_status_error() -> None:
    exc = error_for_status(400, body({"error": {"message": "bad size", "code": "invalid_request"}}))
    assert str(exc) == "HTTP 400 invalid_request: bad size"
    assert str(error_for_status(503, b"")) == "HTTP 503: Service Unavailable"


def test_tree() -> None:
    for cls in (
        ConfigurationError,
        RequestValidationError,
        ServiceUnreachableError,
        ResponseFormatError,
        OutcomeUnknownError,
        APIStatusError,
    ):
        assert issubclass(cls, GatewayError)
    assert issubclass(UnsupportedEndpointError, BadRequestError)
    for cls in (AuthenticationError, InsufficientFundsError, NotFoundError, RateLimitError, ServerError):
        assert issubclass(cls, APIStatusError) and not issubclass(cls, BadRequestError)


SECRET = "sk-abcdef0123456789"


@pytest.mark.parametrize(
    "error",
    [
        {"message": f"bad key {SECRET}"},
        {"code": f"key_{SECRET}", "message": "x"},
        {"type": SECRET, "message": "x"},
    ],
)
def test_secret_is_redacted_from_every_field(error: dict[str, str]) -> None:
    exc = error_for_status(401, body({"error": error}), secret=SECRET)
    for text in (str(exc), repr(exc), exc.message, str(exc.code), str(exc.error_type), *map(str, exc.args)):
        assert SECRET not in text


def test_top_level_message_is_redacted() -> None:
    exc = error_for_status(401, body({"message": f"{SECRET} rejected"}), secret=SECRET)
    assert exc.message == "[redacted] rejected"


@pytest.mark.parametrize(
    ("text", "secret", "expected"),
    [
        (f"a {SECRET} b {SECRET}", SECRET, "a [redacted] b [redacted]"),
        ("nothing here", SECRET, "nothing here"),
        ("empty secret", "", "empty secret"),
        ("no secret", None, "no secret"),
    ],
)
def test_redact(text: str, secret: str | None, expected: str) -> None:
    assert redact(text, secret) == expected


def test_redaction_leaves_base64_image_data_whole_even_for_a_short_key() -> None:
    from helpers.images import b64, jpeg, png

    from imagebatch.gateway.redaction import redact_json

    image, photo = b64(png()), b64(jpeg())
    key = image[-30:-28]  # a short key that the image's base64 happens to contain
    body = {"parts": [{"inlineData": {"mimeType": "image/png", "data": image}, "text": f"{key} said"}],
            "data": [{"b64_json": photo}]}  # fmt: skip
    clean = redact_json(body, key)
    assert clean["parts"][0]["inlineData"]["data"] == image and clean["data"][0]["b64_json"] == photo
    assert clean["parts"][0]["text"] == "[redacted] said"
