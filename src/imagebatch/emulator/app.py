"""`create_app(settings)`: the emulated service as a FastAPI app, one router per group of routes."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp

from . import admin, chat, images, native, text
from .edge import EdgeMiddleware
from .errors import install_error_handlers
from .settings import EmulatorSettings, ServerLimits
from .state import EmulatorState


class EmulatorApp(FastAPI):
    """A FastAPI app whose outermost layer is `EdgeMiddleware` (outside Starlette's error middleware, so
    that even framework-made answers get a request id and a request-log entry)."""

    def __init__(self, state: EmulatorState, limits: ServerLimits, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.state.emulator = state
        self.limits = limits

    @property
    def emulator(self) -> EmulatorState:
        state: EmulatorState = self.state.emulator
        return state

    def build_middleware_stack(self) -> ASGIApp:
        return EdgeMiddleware(super().build_middleware_stack(), self.emulator, self.limits)


def create_app(settings: EmulatorSettings, limits: ServerLimits | None = None) -> EmulatorApp:
    """Build an emulator app with its own state (ledger, faults, signer, render cache); `limits` bound
    request bodies (the defaults of `ServerLimits` if None)."""
    app = EmulatorApp(
        EmulatorState(settings),
        limits or ServerLimits(),
        title="imagebatch gateway emulator",
        # The service has no docs pages; leaving FastAPI's on would answer paths the service 404s.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        # The service does not redirect `/v1/messages/` to `/v1/messages`: a wrong path is a 404.
        redirect_slashes=False,
    )
    install_error_handlers(app)
    for group in (native, chat, images, text, admin):
        app.include_router(group.router)
    return app
