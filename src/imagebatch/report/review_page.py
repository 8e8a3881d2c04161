"""The review page `imagebatch review` serves: one HTML document, its cards' data inline as JSON, its
script allowed by a nonce (the Content-Security-Policy `report.review` sends allows nothing else).

The server streams the cards' data from its store on disk (`report.cardstore`) between the page's two
parts (`page_parts`). The page renders only the cards in and near the window (fixed-size cards,
absolutely placed in a grid as tall as all of them): 10,000 requests are 10,000 small objects in memory
and about 30 elements in the document, so the first cards show at once and scrolling stays smooth;
thumbnails are fetched as their cards are made (`loading=lazy` as well).

Keys (ignored while typing in a field): `j`/`k` (or the left and right arrows) next/previous card; `a`
approve, `r` reject (each recorded at once, then the next card is selected); `n` the note of the selected
card, or, right after `a` or `r` (nothing moved since), of the card just decided: a note belongs to the
card it was typed on, whatever the order of keys. Enter saves it: with the card's decision, recorded
again, or, on a card not yet decided, at once as a comment (`work.decisions.COMMENT`, shown to everyone),
which the card's next `a` or `r` carries as its note; Escape leaves it. `u` undo: the reviewer's last
decision is taken back, if it is still the one in force (the server decides, from the record: `POST
/api/undo`; a refusal's reason is shown in the header), and a reloaded page undoes as far back
(`work.decisions.History.undo_stack`); `x` marks a card, `g` its whole group (shift-click a range), `X`
every card shown, `A` approves the marked ones, each its own decision carrying the batch's id
(`Decision.batch`), so that one `u` takes the whole batch back (each image still in force; the header
says how many were not). `v` (or Enter, or a click on the image or its reference) opens the large view:
the image fit to the window beside the versions it replaces (a redone image's earlier variants, each with
its decision and note; `c` hides them) and its request's reference images (the report's thumbnails of
the manifest's files, drawn at the image's size), `1` its own pixels (100 %), `+`/`-` zoom, `0` fit
again, the panes zoomed and scrolled together; the moving and deciding keys work there too, and Escape
leaves it. `1`-`5` rate the selected card (stars, apart from its decision: `work.decisions.RATED`; the
latest rating counts, whoever gave it, and the card shows it and who; in the large view `1` stays 100 %),
`/` goes to the search, `d` switches the density.

A card shows the manifest's columns (`imagebatch review --show`), each value whole (wrapped), its
request's reference images (their thumbnails in OUT, as the report makes them), for a redone image, the
version it replaces and the note that rejected it, and, for a row whose prompt changed, the image
approved for its earlier prompt (`report.review_history`; in the large view too, a pane of its own). With
`--group-by`, each group's cards start a row under its heading. Two densities: comfortable (four cards a
row at 1440 px) and compact (eight a row, three rows at 1440 x 900: the prompt and small print left to
the large view), kept in the browser.

What is shown: the state filter (`FILTERS`: what still needs a person, unreviewed or rejected and not yet
redone, or one review state, `report.setstate`), the stars (at least N, or unrated), a search over each
card's title, key and shown columns (the page's own data, not the document: a SKU among 10,000 cards in a
few milliseconds), and a list per shown column of at most 200 values (a column of more, such as a SKU, is
searched instead), combined, and kept in the address (`#filter=open&q=fn-1055&c.colour=sand&stars=4`) so
that a view can be shared and reloaded. Decisions are sent one at a time, in order; `review_live.js` asks
the server for the decisions that changed (another browser's) every 2 s while the page is visible, the
page itself when it regains focus, and each reaches the page through `window.reviewApplyDecision(key,
decision)`.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

from imagebatch.work.decisions import MAX_NOTE

ASSETS = resources.files("imagebatch.report")
STYLE = (ASSETS / "review_page.css").read_text(encoding="utf-8")
SCRIPT_FILES = ("review_page.js", "review_view.js", "review_find.js", "review_keys.js")
"""The page's script, in parts along its seams (cards and decisions, the large view, search and filters,
keys and start), run as one script in this order."""
SCRIPT = "\n".join((ASSETS / name).read_text(encoding="utf-8") for name in SCRIPT_FILES)
LIVE = (ASSETS / "review_live.js").read_text(encoding="utf-8")
"""The page's style and scripts, beside this module (read once: the page inlines them, its scripts under
the nonce, so that it needs nothing else from the server). `LIVE`, run after `SCRIPT`, polls the other
reviewers' decisions and hands each to `SCRIPT`'s `window.reviewApplyDecision(key, state)`."""
FILTERS = {
    "all": "all",
    "open": "open (to judge)",
    "unreviewed": "unreviewed",
    "approved": "approved",
    "rejected": "rejected (not redone)",
    "redone": "redone (replaced)",
    "not_chosen": "not chosen (another picked)",
}
"""The page's filters (`#filter=open`) and their labels; the page's script knows the same names."""
STAR_OPTIONS = (
    '<option value="">stars: any</option>'
    + "".join(
        f'<option value="{n}">{"★" * n}{" only" if n == 5 else " or more"}</option>' for n in range(1, 6)
    )
    + '<option value="none">unrated</option>'
)
"""The stars filter (`#stars=4`: at least 4; `none`: unrated); the page's script knows the same values."""
KEYS = (
    "j/k or ←/→ move · a approve · r reject · n note · u undo · v view large · x mark · g mark group"
    " · X mark all shown · A approve marked · p pick · s survey · 1-5 stars · / search · d density"
)
VIEW_KEYS = "j/k, arrows · a r n u p · 0 fit · 1 100 % · +/- zoom · c compare · s survey"


def inline_json(data: Any) -> str:
    """`data` as JSON to put inside `<script type="application/json">`: no `</script>` or `<!--` in it can
    end or bend the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(title: str, token: str, nonce: str, cards: str, data: dict[str, Any]) -> bytes:
    """The page: `cards` (the cards' data, already `inline_json`) and `data` (decisions, version, reviewer,
    aside) inline, `token` in a meta tag for the script to send with each decision."""
    head, tail = page_parts(title, token, nonce, data)
    return head + cards.encode() + tail


def page_parts(title: str, token: str, nonce: str, data: dict[str, Any]) -> tuple[bytes, bytes]:
    """The page (`render_page`) before its cards' data and after it, for a server that streams the cards
    between the two."""
    after = f",{inline_json(data)[1:]}" if data else "}"
    esc = html.escape
    options = "".join(f'<option value="{v}">{esc(label)}</option>' for v, label in FILTERS.items())
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f'<meta name="review-token" content="{esc(token)}"><style>{STYLE}</style></head><body>'
        f'<header><h1>{esc(title)}</h1><div class="bar"><span id="count"></span><span id="tally"></span>'
        f'<label>show <select id="filter">{options}</select> <span id="shown"></span></label>'
        '<input id="search" type="search" size="22" placeholder="search (/): id, SKU, any column"'
        ' autocomplete="off"><span id="colfilters"></span>'
        f'<select id="starfilter" title="filter on the stars">{STAR_OPTIONS}</select>'
        '<button type="button" id="markshown">Mark all shown (X)</button>'
        '<select id="density" title="density (d)"><option value="comfortable">comfortable</option>'
        '<option value="compact">compact</option></select>'
        '<span id="bulk" hidden><span id="nmarked"></span> <button type="button" id="approvemarked">'
        'Approve marked (A)</button> <button type="button" id="unmark">Unmark (Esc)</button></span>'
        '<label>reviewer <input id="reviewer" size="12" maxlength="100"></label>'
        f'<span class="keys">{esc(KEYS)}</span>'
        f'<span class="aside">{esc(data.get("aside", ""))}</span><span id="status" role="status"></span>'
        '</div></header><div id="grid"></div><p id="empty" hidden>No card under this filter.</p>'
        '<div id="viewer" hidden><div id="vbar"><button type="button" id="vclose">Back (Esc)</button>'
        '<span id="vtitle"></span><span id="vcols"></span><span id="vzoom"></span><span id="vcompare"></span>'
        f'<span class="keys">{esc(VIEW_KEYS)}</span></div><div id="vpanes"></div></div>'
        '<div id="notebar" hidden><label>note for <b id="notefor"></b> <input id="note" '
        f'maxlength="{MAX_NOTE}" autocomplete="off"></label> Enter saves, Escape cancels</div>'
        '<script type="application/json" id="data">{"cards":'
    ).encode(), (
        f"{after}</script>"
        f'<script nonce="{esc(nonce)}">{SCRIPT}</script>'
        f'<script nonce="{esc(nonce)}">{LIVE}</script></body></html>'
    ).encode()
