"""A service that echoes the key (in its request id header, its error messages, its text) never gets it
into a record, a file of the output folder or a log (issue 13 #5: the request id was stored as sent)."""

from __future__ import annotations

import base64
import json
import logging
import re
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from helpers.runs import read_jsonl, read_results, run_flow, write_jsonl
from PIL import Image

from imagebatch.gateway.redaction import carries_key
from imagebatch.run.hooks import RunHooks, run_hooks


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


def test_a_key_the_service_echoes_is_stored_nowhere(
    service_env: Any, tmp_path: Path, out: Path, caplog: Any
) -> None:
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


def key_forms(key: str) -> list[str]:
    """The forms a hostile service echoes the key in below (each must be found in no output file)."""
    raw = key.encode()
    return [
        key, key.upper(), key.swapcase(), quote(key, safe=""), "".join(f"%{b:02X}" for b in raw),
        base64.b64encode(raw).decode(), base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode().rstrip("="), base64.b64encode(key.upper().encode()).decode(),
    ]  # fmt: skip


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")


def tag_image(data: bytes, key: str) -> bytes:
    """The image with the key added in text chunks (PNG) or a comment and an XMP packet (JPEG)."""
    if data.startswith(b"\x89PNG"):
        chunks = (
            png_chunk(b"tEXt", b"Comment\0made for " + key.encode())
            + png_chunk(b"zTXt", b"Software\0\0" + zlib.compress(base64.b64encode(key.encode())))
            + png_chunk(b"iTXt", b"Author\0\1\0en\0\0" + zlib.compress(key.upper().encode()))
        )
        return data[:33] + chunks + data[33:]  # after the signature and IHDR
    xmp = b"http://ns.adobe.com/xap/1.0/\0" + quote(key, safe="").encode()
    segments = b"\xff\xfe" + (len(key) + 2).to_bytes(2, "big") + key.encode()
    segments += b"\xff\xe1" + (len(xmp) + 2).to_bytes(2, "big") + xmp
    return data[:2] + segments + data[2:]


def hostile_body(body: dict[str, Any], key: str, originals: list[bytes]) -> dict[str, Any]:
    """A success body echoing the key: in the images' chunks, and in the text in other forms."""
    raw = key.encode()

    def tagged(b64: str) -> str:
        data = base64.b64decode(b64)
        originals.append(data)
        return base64.b64encode(tag_image(data, key)).decode()

    for cand in body.get("candidates", []):
        for part in (cand.get("content") or {}).get("parts", []):
            if "inlineData" in part:
                part["inlineData"]["data"] = tagged(part["inlineData"]["data"])
    if isinstance(body.get("usageMetadata"), dict):  # not in the signed turn, which a chain sends back
        body["usageMetadata"]["trafficType"] = quote(key, safe="")
    for choice in body.get("choices", []):
        content = choice["message"]["content"]
        choice["message"]["content"] = (
            re.sub(r"(?<=base64,)[A-Za-z0-9+/=]+", lambda m: tagged(m.group(0)), content)
            + f" {key.swapcase()}"
        )
    for item in body.get("data", []):
        item["b64_json"] = tagged(item["b64_json"])
        item["revised_prompt"] = "blob " + base64.b64encode(b"\x00\x01" + raw + b"\x02tail").decode()
    for block in body.get("content", []) if isinstance(body.get("content"), list) else []:
        block["text"] += f" {key.upper()} {base64.urlsafe_b64encode(b'x' + raw + b'yz').decode()}"
    return body


def encoding_service(upstream: httpx.Client, key: str, originals: list[bytes]) -> httpx.MockTransport:
    """Forwards to the emulator and echoes the key encoded: base64 in `x-request-id`, URL-safe base64 and
    swapped case in a 500's error body (the first attempt of a prompt saying "odd"), and in every success
    body."""
    failed_once: set[str] = set()
    raw = key.encode()

    def handle(request: httpx.Request) -> httpx.Response:
        idem = request.headers.get("idempotency-key", "")
        headers = {"x-request-id": f"req-{base64.b64encode(raw).decode()}-{idem[:8]}"}
        if "odd" in request.content.decode(errors="replace") and idem not in failed_once:
            failed_once.add(idem)
            message = f"key {base64.urlsafe_b64encode(raw).decode()} is overloaded"
            error = {"code": f"bad_{key.swapcase()}", "type": quote(key, safe=""), "message": message}
            body = {"error": error}
            return httpx.Response(500, json=body, headers=headers)
        forwarded = upstream.send(
            upstream.build_request(
                request.method, request.url.path, headers=request.headers, content=request.content
            )
        )
        if forwarded.status_code != 200:
            return httpx.Response(forwarded.status_code, content=forwarded.content, headers=headers)
        return httpx.Response(200, json=hostile_body(forwarded.json(), key, originals), headers=headers)

    return httpx.MockTransport(handle)


def png_texts(path: Path) -> str:
    with Image.open(path) as img:
        return json.dumps(getattr(img, "text", {})) + json.dumps(img.info, default=str)


def test_a_key_echoed_encoded_or_in_image_chunks_is_stored_nowhere(
    service_env: Any, tmp_path: Path, out: Path
) -> None:
    """Issue 21 #6: base64 (standard, URL-safe, inside larger base64), percent-encoded, in another case,
    and in the text chunks of returned PNGs and the comment and XMP of returned JPEGs."""
    key = service_env.api_key
    service_env.configure(jpeg_rate=0.5, thought_image_rate=0.0)
    jobs: list[dict[str, Any]] = [{"id": f"n{i}", "prompt": f"vase {i}"} for i in range(4)]
    jobs += [
        {"id": "chain", "prompt": "a mug", "turns": ["make it red"]},
        {"id": "img", "route": "images", "model": "compat-image-2", "prompt": "odd lamp"},
        {"id": "img2", "route": "images", "model": "compat-image-2", "prompt": "even lamp"},
        {"id": "chat", "route": "chat", "model": "native-image-pro", "prompt": "a lemon"},
        {"id": "t0", "route": "messages", "model": "relay-text-3", "prompt": "describe a vase"},
    ]
    manifest = write_jsonl(tmp_path / "m.jsonl", jobs)
    originals: list[bytes] = []
    with (
        httpx.Client(base_url=service_env.url) as upstream,
        run_hooks(RunHooks(sleep=lambda _: None, transport=encoding_service(upstream, key, originals))),
    ):
        info = run_flow(manifest=str(manifest), out=str(out))

    problems = [(r["job_id"], r["error"]) for r in read_results(out) if r["status"] != "succeeded"]
    assert info["counts"]["succeeded"] == len(jobs) + 1, problems  # the chain is two requests
    rows = read_results(out)
    assert all(r["request_id"].startswith("req-[redacted]-") for r in rows), rows
    usage = read_jsonl(out / "usage.jsonl")
    assert {u["error_code"] for u in usage if u["http_status"] == 500} == {"bad_[redacted]"}
    assert (out / "report.html").is_file()
    forms = [f.encode() for f in key_forms(key)]
    files = [p for p in out.rglob("*") if p.is_file()]
    for path in files:
        data = path.read_bytes()
        assert not [f for f in forms if f in data], path
        assert not carries_key(data.decode("latin-1"), key), path  # inside larger base64 too
    # The images: the chunks that carried the key are gone, the rest of the file is as the service made
    # it, byte for byte (so the pixels are too).
    saved = sorted(p for p in (out / "images").rglob("*") if p.suffix in (".png", ".jpg"))
    assert len(saved) == len(originals) >= 6
    assert {p.suffix for p in saved} == {".png", ".jpg"}
    assert sorted(p.read_bytes() for p in saved) == sorted(originals)
    for path in saved:
        assert key.upper() not in png_texts(path).upper()
