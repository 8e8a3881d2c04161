"""Admin routes under `/emulator/`: read the ledger and request log, reset, change faults and settings.

Not part of the service: no API key, loopback clients only (others get a 404, as for any unknown path),
and never written to the request log, so reading the ledger does not count as a request to the service.
"""

from __future__ import annotations

from ipaddress import ip_address
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import ValidationError

from .deps import EmulatorDep, JsonBodyDep
from .errors import ServiceError
from .generation import validation_failure
from .settings import FaultConfig


def loopback_only(request: Request) -> None:
    host = request.client.host if request.client else ""
    try:
        loopback = ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ServiceError(404, f"no route {request.method} {request.url.path}")


router = APIRouter(prefix="/emulator", tags=["emulator admin"], dependencies=[Depends(loopback_only)])


@router.get("/ledger")
def get_ledger(
    emu: EmulatorDep, idempotency_key: Annotated[str | None, Query()] = None
) -> list[dict[str, Any]]:
    """Every billed generation, oldest first; optionally only those of one Idempotency-Key."""
    entries = emu.ledger()
    if idempotency_key is not None:
        entries = [e for e in entries if e["idempotency_key"] == idempotency_key]
    return entries


@router.get("/requests")
def get_requests(emu: EmulatorDep) -> list[dict[str, Any]]:
    """Every request received on a service path (admin routes excluded), oldest first."""
    return emu.requests()


@router.get("/attempts")
def get_attempts(emu: EmulatorDep) -> dict[str, int]:
    """Attempts counted so far, by Idempotency-Key (or body digest for requests without one)."""
    return emu.attempts()


@router.post("/reset")
def reset(emu: EmulatorDep) -> dict[str, Any]:
    """Clear ledger, request log and attempt counters; restore the startup settings and faults."""
    emu.reset()
    return {"reset": True, "settings": emu.settings.public_dict()}


@router.get("/faults")
def get_faults(emu: EmulatorDep) -> dict[str, Any]:
    return emu.settings.faults.model_dump(mode="json")


@router.put("/faults")
def put_faults(emu: EmulatorDep, body: JsonBodyDep) -> dict[str, Any]:
    """Replace the fault configuration (`{"rates": {...}, "scripts": [...]}`); counters are kept."""
    try:
        faults = FaultConfig.model_validate(body)
    except ValidationError as exc:
        raise validation_failure(exc) from None
    emu.set_faults(faults)
    return faults.model_dump(mode="json")


@router.get("/settings")
def get_settings(emu: EmulatorDep) -> dict[str, Any]:
    return emu.settings.public_dict()


@router.patch("/settings")
def patch_settings(emu: EmulatorDep, body: JsonBodyDep) -> dict[str, Any]:
    """Change settings such as `latency`, `jpeg_rate`, `max_images_policy`, `slow_seconds`."""
    try:
        emu.configure(**body)
    except ValidationError as exc:
        raise validation_failure(exc) from None
    except ValueError as exc:
        raise ServiceError(400, str(exc)) from None
    return emu.settings.public_dict()
