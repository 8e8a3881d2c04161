"""A service that echoes the key (in its request id header, its error messages, its text) never gets it
into a record, a file of the output folder or a log (issue 13 #5: the request id was stored as sent)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
from flow_helpers import read_jsonl, read_results, run_flow, write_jsonl

from imagebatch.flows.batch import RunHooks, run_hooks


def echoing_service(upstream: httpx.Client, key: str) -> httpx.MockTransport:
    """Forwards to the emulator, then echoes the key back: in `x-request-id` on every answer, and in the
    error message of every second job's first attempt (a 500, which the images route retries)."""
    failed_once: set[str] = set()

    def handle(request: httpx.Request) -> httpx.Response:
        idem = request.headers.get("idempotency-key", "")
        headers = {"x-request-id": f"req-{key}-{idem[:8]}"}
        if "odd" in request.content.decode(errors="replace") and idem not in failed_once:
            failed_once.add(idem)
            body = {"error": {"code": f"bad_{key}", "message": f"key {key} is overloaded", "type": key}}
            return httpx.Response(500, json=body, headers=headers)
        forwarded = upstream.send(
            upstream.build_request(
                request.method, request.url.path, headers=request.headers, content=request.content
            )
        )
        return httpx.Response(forwarded.status_code, content=forwarded.content, headers={
            "content-type": forwarded.headers.get("content-type", "application/json"), **headers,
        })  # fmt: skip

    return httpx.MockTransport(handle)


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_key_the_service_echoes_is_stored_nowhere(service_env: Any, tmp_path: Path, caplog: Any) -> None:
    logged = Recorder()
    logging.getLogger("imagebatch").addHandler(logged)
    logging.getLogger("imagebatch").setLevel(logging.INFO)
    key = service_env.api_key
    jobs = [
        {"id": f"j{i}", "route": "images", "prompt": f"{'odd' if i % 2 else 'even'} vase {i}"}
        for i in range(4)
    ]
    jobs.append({"id": "t0", "route": "messages", "model": "relay-text-3", "prompt": "describe a vase"})
    manifest = write_jsonl(tmp_path / "m.jsonl", jobs)
    out = tmp_path / "out"
    delays: list[float] = []
    try:
        with (
            httpx.Client(base_url=service_env.url) as upstream,
            run_hooks(RunHooks(sleep=delays.append, transport=echoing_service(upstream, key))),
        ):
            info = run_flow(manifest=str(manifest), out=str(out))
    finally:
        logging.getLogger("imagebatch").removeHandler(logged)

    assert info["counts"]["succeeded"] == 5, info
    assert delays == [3.0, 3.0]  # the two echoed 500s were retried after the spec's first step
    rows = read_results(out)
    assert all(r["request_id"].startswith("req-") for r in rows)
    assert all(r["request_id"].startswith("req-[redacted]-") for r in rows), rows
    usage = read_jsonl(out / "usage.jsonl")
    codes = {u["error_code"] for u in usage if u["http_status"] == 500}
    assert codes == {"bad_[redacted]"}, usage  # what the service said is kept...
    for path in (p for p in out.rglob("*") if p.is_file()):
        assert key.encode() not in path.read_bytes(), path  # ...without the key
    retries = [m for m in logged.messages if "retrying in 3 s" in m]
    assert len(retries) == 2, logged.messages  # one line per retry wait, not one per logger
    assert all("bad_[redacted]" in m for m in retries)
    assert not any(key in m for m in logged.messages)
