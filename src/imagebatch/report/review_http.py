"""The review server's HTTP side: the standard library's `ThreadingHTTPServer` and the handler that turns a
request into a question to the `report.review.ReviewServer` (the routes below), after the checks every
request passes (`report.review_auth.Gate`): its Host, then its reviewer (when the server has reviewers:
401 on every route without one, the sign-in link aside), then, for a POST, the CSRF checks and the body's
bound.

Routes: `GET /` the page (`/?token=` signs a browser in), `GET /api/changes?since=VERSION` the decisions
in force and the ratings that changed since (each decision with every reviewer's own on that image;
`/api/decisions` is the same without them), `GET /api/undo` what the reviewer can still undo, `GET
/thumb|image/KEY/N` and `GET /ref/KEY/N` the images; `POST /api/decision` and `POST /api/undo`.
"""

from __future__ import annotations

import html
import json
import secrets
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from imagebatch.report.review_body import MAX_BODY, MAX_REVIEWER, ascii_number, decision_body
from imagebatch.report.review_data import ReviewError

LISTEN_BACKLOG = 128
"""Connections the kernel queues before the server accepts them. The standard library's default, 5,
reset about one decision in 800 under 16 to 24 reviewers posting at once."""
IDLE_TIMEOUT = 60.0
"""Seconds an idle keep-alive connection is kept."""
SIGN_IN = (
    b"<!doctype html><html lang=en><head><meta charset=utf-8><title>imagebatch review: sign in</title></head>"
    b"<body><p>This review needs a reviewer's sign-in link (<code>/?token=...</code>), from the person who "
    b"runs it.</p></body></html>"
)
SIGNED_IN = (
    '<!doctype html><html lang=en><head><meta charset=utf-8><meta http-equiv="refresh" content="0; url=/">'
    '<title>imagebatch review</title></head><body><p>Signed in as {name}: <a href="/">the review</a>.</p>'
    "</body></html>"
)
"""The sign-in link's answer: the cookie is set, and the page moves on to `/`, the token out of the address
(a refresh rather than a 303: `report.review_auth` says why)."""


@dataclass(frozen=True, slots=True)
class Page:
    """An answer written as it is made: `length` bytes in all, from `chunks` (the review page, its cards'
    data read from the store a batch at a time)."""

    length: int
    chunks: Iterable[bytes]


class ReviewHTTPServer(ThreadingHTTPServer):
    """One thread per connection; the open connections are shut down on close, so that a browser's
    idle keep-alive connection does not hold the close up. `review`: the `ReviewServer` it serves."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], review: Any):
        self.review = review
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        with self._open_lock:
            for conn in self._open:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        super().server_close()  # joins the connections' threads


class Handler(BaseHTTPRequestHandler):
    server: ReviewHTTPServer
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT
    disable_nagle_algorithm = True  # headers and body are two writes: Nagle held the body for the ACK (40 ms)
    server_version = "imagebatch-review"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise, and a
        pass  # sign-in link's request line holds a token

    def _admit(self) -> tuple[bool, str | None]:
        """Whether the request may go on, and its reviewer (None without reviewers); answered if not."""
        gate = self.server.review.gate
        if not gate.host_ok(self.headers.get("Host")):
            self._json(HTTPStatus.FORBIDDEN, {"error": "refused: unknown Host"}, close=True)
            return False, None
        if not gate.required:
            return True, None
        url = urlsplit(self.path)
        link = self.command == "GET" and url.path == "/" and "token" in parse_qs(url.query)
        if not link and (who := gate.who(self.headers)) is not None:
            return True, who  # a sign-in link is never served as the page: its token would stay in view
        if link and (found := gate.sign_in(url.query)):
            secure = self.headers.get("X-Forwarded-Proto", "").lower() == "https"
            page = SIGNED_IN.format(name=html.escape(found[0])).encode()
            self._send(
                HTTPStatus.OK,
                page,
                "text/html; charset=utf-8",
                {"Set-Cookie": gate.cookie_header(found[1], secure)},
            )
        elif self.command == "GET" and url.path == "/":
            self._send(HTTPStatus.UNAUTHORIZED, SIGN_IN, "text/html; charset=utf-8", _CHALLENGE)
        else:
            self._json(HTTPStatus.UNAUTHORIZED, {"error": "refused: sign in with your link"}, _CHALLENGE)
        return False, None

    def do_GET(self) -> None:
        admitted, who = self._admit()
        if not admitted:
            return
        review = self.server.review
        try:
            self._get(review, urlsplit(self.path), who)
        except ConnectionError:  # the browser went away (a reload, a closed tab): nobody to answer
            self.close_connection = True
        except (OSError, ReviewError) as exc:  # the folder or the store failed to answer: say so
            self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"cannot read {review.location.url}: {exc}"})

    def _get(self, review: Any, url: SplitResult, who: str | None) -> None:
        parts, query = url.path.split("/"), parse_qs(url.query)
        if url.path == "/":
            nonce = secrets.token_urlsafe(16)
            csp = (
                f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src 'self'; "
                "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
            )
            body = review.page(nonce, who)
            return self._send(
                HTTPStatus.OK, body, "text/html; charset=utf-8", {"Content-Security-Policy": csp}
            )
        if url.path in ("/api/changes", "/api/decisions"):
            since = ascii_number(query.get("since", [""])[0])  # -1 or none: all of them
            since = -1 if since is None else since
            return self._json(HTTPStatus.OK, review.changes(since, views=url.path == "/api/changes"))
        if url.path == "/api/undo":
            reviewer = who or query.get("reviewer", [""])[0][:MAX_REVIEWER]
            return self._json(HTTPStatus.OK, {"undo": review.undo_stack(reviewer)})
        if len(parts) == 4 and parts[1] == "ref" and (thumb := review.reference(unquote(parts[2]), parts[3])):
            return self._send(HTTPStatus.OK, thumb, "image/jpeg", {"Cache-Control": "private, max-age=3600"})
        if url.path == "/favicon.ico":  # none: an empty answer rather than a 404 in the console
            return self._send(HTTPStatus.OK, b"", "image/x-icon", {})
        if len(parts) == 4 and parts[1] in ("thumb", "image"):
            found = review.image(unquote(parts[2]), parts[3], thumbnail=parts[1] == "thumb")
            if found is not None:
                return self._send(
                    HTTPStatus.OK, found[0], found[1], {"Cache-Control": "private, max-age=3600"}
                )
        return self._json(HTTPStatus.NOT_FOUND, {"error": "not found"})

    def do_POST(self) -> None:
        admitted, who = self._admit()
        if not admitted:
            return
        review = self.server.review
        path = urlsplit(self.path).path
        if path not in ("/api/decision", "/api/undo"):
            return self._json(HTTPStatus.NOT_FOUND, {"error": "not found"}, close=True)
        why = review.gate.post_refusal(self.headers)
        if why:
            return self._json(HTTPStatus.FORBIDDEN, {"error": why}, close=True)
        length = ascii_number(self.headers.get("Content-Length", ""))
        if length is None or length > MAX_BODY:
            return self._json(
                HTTPStatus.BAD_REQUEST, {"error": f"a body of at most {MAX_BODY} bytes"}, close=True
            )
        body, why = decision_body(self.rfile.read(length))
        if why:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": why})
        try:
            status, answer = review.undo(body, who) if path == "/api/undo" else review.decide(body, who)
        except OSError as exc:
            status, answer = HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"not recorded: {exc.strerror or exc}"}
        self._json(status, answer)

    def _json(
        self, status: HTTPStatus, data: Any, headers: dict[str, str] | None = None, close: bool = False
    ) -> None:
        body = json.dumps(data, ensure_ascii=False).encode()
        self._send(status, body, "application/json", headers or {}, close)

    def _send(
        self, status: HTTPStatus, body: bytes | Page, kind: str, headers: dict[str, str], close: bool = False
    ) -> None:
        if status in (HTTPStatus.FORBIDDEN, HTTPStatus.UNAUTHORIZED):
            self.server.review.refused += 1
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(body.length if isinstance(body, Page) else len(body)))
        for name, value in {
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY",
            "Cross-Origin-Resource-Policy": "same-origin",
            **headers,
        }.items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        for chunk in body.chunks if isinstance(body, Page) else [body]:
            self.wfile.write(chunk)


_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="imagebatch review"'}
