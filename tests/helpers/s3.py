"""A real S3-compatible server for the tests: moto's `ThreadedMotoServer` on 127.0.0.1, with signature
checking on (an IAM user's key is issued, then every request must be signed with it), so refused
credentials are refused by the server itself."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import httpx

REGION = "us-east-1"


class S3Server:
    """One moto server: `url`, a valid key pair, fresh buckets, and the objects a bucket holds."""

    def __init__(self) -> None:
        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request, otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        bootstrap = {"aws_access_key_id": "bootstrap", "aws_secret_access_key": "bootstrap"}
        iam = boto3.client("iam", endpoint_url=self.url, region_name=REGION, **bootstrap)
        iam.create_user(UserName="imagebatch")
        allow = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="imagebatch", PolicyName="all", PolicyDocument=json.dumps(allow))
        key = iam.create_access_key(UserName="imagebatch")["AccessKey"]
        self.access_key, self.secret_key = str(key["AccessKeyId"]), str(key["SecretAccessKey"])
        httpx.post(f"{self.url}/moto-api/reset-auth", content=b"0").raise_for_status()  # signatures checked
        self.client: Any = boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def env(self, url: str | None = None) -> dict[str, str]:
        """The standard variables a run reads its store's address and credentials from."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": url or self.url,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": REGION,
        }

    def bucket(self) -> str:
        name = f"ib-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under `prefix`, by key relative to it."""
        out: dict[str, bytes] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                body = self.client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                out[item["Key"].removeprefix(prefix).lstrip("/")] = body
        return out

    def stop(self) -> None:
        self._server.stop()
        inner = getattr(self._server, "_server", None)  # moto's stop shuts the server down, never closes it
        if inner is not None:
            inner.server_close()


class FaultProxy:
    """A small HTTP proxy on 127.0.0.1 in front of the S3 server that answers some requests itself with a
    fault: `rule(method, path, n)` (n: the request's number, from 1) returns None to pass the request on,
    or 503 / 500 (an S3 error body: SlowDown, InternalError), "drop" (the connection closed with no
    answer, before the request reaches the server) or "drop-after" (passed on, then closed unanswered).
    `log` lists (method, path, fault) of every request."""

    def __init__(self, upstream: str) -> None:
        import http.server
        import threading

        self.upstream = upstream
        self.rule: Any = lambda method, path, n: None
        self.log: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=30)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                proxy.handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def handle(self, h: Any) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        with self._lock:
            n = len(self.log) + 1
            fault = self.rule(h.command, h.path, n)
            self.log.append((h.command, h.path, fault))
        if fault == "drop":
            h.close_connection = True
            h.connection.shutdown(2)
            return
        if fault in (500, 503):
            code = "SlowDown" if fault == 503 else "InternalError"
            payload = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
            h.send_response(fault)
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
            return
        # The Host header is passed on as signed (the server checks the signature, which covers it).
        headers = {k: v for k, v in h.headers.items() if k.lower() != "content-length"}
        answer = self._client.request(h.command, self.upstream + h.path, headers=headers, content=body)
        if fault == "drop-after":
            h.close_connection = True
            h.connection.shutdown(2)
            return
        h.send_response(answer.status_code)
        for k, v in answer.headers.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                h.send_header(k, v)
        # A HEAD's answer has no body: its Content-Length is the object's size, as the server said it.
        length = answer.headers.get("content-length", "0") if h.command == "HEAD" else len(answer.content)
        h.send_header("Content-Length", str(length))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(answer.content)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()
