"""The gateway service, emulated: a FastAPI app (`create_app`) that behaves as the spec
(docs/spec/service-interface.md) says the service does, served in a thread (`EmulatorServer`) or in the
foreground (`serve`, the body of `imagebatch emulator`). It reads requests by its own reading of the spec
(`spec`, `bodies`), never with the client's models, so that a rule the two read differently fails a test.

docs/emulator.md (the manual's page "The emulator") lists the choices made where the spec is silent.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import EmulatorApp, create_app
    from .render import images_pixel_size, native_pixel_size
    from .server import EmulatorServer
    from .settings import EmulatorSettings, FaultConfig, ScriptedFault
    from .state import EmulatorState, LedgerEntry, RequestLogEntry

# Imported when first used, not with the package: the command's parser reads the emulator's settings
# (`emulator.settings`) without loading FastAPI and the app (bench/README.md, "Redesign").
_WHERE = {
    "EmulatorApp": ".app",
    "create_app": ".app",
    "images_pixel_size": ".render",
    "native_pixel_size": ".render",
    "EmulatorServer": ".server",
    "EmulatorSettings": ".settings",
    "FaultConfig": ".settings",
    "ScriptedFault": ".settings",
    "EmulatorState": ".state",
    "LedgerEntry": ".state",
    "RequestLogEntry": ".state",
}


def __getattr__(name: str) -> Any:
    """The package's names, each imported from its module when first asked for."""
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
