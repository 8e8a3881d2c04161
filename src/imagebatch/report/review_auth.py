"""Who may use a review server, and how they say who they are: named reviewers, each with a token of their
own, read from a file that only its owner can read (`load_reviewers`), and the checks every request passes
(`Gate`).

Without reviewers the server is the single person's on 127.0.0.1 (as before: anyone who can reach the
loopback port is its user, and the Host and CSRF checks keep other web pages out). With reviewers, every
request, pages and images included, needs a reviewer's token, and the decisions carry that reviewer's
name, never one the page sends. An address beyond loopback (anything but 127.0.0.1, ::1 or localhost,
127.0.0.2 included) is served only with reviewers.

A browser signs in once with the link `http://HOST:PORT/?token=TOKEN`: the server answers with an
`HttpOnly; SameSite=Strict` cookie holding the token and a page that moves on to `/` at once
(`<meta http-equiv="refresh">`), so the token leaves the address bar and the history. Not a 303: a
`SameSite=Strict` cookie set on a navigation that came from another site (a link in a chat) is not sent
on that navigation's redirect, and the reviewer would land on the sign-in refusal. Scripts send
`Authorization: Bearer TOKEN`. Tokens are compared as SHA-256 digests with `hmac.compare_digest`, every
reviewer's each time, and never logged or printed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from collections.abc import Iterable, Mapping
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from imagebatch.report.review_data import ReviewError

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
"""The addresses served without reviewers; any other, 127.0.0.2 included, needs them."""
TOKEN_HEADER = "X-Review-Token"
MIN_TOKEN = 16
"""The shortest token a reviewers file may give (`secrets.token_urlsafe(24)` makes 32 characters)."""
MAX_NAME = 100
_TOKEN = re.compile(r"[A-Za-z0-9._~-]+")
"""What a token may hold: what a URL's query and a cookie carry as they are."""
COOKIE_AGE = 7 * 24 * 3600
"""Seconds a browser stays signed in (a working week; the link signs it in again)."""


def load_reviewers(path: str | Path) -> dict[str, str]:
    """The reviewers a file names, as `{name: token}`: one `NAME TOKEN` per line (blank lines and `#`
    comments skipped). Refused (`ReviewError`, one line) as ssh refuses a private key: a file that another
    user owns or that the group or others may read or write; also a line that is not two words, a name
    or token given twice, a token shorter than `MIN_TOKEN` characters, or no reviewer at all."""
    path = Path(path).expanduser()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ReviewError(f"cannot read the reviewers file {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ReviewError(f"the reviewers file {path} is not a file")
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            mode = stat.S_IMODE(info.st_mode)
            raise ReviewError(
                f"the reviewers file {path} holds tokens but others may read it (mode {mode:o}, owner uid "
                f"{info.st_uid}): chmod 600 {path}"
            )
        raw = fh.read(1 << 20)
    return _parse(path, raw.decode("utf-8", "replace").splitlines())


def _parse(path: Path, lines: Iterable[str]) -> dict[str, str]:
    reviewers: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        where = f"the reviewers file {path} line {number}"
        if len(words) != 2:
            raise ReviewError(f"{where}: expected NAME TOKEN, found {len(words)} words")
        name, token = words
        if len(name) > MAX_NAME:
            raise ReviewError(f"{where}: a name is at most {MAX_NAME} characters")
        if len(token) < MIN_TOKEN or not _TOKEN.fullmatch(token):
            why = f"at least {MIN_TOKEN} letters, digits, '.', '_', '~' or '-' (secrets.token_urlsafe)"
            raise ReviewError(f"{where}: {name}'s token must be {why}")
        if name in reviewers or token in reviewers.values():
            raise ReviewError(f"{where}: {name} or their token is given twice")
        reviewers[name] = token
    if not reviewers:
        raise ReviewError(f"the reviewers file {path} names no reviewer (one NAME TOKEN a line)")
    return reviewers


def url_host(host: str, port: int) -> str:
    """`host:port` as a URL or a Host header writes it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Gate:
    """The checks a review server's requests pass: the Host allow-list, the reviewer a request is from,
    and a POST's CSRF checks. `host` and `port`: where the server listens; `origins`: the addresses
    browsers reach it at besides (a TLS proxy's `https://review.example.com`)."""

    def __init__(
        self,
        host: str,
        port: int,
        csrf_token: str,
        reviewers: Mapping[str, str] | None = None,
        origins: Iterable[str] = (),
    ) -> None:
        self.csrf_token = csrf_token
        self.required = bool(reviewers)
        self._digests = [(name, _digest(token)) for name, token in (reviewers or {}).items()]
        self.names = [name for name, _ in self._digests]
        names = {url_host(host, port)}
        if host in LOOPBACK:
            names |= {f"127.0.0.1:{port}", f"localhost:{port}"}
        mine = {f"http://{name}" for name in names}
        for origin in origins:
            parts = urlsplit(origin)
            names.add(parts.netloc.lower())
            mine.add(f"{parts.scheme}://{parts.netloc}".lower())
        self.hosts, self.origins = frozenset(names), frozenset(mine)
        self.cookie = f"imagebatch-review-{port}"
        """Per port: a browser sends one host's cookies to each of its ports."""

    def host_ok(self, host: str | None) -> bool:
        return host is not None and host.lower() in self.hosts

    def reviewer(self, token: str) -> str | None:
        """The reviewer whose token this is, or None; every reviewer's digest compared, in constant time."""
        given, found = _digest(token), None
        for name, digest in self._digests:
            if hmac.compare_digest(given, digest):
                found = name
        return found

    def who(self, headers: Any) -> str | None:
        """The reviewer a request comes from (its `Authorization: Bearer` token, else its cookie), or None."""
        auth = headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            return self.reviewer(auth[7:].strip())
        try:
            jar = SimpleCookie(headers.get("Cookie", ""))
        except CookieError:
            return None
        morsel = jar.get(self.cookie)
        return None if morsel is None else self.reviewer(morsel.value)

    def sign_in(self, query: str) -> tuple[str, str] | None:
        """The reviewer and token of a sign-in link's `?token=`, or None if it has none or a wrong one."""
        token = parse_qs(query).get("token", [""])[0]
        name = self.reviewer(token) if token else None
        return None if name is None else (name, token)

    def cookie_header(self, token: str, secure: bool) -> str:
        """The `Set-Cookie` that signs a browser in (`Secure` behind a TLS proxy that says so)."""
        flags = f"; Path=/; Max-Age={COOKIE_AGE}; HttpOnly; SameSite=Strict{'; Secure' if secure else ''}"
        return f"{self.cookie}={token}{flags}"

    def post_refusal(self, headers: Any) -> str | None:
        """Why a POST is not from this server's page, or None if it is."""
        if headers.get("Origin", "").lower() not in self.origins:
            return "refused: not from this review page (Origin)"
        if headers.get("Sec-Fetch-Site", "same-origin") != "same-origin":
            return "refused: not from this review page (Sec-Fetch-Site)"
        if not hmac.compare_digest(headers.get(TOKEN_HEADER, "").encode(), self.csrf_token.encode()):
            return "refused: missing or wrong token (reload the page)"
        if headers.get_content_type() != "application/json":
            return "refused: a decision is sent as application/json"
        return None


def _digest(token: str) -> bytes:
    """A fixed-length digest, so that a comparison's time says nothing of a token's length either."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
