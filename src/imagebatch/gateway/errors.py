"""The exception tree of the gateway client (drawn on `GatewayError`: one class per meaningful status,
mapped by `error_for_status`), and the reading of the service's error body: `error.message`, then top-level
`message`, then the status text. No message carries the API key: `redaction.redact` removes it first.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from .redaction import redact


class GatewayError(Exception):
    """Base of every error the gateway client raises::

    GatewayError                    anything the client raises
    ├── ConfigurationError          a base URL or option the client cannot use (raised before sending)
    ├── RequestValidationError      a request body that breaks the spec's rules (raised before sending)
    ├── ServiceUnreachableError     the connection could not be made: nothing was sent
    ├── ResponseFormatError         a success status whose body is not what the spec describes
    ├── OutcomeUnknownError         no answer once sent: timeout, dropped connection (never resent)
    └── APIStatusError              the service answered with an error status
        ├── BadRequestError             400
        │   └── UnsupportedEndpointError    400, code `unsupported_endpoint`
        ├── AuthenticationError         401
        ├── InsufficientFundsError      402
        ├── NotFoundError               404
        ├── RateLimitError              429
        └── ServerError                 5xx
    """

    may_have_been_billed: bool = False
    """True when some attempt may have generated (and been charged for) the request: an attempt got no
    answer, the service answered 200 with a body we could not read, or it answered 500 ("generation
    error; check the outcome before resending"). A caller must not resend such a request on its own."""

    def __init__(self, message: str, *, attempts: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = attempts


class ConfigurationError(GatewayError):
    """The client was given a base URL or option it cannot use."""


class RequestValidationError(GatewayError):
    """The request breaks the spec's rules; it was not sent."""

    def __init__(self, message: str, *, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.code = code


class ServiceUnreachableError(GatewayError):
    """The request could not be sent (connection refused, DNS, connect or pool timeout, a header httpx
    refuses to encode): this attempt reached nothing, so the images and text relay routes retry it on the
    schedule (`retry.was_never_sent`)."""


class ResponseFormatError(GatewayError):
    """A success status whose body is not what the spec describes (the generation was likely billed)."""

    may_have_been_billed = True

    def __init__(self, message: str, *, request_id: str | None = None, attempts: int = 0) -> None:
        super().__init__(message, attempts=attempts)
        self.request_id = request_id


class OutcomeUnknownError(GatewayError):
    """The request may have reached the service and got no answer (a read or write timeout, a connection
    dropped or reset after the request was written). It may have been generated and billed, so no route
    resends it on its own: its outcome is for the service's usage history to confirm."""

    may_have_been_billed = True


class APIStatusError(GatewayError):
    """The service answered with an error status."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        code: str | None = None,
        error_type: str | None = None,
        request_id: str | None = None,
        attempts: int = 0,
    ) -> None:
        super().__init__(message, attempts=attempts)
        self.status_code = status_code
        self.code = code
        self.error_type = error_type
        self.request_id = request_id

    def __str__(self) -> str:
        code = f" {self.code}" if self.code else ""
        return f"HTTP {self.status_code}{code}: {self.message}"


class BadRequestError(APIStatusError):
    """400: invalid parameters or an unsupported feature."""


class UnsupportedEndpointError(BadRequestError):
    """400 `unsupported_endpoint`: a native model sent to an images route."""


class AuthenticationError(APIStatusError):
    """401: the API key is missing or invalid."""


class InsufficientFundsError(APIStatusError):
    """402: the account has insufficient funds."""


class NotFoundError(APIStatusError):
    """404: wrong base address, wrong version prefix, or a model outside the public set."""


class RateLimitError(APIStatusError):
    """429: rate limit or service overload."""


class ServerError(APIStatusError):
    """5xx: a generation error; the outcome should be checked before resending."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    402: InsufficientFundsError,
    404: NotFoundError,
    429: RateLimitError,
}


class _Lenient(BaseModel):
    """Read what is there: a field of the wrong type counts as absent (a broken error body must still
    yield the best message it can)."""

    model_config = ConfigDict(extra="allow")

    @field_validator("*", mode="before")
    @classmethod
    def _right_type_or_absent(cls, v: Any, info: ValidationInfo) -> Any:
        wanted = (dict, BaseModel) if info.field_name == "error" else str
        return v if isinstance(v, wanted) else None


class ErrorDetail(_Lenient):
    message: str | None = None
    type: str | None = None
    """For example `invalid_request_error`."""
    code: str | None = None
    """For example `invalid_request` or `unsupported_endpoint`."""


class ErrorBody(_Lenient):
    """The spec's error body: `error` with `message`, `type`, `code`, and an optional top-level `message`.
    The client reads it (`parse_error_body`), the emulator writes it (`ErrorBody.of`)."""

    error: ErrorDetail | None = None
    message: str | None = None

    @classmethod
    def of(cls, message: str, error_type: str, code: str) -> ErrorBody:
        return cls(error=ErrorDetail(message=message, type=error_type, code=code), message=message)

    def best_message(self) -> str | None:
        """`error.message` first, then the top-level `message` (the spec's order)."""
        return (self.error.message if self.error else None) or self.message


def parse_error_body(status_code: int, content: bytes) -> tuple[str, str | None, str | None]:
    """Return (message, code, type) from an error response, by the spec's order of precedence."""
    try:
        body = ErrorBody.model_validate(json.loads(content)) if content else ErrorBody()
    except (ValueError, UnicodeDecodeError, ValidationError):
        body = ErrorBody()
    detail = body.error or ErrorDetail()
    message, code, error_type = body.best_message(), detail.code, detail.type
    if not message:
        try:
            message = HTTPStatus(status_code).phrase
        except ValueError:
            message = f"HTTP {status_code}"
    return message, code, error_type


def error_for_status(
    status_code: int,
    content: bytes,
    *,
    request_id: str | None = None,
    attempts: int = 0,
    secret: str | None = None,
) -> APIStatusError:
    """Map an error response to the one exception class that names its meaning."""
    message, code, error_type = parse_error_body(status_code, content)
    # `code` and `type` reach str(exc) and the logs too, so a key echoed there is removed as well.
    message = redact(message, secret)
    code = redact(code, secret) if code is not None else None
    error_type = redact(error_type, secret) if error_type is not None else None
    if status_code == 400 and code == "unsupported_endpoint":
        cls: type[APIStatusError] = UnsupportedEndpointError
    elif status_code >= 500:
        cls = ServerError
    else:
        cls = _BY_STATUS.get(status_code, APIStatusError)
    return cls(
        message,
        status_code=status_code,
        code=code,
        error_type=error_type,
        request_id=request_id,
        attempts=attempts,
    )
