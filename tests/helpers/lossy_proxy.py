"""A reverse proxy on 127.0.0.1 that loses answers: every request is forwarded to the upstream server as
it came, and the answer comes back, except for the first `lose` requests `matches` picks, which reach the
server (it does what they ask) and whose answer is replaced by `503 Service Unavailable`, as Prefect's
SQLite server answers while its database is locked and as a load balancer answers for a stalled backend.

    with LossyProxy(server.api_url, lambda method, path: path.endswith("/create_flow_run"), lose=2) as proxy:
        ...  # a client of proxy.url: its first two creations are made, and answered 503
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

import httpx

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


class LossyProxy:
    """Forwards to `upstream` (a URL with a path prefix, e.g. `http://127.0.0.1:PORT/api`); `url` is the
    same prefix on the proxy. `lost` lists the (method, path) whose answers were replaced, `failed` those
    the server itself answered with a 5xx (Prefect's SQLite server does, under contention)."""

    def __init__(self, upstream: str, matches: Callable[[str, str], bool], lose: int) -> None:
        self.upstream, self.matches, self.left = upstream.rstrip("/"), matches, lose
        self.lost: list[tuple[str, str]] = []
        self.failed: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=60.0)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        prefix = urlsplit(self.upstream).path
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}{prefix}"
        self._origin = self.upstream.removesuffix(prefix)

    def _lose(self, method: str, path: str) -> bool:
        with self._lock:
            if self.left > 0 and self.matches(method, path):
                self.left -= 1
                self.lost.append((method, path))
                return True
            return False

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                answer = proxy._client.request(
                    self.command, proxy._origin + self.path, content=body, headers=headers
                )
                if proxy._lose(self.command, urlsplit(self.path).path):
                    status, content, kept = 503, b'{"exception_message": "Service Unavailable"}', {}
                else:
                    status, content = answer.status_code, answer.content
                    if status >= 500:
                        proxy.failed.append((self.command, urlsplit(self.path).path))
                    kept = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
                self.send_response(status)
                for name, value in kept.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

    def __enter__(self) -> LossyProxy:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()
