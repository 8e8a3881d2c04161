"""The gateway service, emulated: a FastAPI app (`create_app`) that behaves as the spec
(docs/spec/service-interface.md) says the service does, served in a thread (`EmulatorServer`) or on its own
(`imagebatch emulator`, see `serve`).

docs/emulator.md (the manual's page "The emulator") lists the choices made where the spec is silent.
"""

from __future__ import annotations

from .app import EmulatorApp, create_app
from .render import images_pixel_size, native_pixel_size
from .server import EmulatorServer
from .settings import EmulatorSettings, FaultConfig, ScriptedFault
from .state import EmulatorState, LedgerEntry, RequestLogEntry

__all__ = [
    "EmulatorApp",
    "EmulatorServer",
    "EmulatorSettings",
    "EmulatorState",
    "FaultConfig",
    "LedgerEntry",
    "RequestLogEntry",
    "ScriptedFault",
    "create_app",
    "images_pixel_size",
    "native_pixel_size",
]
