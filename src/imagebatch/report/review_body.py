"""What a decision's POST body may be: a flat JSON object of bounded size, nesting and text, or one line
saying why not (answered 400), never an exception.

An undo's body too; and the text fields of both within the page's own limits (`fields_refusal`)."""

from __future__ import annotations

import json
import re
from typing import Any

from imagebatch.work.decisions import MAX_NOTE

MAX_BODY = 16 * 1024
"""The largest decision a POST may carry (a note is at most `MAX_NOTE` characters: `work.decisions`)."""
MAX_REVIEWER = 100
MAX_BATCH = 64
"""The longest id of a bulk approve (the page makes 16 hex digits)."""
MAX_DEPTH = 4
"""The deepest nesting of lists and objects a decision's body may have (a decision is one flat object)."""


def decision_body(raw: bytes) -> tuple[dict[str, Any], str | None]:
    """A POSTed body as a JSON object, or why it is not one (a 400's reason): not UTF-8, not JSON,
    nested deeper than `MAX_DEPTH` (checked before parsing: an 8,000-deep array under the size limit
    made the parser's recursion fail), or holding text that is not Unicode (a lone surrogate `\\ud800`,
    which no file can store). Never an exception: each one dropped the connection with a traceback."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return {}, "the body is not UTF-8"
    depth = deepest = 0
    for token in _JSON_NESTING.finditer(text):
        depth += 1 if token.group() in "[{" else -1 if token.group() in "]}" else 0
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return {}, f"the body nests deeper than {MAX_DEPTH} levels; a decision is one flat JSON object"
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return {}, f"the body is not JSON ({str(exc)[:100]})"
    if not isinstance(body, dict):
        return {}, "the body is not a JSON object"
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return {}, "the body holds text that is not Unicode (a lone surrogate, such as \\ud800)"
    return body, None


def fields_refusal(body: dict[str, Any]) -> str | None:
    """Why a body's text fields are not as the page sends them (a 400's reason), or None: `note` and
    `batch` text of at most `MAX_NOTE` (`work.decisions`) and `MAX_BATCH` characters, `reviewer` of at
    most `MAX_REVIEWER` (absent or empty: the server's own), and no `undo` flag on a decision: what an
    undo brings back is the record's to say, not the page's (`POST /api/undo`)."""
    for name, limit in (("note", MAX_NOTE), ("batch", MAX_BATCH), ("reviewer", MAX_REVIEWER)):
        value = body.get(name, "")
        if (name != "reviewer" or value) and (not isinstance(value, str) or len(value) > limit):
            return f"{name} must be text of at most {limit} characters"
    if body.get("undo", False) is not False:
        return "an undo is POST /api/undo"
    return None


_JSON_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')
"""A JSON text's strings (skipped) and brackets."""


def ascii_number(text: str) -> int | None:
    """`text` as a number if it is ASCII digits only: `str.isdigit` takes `²` (a raw byte 0xB2 in a
    request's path or header, read as Latin-1), which `int` then refuses with a ValueError."""
    return int(text) if text.isascii() and text.isdigit() and len(text) < 10 else None
