"""`imagebatch review OUT`: the run's contact sheet served on 127.0.0.1, for a person to approve or reject
each image (with a note), keyboard first. Each decision is recorded in the output location before the
browser is answered (`work.decisions`: `review.jsonl` in a folder, one object under `review/` in a
bucket), so nothing is lost to a closed tab or a second reviewer; the latest decision on an image is in
force, and an undo takes back only its reviewer's own decision in force (`work.decisions.History`).
Review is a person's interactive step, so it is this command, not a Prefect flow; a run's Prefect
artifact counts what is unreviewed, approved and rejected.

The server is the standard library's `ThreadingHTTPServer`, not the FastAPI/uvicorn the emulator uses: it
serves one page, its decisions and its thumbnails to a browser or two on this machine; a thread per
connection suits `record_decision`, which blocks until the decision is synced (flock and fsync, or a
create-only PUT), and nothing here needs an event loop. It starts at once, adds no import, and each
check below is a few explicit lines rather than middleware settings.

Security: a loopback server is still reachable from every web page its user opens, so
- it binds 127.0.0.1 only;
- every request's `Host` must be `127.0.0.1:PORT` or `localhost:PORT`: a page on another name that
  resolves to 127.0.0.1 (DNS rebinding) is refused, and so can read neither the page nor its token;
- a decision (`POST /api/decision`, and an undo, `POST /api/undo`) needs the server's random token, which
  only its page carries (in `X-Review-Token`), an `Origin` of this server,
  `Content-Type: application/json` (a form or a `no-cors` fetch from another site can set none of these),
  and `Sec-Fetch-Site: same-origin` when the browser sends it; anything else is answered 403 and writes
  nothing;
- the only files served are the images results.csv names and their thumbnails, and the thumbnails of each
  request's reference images (OUT's `thumbs/ref-*.jpg`, made there from the manifest's files as the report
  makes them: the reference itself is never served), addressed by request key and number (no path comes
  from the URL; a number that is not ASCII digits, a raw byte 0xB2 say, is a 404); a name that is
  absolute, has `..` or lies outside `images/` is never served, nor a local file whose real path (symlinks
  resolved) leaves OUT;
- the page's Content-Security-Policy runs its own script only (a nonce) and loads nothing from elsewhere;
  no other site may frame the page or embed its images (`frame-ancestors`, `Cross-Origin-Resource-Policy`).

Choices where the issue is silent: the cards are results.csv's rows with an image (succeeded or skipped;
requests without one have nothing to judge: report.html shows them); a request's variants are separate
cards, newest first, each with its own key; the reviewer's name is `--reviewer`, else
`$IMAGEBATCH_REVIEWER`, else the login name, and the page may set its own (kept in that browser); the
keys, the note, the large view, bulk approve and undo are described in `report.review_page`. The server,
not the page, works out what an undo brings back, from the record as it is when the undo arrives
(`POST /api/undo`: 409 with the reason when another reviewer decided since); undo survives a reload
because each undo is recorded as one (`Decision.undo`) and the server replays the record for the page
(`GET /api/undo`). A missing thumbnail is made on the spot in
a folder (as the report would) and in a bucket the image itself is served instead.
"""

from __future__ import annotations

import getpass
import hmac
import json
import os
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from imagebatch.gateway.constants import ENV_REVIEWER
from imagebatch.report.review_body import MAX_BODY, MAX_REVIEWER, decision_body, fields_refusal
from imagebatch.report.review_data import (
    DecisionCache,
    ReviewCard,
    ReviewError,
    decision_json,
    load_cards,
    local_file,
    reference_thumbnail,
    thumbs_confined,
)
from imagebatch.report.review_page import inline_json, render_page
from imagebatch.storage import layout
from imagebatch.storage.bounded import RecordError
from imagebatch.storage.location import LocalFolder, Location
from imagebatch.work.decisions import DECISIONS, Decision
from imagebatch.work.thumbnails import TooLarge, ensure_thumbnail, thumb_name

HOST = "127.0.0.1"
TOKEN_HEADER = "X-Review-Token"
LISTEN_BACKLOG = 128
"""Connections the kernel queues before the server accepts them. The standard library's default, 5,
reset about one decision in 800 under 16 to 24 reviewers posting at once (issue 29 #11)."""
IDLE_TIMEOUT = 60.0
"""Seconds an idle keep-alive connection is kept."""
CONTENT_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}

__all__ = ["ReviewError", "ReviewServer", "default_reviewer", "serve_review"]


def default_reviewer(given: str | None = None) -> str:
    """The name decisions are recorded under: `given`, else `$IMAGEBATCH_REVIEWER`, else the login name
    (bytes that are not UTF-8 in an argument or a variable shown as U+FFFD: no file could store them)."""
    if given or os.environ.get(ENV_REVIEWER):
        name = given or os.environ[ENV_REVIEWER]
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name (a container's unnamed uid)
        return "reviewer"


class ReviewServer:
    """The review page of the run in `location`, served on 127.0.0.1:`port` (0: a free one) from a
    thread once started. `with ReviewServer(...) as server:` starts and stops it; `server.url`."""

    def __init__(
        self,
        location: Location,
        reviewer: str,
        port: int = 0,
        refresh_interval: float = 1.0,
        show: Sequence[str] | None = None,
        group_by: str | None = None,
    ) -> None:
        self.location = location
        self.reviewer = reviewer
        self.show, self.group_by = show, group_by
        self.token = secrets.token_urlsafe(32)
        self.decisions = DecisionCache(location, interval=refresh_interval)
        self._cards_lock = threading.Lock()
        self._cards_seen: object = None
        self.cards: dict[str, ReviewCard] = {}
        self._cards_json = "[]"
        self.columns: list[str] = []
        self.aside = ""
        self._load_cards()
        self._httpd = _HTTPServer((HOST, port), _Handler, self)
        self.port = int(self._httpd.server_address[1])
        self.url = f"http://{HOST}:{self.port}/"
        self.hosts = frozenset({f"{HOST}:{self.port}", f"localhost:{self.port}"})
        self.origins = frozenset(f"http://{host}" for host in self.hosts)
        self._thread: threading.Thread | None = None
        self.refused = 0
        """Requests refused (403) since the server started."""

    def start(self) -> ReviewServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="imagebatch-review"
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> ReviewServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # --- what the handler asks -------------------------------------------------------------------

    def _load_cards(self) -> None:
        """Read results.csv again if it changed (a folder: its size and time; a bucket: at start only)."""
        seen: object = "bucket"
        if isinstance(self.location, LocalFolder):
            try:
                stat = (self.location.root / layout.RESULTS_CSV).stat()
                seen = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            except OSError:
                seen = None
        with self._cards_lock:
            if seen is not None and seen == self._cards_seen:
                return
            found = load_cards(self.location, self.show, self.group_by)
            self.cards = {card.key: card for card in found.cards}
            self.columns = found.columns
            self._cards_json = inline_json([card.shown for card in found.cards])
            without, refused = found.without, found.refused
            aside = (
                [f"{_count(without, 'request')} without an image not shown (report.html)"] if without else []
            )
            if refused:
                aside.append(f"{_count(refused, 'image name')} outside images/ not served")
            self.aside = "; ".join(aside)
            self._cards_seen = seen

    def page(self, nonce: str) -> bytes:
        self._load_cards()
        version, decisions = self.decisions.since(-1)
        cards, shown = self.cards, self._cards_json
        data = {
            "decisions": {k: decision_json(d) for k, d in decisions.items() if k in cards},
            "version": version,
            "reviewer": self.reviewer,
            "aside": self.aside,
            "columns": self.columns,
            "group": self.group_by or "",
        }
        return render_page(f"imagebatch review: {_name(self.location)}", self.token, nonce, shown, data)

    def decide(self, body: dict[str, Any]) -> tuple[HTTPStatus, dict[str, Any]]:
        """Record the decision a page posted, after checking each field."""
        key, kind = body.get("key"), body.get("decision")
        note, reviewer = body.get("note", ""), body.get("reviewer") or self.reviewer
        card = self.cards.get(key) if isinstance(key, str) else None
        if card is None:
            return HTTPStatus.BAD_REQUEST, {"error": "no image of this run has that key"}
        if kind not in DECISIONS:
            return HTTPStatus.BAD_REQUEST, {"error": f"decision must be one of {', '.join(DECISIONS)}"}
        if why := fields_refusal(body):
            return HTTPStatus.BAD_REQUEST, {"error": why}
        batch = body.get("batch", "")  # the bulk approve it is part of: undone together
        decision = Decision(card.key, card.variant, kind, note.strip(), reviewer.strip(), batch=batch)
        in_force = self.decisions.record(decision)
        return HTTPStatus.OK, {"decision": decision_json(in_force), "version": self.decisions.version}

    def undo(self, body: dict[str, Any]) -> tuple[HTTPStatus, dict[str, Any]]:
        """Take back the reviewer's decision on one image (`key`), or their bulk approve (`batch`), where
        it is still the one in force (`work.decisions.History`). 200 with the decisions in force on the
        images it touched and `refused` (how many were not taken back, and `reason`); 409 with the
        reason when nothing was."""
        key, batch = body.get("key", ""), body.get("batch", "")
        reviewer = body.get("reviewer") or self.reviewer
        if why := fields_refusal(body):
            return HTTPStatus.BAD_REQUEST, {"error": why}
        if not batch and (not isinstance(key, str) or key not in self.cards):
            return HTTPStatus.BAD_REQUEST, {"error": "no image of this run has that key"}
        after, refused = self.decisions.undo(reviewer.strip(), key if not batch else "", batch)
        answer: dict[str, Any] = {
            "decisions": {k: decision_json(d) for k, d in after.items()},
            "undone": len(after) - len(refused) if batch else int(not refused),
            "refused": len(refused),
            "version": self.decisions.version,
        }
        if refused:
            answer["reason"] = refused[0]
        if refused and not answer["undone"]:
            return HTTPStatus.CONFLICT, {"error": f"cannot undo: {refused[0]}", **answer}
        return HTTPStatus.OK, answer

    def image(self, key: str, number: str, thumbnail: bool) -> tuple[bytes, str] | None:
        """Image `number` of the request `key` (or its thumbnail) and its content type; None if there is
        no such image, or it may not be served."""
        card = self.cards.get(key)
        if card is None or (n := _number(number)) is None or n >= len(card.images):
            return None
        rel = card.images[n]
        if isinstance(self.location, LocalFolder):
            return _local_image(self.location.root, rel, thumbnail)
        if thumbnail and (data := self.location.get(f"{layout.THUMBS_DIR}/{thumb_name(rel)}.jpg")):
            return data, "image/jpeg"
        data = self.location.get(rel)
        return None if data is None else (data, CONTENT_TYPES[Path(rel).suffix])

    def undo_stack(self, reviewer: str) -> list[dict[str, Any]]:
        """What `reviewer` (or, if empty, this server's reviewer) can still undo, oldest first: each card's
        key and the bulk approve it was part of, so that a reloaded page undoes as before."""
        stack = self.decisions.undo_stack(reviewer.strip() or self.reviewer)
        return [{"k": key, "b": batch} for key, batch in stack if key in self.cards]

    def reference(self, key: str, number: str) -> bytes | None:
        """The thumbnail of reference image (or mask) `number` of the request `key`: the report's own, in
        OUT's thumbs/ (made there from the manifest's file if missing, in a folder); None if there is none."""
        card = self.cards.get(key)
        if card is None or (n := _number(number)) is None or n >= len(card.references):
            return None
        return reference_thumbnail(self.location, card.references[n])

    def host_ok(self, host: str | None) -> bool:
        return host is not None and host.lower() in self.hosts

    def post_refusal(self, headers: Any) -> str | None:
        """Why a POST is not from this server's page, or None if it is."""
        if headers.get("Origin") not in self.origins:
            return "refused: not from this review page (Origin)"
        if headers.get("Sec-Fetch-Site", "same-origin") != "same-origin":
            return "refused: not from this review page (Sec-Fetch-Site)"
        if not hmac.compare_digest(headers.get(TOKEN_HEADER, "").encode(), self.token.encode()):
            return "refused: missing or wrong token (reload the page)"
        if headers.get_content_type() != "application/json":
            return "refused: a decision is sent as application/json"
        return None


def _number(text: str) -> int | None:
    """`text` as a number if it is ASCII digits only: `str.isdigit` takes `²` (a raw byte 0xB2 in a
    request's path or header, read as Latin-1), which `int` then refuses with a ValueError."""
    return int(text) if text.isascii() and text.isdigit() and len(text) < 10 else None


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _name(location: Location) -> str:
    return location.root.name if isinstance(location, LocalFolder) else location.url


def _local_image(root: Path, rel: str, thumbnail: bool) -> tuple[bytes, str] | None:
    source = local_file(root, rel)
    if source is None:
        return None
    if thumbnail:
        # The report's own thumbnail, made once into thumbs/ if missing; never through a symlink out of OUT.
        name = thumb_name(rel)
        if not thumbs_confined(root, f"{layout.THUMBS_DIR}/{name}.jpg"):
            return None
        try:
            made = ensure_thumbnail(root, source, name)
        except TooLarge:
            return None
        thumb = local_file(root, made) if made else None
        return None if thumb is None else (thumb.read_bytes(), "image/jpeg")
    return source.read_bytes(), CONTENT_TYPES[Path(rel).suffix]


class _HTTPServer(ThreadingHTTPServer):
    """One thread per connection; the open connections are shut down on close, so that a browser's
    idle keep-alive connection does not hold the close up."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], review: ReviewServer):
        self.review = review
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

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


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT
    disable_nagle_algorithm = True  # headers and body are two writes: Nagle held the body for the ACK (40 ms)
    server_version = "imagebatch-review"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
        pass

    def do_GET(self) -> None:
        review = self.server.review
        if not review.host_ok(self.headers.get("Host")):
            return self._json(HTTPStatus.FORBIDDEN, {"error": "refused: unknown Host"}, close=True)
        url = urlsplit(self.path)
        try:
            self._get(review, url)
        except (OSError, ReviewError) as exc:  # the folder or the store failed to answer: say so
            self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"cannot read {review.location.url}: {exc}"})

    def _get(self, review: ReviewServer, url: SplitResult) -> None:
        parts = url.path.split("/")
        if url.path == "/":
            nonce = secrets.token_urlsafe(16)
            csp = (
                f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src 'self'; "
                "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
            )
            body = review.page(nonce)
            return self._send(
                HTTPStatus.OK, body, "text/html; charset=utf-8", {"Content-Security-Policy": csp}
            )
        if url.path == "/api/decisions":
            try:
                since = int(parse_qs(url.query).get("since", ["-1"])[0])
            except ValueError:
                since = -1
            version, changed = review.decisions.since(since)
            decisions = {k: decision_json(d) for k, d in changed.items()}
            return self._json(HTTPStatus.OK, {"version": version, "decisions": decisions})
        if url.path == "/api/undo":
            reviewer = parse_qs(url.query).get("reviewer", [""])[0][:MAX_REVIEWER]
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
        review = self.server.review
        if not review.host_ok(self.headers.get("Host")):
            return self._json(HTTPStatus.FORBIDDEN, {"error": "refused: unknown Host"}, close=True)
        path = urlsplit(self.path).path
        if path not in ("/api/decision", "/api/undo"):
            return self._json(HTTPStatus.NOT_FOUND, {"error": "not found"}, close=True)
        why = review.post_refusal(self.headers)
        if why:
            return self._json(HTTPStatus.FORBIDDEN, {"error": why}, close=True)
        length = _number(self.headers.get("Content-Length", ""))
        if length is None or length > MAX_BODY:
            return self._json(
                HTTPStatus.BAD_REQUEST, {"error": f"a body of at most {MAX_BODY} bytes"}, close=True
            )
        body, why = decision_body(self.rfile.read(length))
        if why:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": why})
        try:
            status, answer = review.undo(body) if path == "/api/undo" else review.decide(body)
        except OSError as exc:
            status, answer = HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"not recorded: {exc.strerror or exc}"}
        self._json(status, answer)

    def _json(self, status: HTTPStatus, data: Any, close: bool = False) -> None:
        if status == HTTPStatus.FORBIDDEN:
            self.server.review.refused += 1
        body = json.dumps(data, ensure_ascii=False).encode()
        self._send(status, body, "application/json", {}, close)

    def _send(
        self, status: HTTPStatus, body: bytes, kind: str, headers: dict[str, str], close: bool = False
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
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
        self.wfile.write(body)


def serve_review(
    location: Location,
    reviewer: str,
    port: int = 0,
    announce: Callable[[str], None] = lambda line: print(line, flush=True),
    *,
    show: Sequence[str] | None = None,
    group_by: str | None = None,
) -> int:
    """`imagebatch review`: serve until SIGINT or SIGTERM; 0 then, 2 if there is nothing to review, a
    column to show or group by is not results.csv's, or the port cannot be had."""
    try:
        server = ReviewServer(location, reviewer, port, show=show, group_by=group_by)
    except (ReviewError, RecordError) as exc:
        print(f"imagebatch review: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"imagebatch review: cannot listen on {HOST}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        with server:
            images = f"{len(server.cards):,} images"
            announce(f"imagebatch review: {server.url} ({images}; reviewer {reviewer}; Ctrl-C stops)")
            while not stop.wait(0.5):
                pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0
