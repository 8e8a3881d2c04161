"""A loopback stand-in for Prefect's `/health`, as far as a run's probe cares: an answer, over HTTP/1.1
(connections kept alive, as Prefect's uvicorn keeps them), counting connections and answers.

    with health_server() as (api_url, handler):   # api_url: http://127.0.0.1:PORT/api
        ...                                       # handler.connections, .answers, .probes, .ended
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Health(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections: int  # opened so far
    answers: int  # given so far
    probes: threading.Semaphore  # one release per answer
    ended: threading.Event  # a connection was closed by its client

    def handle(self) -> None:
        type(self).connections += 1
        try:
            super().handle()  # every request of this connection, until the client closes it
        finally:
            self.ended.set()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"true")
        type(self).answers += 1
        self.probes.release()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def health_server() -> Iterator[tuple[str, type[Health]]]:
    """The server on a free loopback port, in a thread, with counts of its own (a handler class per call)."""
    state = {"connections": 0, "answers": 0, "probes": threading.Semaphore(0), "ended": threading.Event()}
    handler = type("Handler", (Health,), state)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/api", handler
    finally:
        server.shutdown()
        server.server_close()
