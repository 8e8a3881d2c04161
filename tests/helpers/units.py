"""One unit of work against a fake service, for tests/work: `Harness` (a manifest folder, an output folder,
the fake service, a fresh run context on them), the fake's answers, crashes and a full disk.

No Prefect and no network: the service is the shared fake (`helpers.fake_gateway.FakeService`), which
records every request and plays scripted replies, then a success whose every field depends on the
request's number; the client's `sleep` only records its delays; every "crash" is an exception raised by a
monkeypatched function, after which a new store and context are built from the same output folder (what
a rerun does); a full disk is the journal and usage files pointed at /dev/full.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.fake_gateway import FakeService
from helpers.images import b64, png
from imagebatch.gateway import GatewayClient
from imagebatch.manifest import load_manifest, plan
from imagebatch.storage import appendlog
from imagebatch.work.context import (
    RunContext,
    RunState,
    Unit,
    group_units,
    stop_on_write_failure,
)
from imagebatch.work.spool import RecordSpool
from imagebatch.work.store import OutputStore, RequestRecord, read_jsonl

API_KEY = "secret-key"


def answer_png(width: int) -> bytes:
    """The fake service's n-th image: a different width each time, so files can be told apart."""
    return png(width, 8, (10, 200, 30))


def native_ok(n: int) -> dict[str, Any]:
    """A native success whose every field depends on `n`, so one answer cannot pass for another."""
    return {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": f"thinking {n}", "thought": True, "thoughtSignature": f"thought-sig-{n}"},
                        {"text": f"ok {n}"},
                        {
                            "inlineData": {
                                "mimeType": "image/png",
                                "data": b64(answer_png(8 + n)),
                            },
                            "thoughtSignature": f"sig-{n}",
                        },
                    ],
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {"candidatesTokenCount": n},
    }


def native_no_image(finish: str = "SAFETY") -> dict[str, Any]:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "I can't draw that."}]}, "finishReason": finish}
        ],
        "usageMetadata": {},
    }


def error(status: int, code: str | None = None) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": f"simulated {status}", "code": code or f"code_{status}"}}


def success(request: httpx.Request, n: int) -> dict[str, Any]:
    """The fake service's answer to its n-th request once its script is played: a success of the route."""
    path = request.url.path
    if path.startswith("/v1beta/"):
        return native_ok(n)
    if path.startswith("/v1/images/"):
        return {"created": 1, "data": [{"b64_json": b64(answer_png(8 + n))}]}
    if path == "/v1/messages":
        return {"content": [{"type": "text", "text": f"hello {n}"}], "usage": {"output_tokens": n}}
    raise AssertionError(f"unexpected path {path}")


class Harness:
    """A manifest folder, an output folder and the fake service; `context()` is a fresh run on them."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.out = tmp_path / "out"
        self.service = FakeService(default=success)
        self.delays: list[float] = []
        self.clients: list[GatewayClient] = []
        self.while_waiting: Callable[[], None] | None = None
        """Called in the client's wait before a retry (a test fills the disk there)."""

    def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        if self.while_waiting is not None:
            self.while_waiting()

    def units(self, *rows: dict[str, Any]) -> list[Unit]:
        """Write `rows` as a JSONL manifest and group its plan as the flow does."""
        path = self.tmp / "manifest.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return list(group_units(plan(load_manifest(path))))

    def unit(self, row: dict[str, Any]) -> Unit:
        (unit,) = self.units(row)
        return unit

    def context(
        self, slot: Callable[[], AbstractContextManager[object]] = nullcontext, **options: Any
    ) -> RunContext:
        client = GatewayClient(
            "http://svc",
            API_KEY,
            transport=httpx.MockTransport(self.service.handle),
            sleep=self.sleep,
            slot=slot,
        )
        self.clients.append(client)
        store = OutputStore(self.out)
        store.backend.prepare()
        state = RunState(RecordSpool(store.backend.spool_folder))
        stop_on_write_failure(store, state)
        return RunContext(client, store, store.load_state(), state, **options)

    def events(self, key: str | None = None) -> list[dict[str, Any]]:
        events = read_jsonl(self.out / "journal.jsonl")
        return [e for e in events if key is None or e.get("idempotency_key") == key]

    def close(self) -> None:
        for client in self.clients:
            client.close()


class Crash(Exception):
    """Stands for the process dying at this point."""


def crash(*_args: Any, **_kwargs: Any) -> None:
    raise Crash("killed")


CAT = {"id": "a", "prompt": "cat"}


CHAIN = {"id": "c", "prompt": "p", "turns": ["t1", "t2"]}


IMAGES = {"id": "g", "model": "compat-image-2", "prompt": "x"}


TEXT = {"id": "m", "route": "messages", "model": "text-model", "prompt": "hi"}


def key12(rec: RequestRecord) -> str:
    return rec.idempotency_key.removeprefix("ib1-")[:12]


class FullDisk:
    """The output folder's journal and usage files on a full disk: `fill` points them at /dev/full, where
    every write fails with ENOSPC (the store opens them for each line, so its next line meets it, through
    its own error path); `free` puts the files back as they were."""

    NAMES = ("journal.jsonl", "usage.jsonl")

    def __init__(self, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full on this system")
        self.out = out
        self.monkeypatch = monkeypatch

    def fill(self) -> None:
        # The device stands in for a full disk through a link out of OUT, which every write refuses (tests/
        # storage/test_confined.py): here the journal's appends may follow it, so that ENOSPC is real.
        self.monkeypatch.setattr(appendlog, "confined", lambda root, name: Path(root) / name)
        for name in self.NAMES:
            path = self.out / name
            if path.exists():
                path.rename(self.out / f"{name}.kept")
            path.symlink_to("/dev/full")

    def free(self) -> None:
        for name in self.NAMES:
            (self.out / name).unlink()
            if (kept := self.out / f"{name}.kept").exists():
                kept.rename(self.out / name)


def planned_units(n: int) -> list[Unit]:
    """The units of an `n`-row CSV manifest (`s000`, `s001`, ...: a request each), planned as a run plans."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.csv"
        path.write_text("id,prompt\n" + "".join(f"s{i:03d},product {i}\n" for i in range(n)))
        return list(group_units(plan(load_manifest(path))))
