"""The peer: the plain asyncio + httpx loop a user would write instead of `imagebatch run`.

Not part of imagebatch; the yardstick of `bench_scale.py` (issue 9). It reads the same CSV manifest the
benchmark writes (columns `id`, `prompt`, optionally `model`, `image_size`, `aspect_ratio`; one native
text-to-image request per row) and sends each row as

    POST {base}/v1beta/models/{model}:generateContent
    x-native-api-key: KEY
    Idempotency-Key: peer-<sha256 of the row's recipe>

with at most `--concurrency` requests in flight (one `asyncio.Semaphore`, one `httpx.AsyncClient` whose
pool is sized to it, 650 s timeout as the spec asks). Each answer's first non-thought `inlineData` image
is decoded (base64) and written to `OUT/images/<id>.<png|jpg>`; one JSON line per request is appended to
`OUT/results.jsonl`. One attempt per request (the native route makes a single attempt: no retries). A
rerun skips the rows that `results.jsonl` already records as `ok`.

    uv run python bench/peer.py MANIFEST --out DIR --base-url URL --api-key KEY [--concurrency 32]

`--clients K` spreads the requests over K clients (not the plain loop; see `run`).
It prints one JSON line at the end: requests, sent, ok, failed, loop seconds (first send to last answer).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import csv
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

DEFAULT_MODEL = "native-image-2.1"
TIMEOUT_S = 650.0
EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg"}


def read_manifest(path: Path) -> list[dict[str, str]]:
    """The manifest's rows as dicts (CSV with a header row)."""
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def request_body(row: dict[str, str]) -> dict[str, Any]:
    """The native body of one text-to-image row, as imagebatch sends it."""
    return {
        "contents": [{"role": "user", "parts": [{"text": row["prompt"]}]}],
        "generationConfig": {
            "responseModalities": ["IMAGE"],
            "candidateCount": 1,
            "imageConfig": {
                "imageSize": row.get("image_size") or "1K",
                "aspectRatio": row.get("aspect_ratio") or "1:1",
            },
        },
    }


def idempotency_key(model: str, body: dict[str, Any], row_id: str) -> str:
    material = json.dumps([model, body, row_id], sort_keys=True, separators=(",", ":"))
    return "peer-" + hashlib.sha256(material.encode()).hexdigest()[:32]


def first_image(answer: dict[str, Any]) -> tuple[str, bytes] | None:
    """(mime type, bytes) of the first non-thought inline image of a native answer, or None."""
    for candidate in answer.get("candidates") or []:
        for part in (candidate.get("content") or {}).get("parts") or []:
            inline = part.get("inlineData")
            if inline and not part.get("thought"):
                return inline["mimeType"], base64.b64decode(inline["data"], validate=True)
    return None


def done_ids(results: Path) -> set[str]:
    """Ids that an earlier run into the same folder recorded as `ok`."""
    if not results.exists():
        return set()
    ok: set[str] = set()
    with results.open(encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if record.get("status") == "ok":
                ok.add(record["id"])
    return ok


async def send_one(
    client: httpx.AsyncClient,
    limit: asyncio.Semaphore,
    row: dict[str, str],
    base_url: str,
    api_key: str,
    images: Path,
    results: Any,
) -> str:
    model = row.get("model") or DEFAULT_MODEL
    body = request_body(row)
    key = idempotency_key(model, body, row["id"])
    url = f"{base_url}/v1beta/models/{model}:generateContent"
    headers = {"x-native-api-key": api_key, "Idempotency-Key": key}
    record: dict[str, Any] = {"id": row["id"], "idempotency_key": key}
    async with limit:
        t0 = time.time()
        record["started"] = t0
        try:
            response = await client.post(url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            record |= {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        else:
            record |= {
                "http_status": response.status_code,
                "request_id": response.headers.get("x-request-id"),
            }
            if response.status_code != 200:
                record |= {"status": "failed", "error": response.text[:300]}
            else:
                image = first_image(response.json())
                if image is None:
                    record["status"] = "no_image"
                else:
                    mime, data = image
                    path = images / f"{row['id']}.{EXTENSIONS.get(mime, 'bin')}"
                    path.write_bytes(data)
                    record |= {"status": "ok", "path": str(path), "bytes": len(data), "mime_type": mime}
        record["duration"] = round(time.time() - t0, 4)
    results.write(json.dumps(record) + "\n")
    results.flush()
    return record["status"]


async def run(
    manifest: Path, out: Path, base_url: str, api_key: str, concurrency: int, clients: int = 1
) -> dict[str, Any]:
    """Send every row not yet done; return the run's counts and the loop's seconds.

    `clients` > 1 spreads the requests over that many `AsyncClient`s (round robin), each with its share of
    the connections: not what the plain loop does, a way to show the cost of httpcore 1.0.9's connection
    pool, whose bookkeeping grows with the square of its connections (bench/README.md).
    """
    rows = read_manifest(manifest)
    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    done = done_ids(results_path)
    todo = [row for row in rows if row["id"] not in done]
    limit = asyncio.Semaphore(concurrency)
    per_client = -(-concurrency // clients)
    limits = httpx.Limits(max_connections=per_client, max_keepalive_connections=per_client)
    t0 = time.monotonic()
    with results_path.open("a", encoding="utf-8") as results:
        async with contextlib.AsyncExitStack() as stack:
            pool = [
                await stack.enter_async_context(httpx.AsyncClient(timeout=TIMEOUT_S, limits=limits))
                for _ in range(clients)
            ]
            statuses = await asyncio.gather(
                *(
                    send_one(pool[i % clients], limit, row, base_url, api_key, images, results)
                    for i, row in enumerate(todo)
                )
            )
    loop_s = time.monotonic() - t0
    counts: dict[str, int] = {}
    for status in statuses:
        counts[status] = counts.get(status, 0) + 1
    return {
        "requests": len(rows),
        "skipped": len(rows) - len(todo),
        "sent": len(todo),
        "ok": counts.get("ok", 0),
        "counts": counts,
        "loop_s": round(loop_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--base-url", default=os.environ.get("IMAGEBATCH_BASE_URL"))
    parser.add_argument("--api-key", default=os.environ.get("IMAGEBATCH_API_KEY"))
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--clients", type=int, default=1, help="AsyncClients to spread requests over")
    args = parser.parse_args(argv)
    if not args.base_url or not args.api_key:
        parser.error("--base-url and --api-key are needed (or IMAGEBATCH_BASE_URL, IMAGEBATCH_API_KEY)")
    summary = asyncio.run(
        run(args.manifest, args.out, args.base_url.rstrip("/"), args.api_key, args.concurrency, args.clients)
    )
    print(json.dumps(summary | {"clients": args.clients}), flush=True)
    return 0 if summary["ok"] + summary["skipped"] == summary["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
