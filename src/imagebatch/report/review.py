"""`imagebatch review OUT`: the run's contact sheet served on 127.0.0.1 (or, for named reviewers, on the
address `--host` gives), for people to approve or reject each image (with a note), keyboard first. Each
decision is recorded in the output location before the browser is answered (`work.decisions`:
`review.jsonl` in a folder, one object under `review/` in a bucket), so nothing is lost to a closed tab or
a second reviewer; the latest decision on an image is in force, and an undo takes back only its
reviewer's own decision in force (`work.decisions.History`). Review is a person's interactive step, so it
is this command, not a Prefect flow; a run's Prefect artifact counts what is unreviewed, approved and
rejected.

The server is the standard library's `ThreadingHTTPServer`, not the FastAPI/uvicorn the emulator uses: it
serves one page, its decisions and its thumbnails to a few browsers (`report.review_http`); a thread per
connection suits `record_decision`, which blocks until the decision is synced (flock and fsync, or a
create-only PUT), and nothing here needs an event loop. It starts at once, adds no import, and each
check below is a few explicit lines rather than middleware settings.

Security: a loopback server is still reachable from every web page its user opens, so
- it binds 127.0.0.1 only, unless `--host` names another address, which it serves only to the reviewers
  a reviewers file names, each request with a reviewer's token (`report.review_auth`: 401 on every route
  without one, pages and images included), each decision under that reviewer's name;
- every request's `Host` must be `127.0.0.1:PORT` or `localhost:PORT` (with `--host`, that address and
  port; with `--origin`, a proxy's name too): a page on another name that resolves to the server
  (DNS rebinding) is refused, and so can read neither the page nor its token;
- a decision (`POST /api/decision`, and an undo, `POST /api/undo`) needs the server's random token, which
  only its page carries (in `X-Review-Token`), an `Origin` of this server,
  `Content-Type: application/json` (a form or a `no-cors` fetch from another site can set none of these),
  and `Sec-Fetch-Site: same-origin` when the browser sends it; anything else is answered 403 and writes
  nothing;
- the only files served are the images results.csv names and their thumbnails, the image approved for a
  row before its prompt changed (the journal names it: `report.review_history`), and the thumbnails of each
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
not the page, works out what an undo brings back, from the record as it is when the undo arrives (`POST
/api/undo`: 409 with the reason when another reviewer decided since); undo survives a reload because each
undo is recorded as one (`Decision.undo`) and the server replays the record for the page (`GET
/api/undo`). A missing thumbnail is made on the spot in a folder (as the report would) and in a bucket
the image itself is served instead. Other reviewers' decisions reach a page by `GET /api/changes`
(`report.review_live.js` polls it every 2 s); where two reviewers' own decisions on an image differ, the
latest is in force and the card shows both ("alice approved, bob rejected"). A star rating (the page's
keys 1-5) is posted as a decision `rated` with its `stars`, recorded as a line of its own
(`work.decisions.RATED`); the latest rating counts, whoever gave it, as the latest decision does, and the
page shows who. With `rebuild`, report.html is built again while decisions change
(`report.review_report`), so the file a colleague opens stays true.
"""

from __future__ import annotations

import getpass
import itertools
import os
import secrets
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from pathlib import Path
from types import FrameType
from typing import Any

from imagebatch.gateway.constants import ENV_REVIEWER
from imagebatch.report.cardstore import CardStore, ReviewCard
from imagebatch.report.review_auth import LOOPBACK, TOKEN_HEADER, Gate, url_host
from imagebatch.report.review_body import MAX_BODY, ascii_number, fields_refusal
from imagebatch.report.review_data import ReviewError, load_cards, reference_thumbnail
from imagebatch.report.review_decisions import DecisionCache, decision_json
from imagebatch.report.review_http import LISTEN_BACKLOG, Page, ReviewHTTPServer
from imagebatch.report.review_page import page_parts
from imagebatch.report.review_report import REPORT_INTERVAL, ReportKeeper
from imagebatch.storage import layout
from imagebatch.storage.backend import Backend
from imagebatch.storage.bounded import RecordError
from imagebatch.words import counted
from imagebatch.work.decisions import DECISIONS, RATED, STARS, Decision
from imagebatch.work.thumbnails import save_thumbnail, thumb_name

HOST = "127.0.0.1"
CONTENT_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}

__all__ = [
    "LISTEN_BACKLOG",
    "MAX_BODY",
    "TOKEN_HEADER",
    "ReviewError",
    "ReviewServer",
    "default_reviewer",
    "serve_review",
]


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
        location: Backend,
        reviewer: str,
        port: int = 0,
        refresh_interval: float = 1.0,
        show: Sequence[str] | None = None,
        group_by: str | None = None,
        *,
        host: str = HOST,
        reviewers: Mapping[str, str] | None = None,
        origins: Sequence[str] = (),
        rebuild: Callable[[], object] | None = None,
        report_interval: float = REPORT_INTERVAL,
    ) -> None:
        if host not in LOOPBACK and not reviewers:
            raise ReviewError(f"--host {host} is beyond loopback: name the reviewers (--reviewers FILE)")
        self.location = location
        self.reviewer = reviewer
        self.show, self.group_by = show, group_by
        self.token = secrets.token_urlsafe(32)
        self.decisions = DecisionCache(location, interval=refresh_interval)
        self._cards_lock = threading.Lock()
        self._cards_seen: object = None
        self.cards: CardStore = CardStore().done()
        """The cards by key, in the page's order, on disk (`report.cardstore`)."""
        self.earlier: dict[str, tuple[str, ...]] = {}
        """The images approved before a row's prompt changed, by key (`CardSet.earlier`): served too."""
        self.columns: list[str] = []
        self.aside = ""
        self._load_cards()
        self._httpd = ReviewHTTPServer((HOST if host == "localhost" else host, port), self)
        self.port = int(self._httpd.server_address[1])
        self.url = f"http://{url_host(host, self.port)}/"
        self.gate = Gate(host, self.port, self.token, reviewers, origins)
        self.report = None if rebuild is None else ReportKeeper(rebuild, self._version, report_interval)
        """Keeps report.html true while the review runs (`report.review_report`), given `rebuild`."""
        self._thread: threading.Thread | None = None
        self.refused = 0
        """Requests refused (401 or 403) since the server started."""

    def start(self) -> ReviewServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="imagebatch-review"
        )
        self._thread.start()
        if self.report is not None:
            self.report.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
        if self.report is not None:
            self.report.stop()

    def __enter__(self) -> ReviewServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # --- what the handler asks -------------------------------------------------------------------

    def _load_cards(self) -> None:
        """Read results.csv again if it changed (a folder: its size and time; a bucket: at start only)."""
        seen = self.location.stamp(layout.RESULTS_CSV)
        with self._cards_lock:
            if seen is not None and seen == self._cards_seen:
                return
            found = load_cards(self.location, self.show, self.group_by, self.decisions.approved())
            self.cards = found.cards  # the store it replaces is removed once no page streams from it
            self.earlier = found.earlier
            self.columns = found.columns
            without, refused = found.without, found.refused
            aside = (
                [f"{counted(without, 'request')} without an image not shown (report.html)"] if without else []
            )
            if refused:
                aside.append(f"{counted(refused, 'image name')} outside images/ not served")
            self.aside = "; ".join(aside)
            self._cards_seen = seen

    def page(self, nonce: str, who: str | None = None) -> Page:
        """The page for reviewer `who` (None: a server without reviewers, whose page names its own), its
        cards' data streamed from the store."""
        self._load_cards()
        version, changed, stars = self.decisions.changes(-1)
        cards = self.cards
        known = cards.having([*changed, *stars])
        data = {
            "decisions": {k: decision_json(d) for k, (d, _) in changed.items() if k in known},
            "stars": {k: [r.stars, r.reviewer] for k, r in stars.items() if k in known},
            "views": {k: views for k, (_, mine) in changed.items() if k in known and (views := _views(mine))},
            "version": version,
            "reviewer": who or self.reviewer,
            "signedIn": who is not None,
            "aside": self.aside,
            "columns": self.columns,
            "group": self.group_by or "",
        }
        head, tail = page_parts(f"imagebatch review: {self.location.title}", self.token, nonce, data)
        return Page(
            len(head) + cards.json_length + len(tail), itertools.chain([head], cards.json_chunks(), [tail])
        )

    def changes(self, since: int, views: bool = True) -> dict[str, Any]:
        """`GET /api/changes?since=VERSION`: the version now and the decisions in force that changed after
        `since`, each with `views`, every reviewer's own decision on that image when two or more have one
        (`[[name, decision], ...]`, empty otherwise; `views=False`: left out); and `stars`, the ratings
        that changed (`[stars, reviewer]`: the latest rating, whoever gave it)."""
        version, changed, stars = self.decisions.changes(since)
        decisions = {
            k: decision_json(d) | ({"views": _views(mine)} if views else {})
            for k, (d, mine) in changed.items()
        }
        rated = {k: [r.stars, r.reviewer] for k, r in stars.items()}
        return {"version": version, "decisions": decisions, "stars": rated}

    def decide(self, body: dict[str, Any], who: str | None = None) -> tuple[HTTPStatus, dict[str, Any]]:
        """Record the decision a page posted, after checking each field: under `who`, the signed-in
        reviewer, when the server has reviewers (a name in the body is then ignored)."""
        key, kind = body.get("key"), body.get("decision")
        note, reviewer = body.get("note", ""), who or body.get("reviewer") or self.reviewer
        card = self.cards.get(key) if isinstance(key, str) else None
        if card is None:
            return HTTPStatus.BAD_REQUEST, {"error": "no image of this run has that key"}
        if kind not in DECISIONS:
            return HTTPStatus.BAD_REQUEST, {"error": f"decision must be one of {', '.join(DECISIONS)}"}
        if why := fields_refusal(body):
            return HTTPStatus.BAD_REQUEST, {"error": why}
        if kind == RATED or "stars" in body:
            return self._rate(card, body.get("stars"), reviewer.strip()) if kind == RATED else _NO_STARS
        batch = body.get("batch", "")  # the bulk approve it is part of: undone together
        decision = Decision(card.key, card.variant, kind, note.strip(), reviewer.strip(), batch=batch)
        in_force = self.decisions.record(decision)
        return HTTPStatus.OK, {"decision": decision_json(in_force), "version": self.decisions.version}

    def _rate(self, card: ReviewCard, stars: object, reviewer: str) -> tuple[HTTPStatus, dict[str, Any]]:
        """Record a rating of `card` (`work.decisions.RATED`): 1 to 5 stars, a JSON integer."""
        if type(stars) is not int or stars not in STARS:
            return HTTPStatus.BAD_REQUEST, {"error": "stars must be a whole number from 1 to 5"}
        self.decisions.record(Decision(card.key, card.variant, RATED, "", reviewer, stars=stars))
        return HTTPStatus.OK, {"stars": [stars, reviewer], "version": self.decisions.version}

    def undo(self, body: dict[str, Any], who: str | None = None) -> tuple[HTTPStatus, dict[str, Any]]:
        """Take back the reviewer's decision on one image (`key`), or their bulk approve (`batch`), where
        it is still the one in force (`work.decisions.History`). 200 with the decisions in force on the
        images it touched and `refused` (how many were not taken back, and `reason`); 409 with the
        reason when nothing was. `who`: as for `decide`."""
        key, batch = body.get("key", ""), body.get("batch", "")
        reviewer = who or body.get("reviewer") or self.reviewer
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
        images = card.images if card is not None else self.earlier.get(key, ())
        if (n := ascii_number(number)) is None or n >= len(images):
            return None
        rel = images[n]
        if not thumbnail:
            data = self.location.image(rel)
            return None if data is None else (data, CONTENT_TYPES[Path(rel).suffix])
        # The report's own thumbnail (made in place if missing, where OUT is a folder; never a file that
        # leads out of OUT), or where none can be made, the image itself.
        name = f"{layout.THUMBS_DIR}/{thumb_name(rel)}.jpg"
        served = self.location.thumbnail(name, rel, save_thumbnail)
        return None if served is None else (served[0], CONTENT_TYPES[Path(served[1]).suffix])

    def undo_stack(self, reviewer: str) -> list[dict[str, Any]]:
        """What `reviewer` (or, if empty, this server's reviewer) can still undo, oldest first: each card's
        key and the bulk approve it was part of, so that a reloaded page undoes as before."""
        stack = self.decisions.undo_stack(reviewer.strip() or self.reviewer)
        return [{"k": key, "b": batch} for key, batch in stack if key in self.cards]

    def reference(self, key: str, number: str) -> bytes | None:
        """The thumbnail of reference image (or mask) `number` of the request `key`: the report's own, in
        OUT's thumbs/ (made there from the manifest's file if missing, in a folder); None if there is none."""
        card = self.cards.get(key)
        if card is None or (n := ascii_number(number)) is None or n >= len(card.references):
            return None
        return reference_thumbnail(self.location, card.references[n])

    def _version(self) -> int:
        """The decisions' version, the record read again first (another server's decisions too)."""
        self.decisions.refresh()
        return self.decisions.version


_NO_STARS = HTTPStatus.BAD_REQUEST, {"error": "stars go with the decision 'rated' only"}


def _views(mine: list[Decision]) -> list[list[str]]:
    """Two or more reviewers' own decisions on one image, as the card shows them ("alice approved, bob
    rejected"); empty for one reviewer or none."""
    standing = [[d.reviewer, d.decision] for d in mine if d.decision != "cleared"]
    return standing if len(standing) > 1 else []


def _who(server: ReviewServer) -> str:
    """Who the announcement says decides: the one reviewer, or the named ones and how they sign in (the
    token itself is never printed)."""
    names = server.gate.names
    if not names:
        return f"reviewer {server.reviewer}"
    return f"reviewers {', '.join(names)}, each signing in at {server.url}?token=THEIR-TOKEN"


def serve_review(
    location: Backend,
    reviewer: str,
    port: int = 0,
    announce: Callable[[str], None] = lambda line: print(line, flush=True),
    *,
    show: Sequence[str] | None = None,
    group_by: str | None = None,
    **settings: Any,
) -> None:
    """`imagebatch review`: serve until SIGINT or SIGTERM. `ReviewError` (or `RecordError`) before
    serving if there is nothing to review, a column to show or group by is not results.csv's, an address
    beyond loopback has no reviewers, or the port cannot be had. `settings`: `ReviewServer`'s host,
    reviewers, origins, rebuild, report_interval."""
    host = settings.get("host", HOST)
    try:
        server = ReviewServer(location, reviewer, port, show=show, group_by=group_by, **settings)
    except RecordError:  # an OSError too, but about a record, not the address
        raise
    except OSError as exc:
        raise ReviewError(f"cannot listen on {url_host(host, port)}: {exc.strerror or exc}") from None
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
            announce(f"imagebatch review: {server.url} ({images}; {_who(server)}; Ctrl-C stops)")
            while not stop.wait(0.5):
                pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
