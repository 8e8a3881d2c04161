"""Build the contact sheet: thumbnails (made once each, into `out/thumbs/`), then pages of cards."""

from __future__ import annotations

import hashlib
import html
import itertools
import json
import math
from collections import Counter
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from imagebatch.report.details import Shown, manifest_details
from imagebatch.report.rowindex import RowIndex
from imagebatch.report.setstate import (
    DONE,
    REVIEW_STATES,
    last_run_line,
    review_counts,
    review_line,
    review_state,
    set_counts,
    status_label,
)
from imagebatch.storage import layout
from imagebatch.storage.bounded import read_record
from imagebatch.storage.csvcells import read_csv
from imagebatch.storage.folder import FolderBackend
from imagebatch.storage.location import confined, write_atomic
from imagebatch.work.decisions import Decision, decided
from imagebatch.work.runsummary import RunSummary
from imagebatch.work.thumbnails import TooLarge, ensure_thumbnail, thumb_name

if TYPE_CHECKING:
    from imagebatch.manifest import PlannedRequest

PAGE_SIZE = 500
"""Cards per page: a 100,000-request run makes 200 pages, none of them heavy."""
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
"""The outputs a card shows as a thumbnail (the others are text, or a `no_image` record)."""
REVIEWABLE = DONE
"""The statuses whose images a reviewer approves or rejects (the others have no image to judge)."""
REASONS = {
    "unknown": "sent, but no usable answer was recorded: it may have been made and billed; "
    f"{layout.UNKNOWN_HINT}.",
    "not_attempted": f"not sent: the run stopped first (see {layout.RUN_JSON}). A rerun sends it.",
}


@dataclass
class Card:
    row: dict[str, str]
    prompt: str = ""
    references: list[Path | str] = field(default_factory=list)
    mask: Path | str | None = None


def image_paths(row: Mapping[str, str]) -> list[str]:
    """The images of a results.csv row, as relative names (`images/<job>/<file>`)."""
    return [rel for rel in row.get("paths", "").split(";") if rel.endswith(IMAGE_SUFFIXES)]


def reviewable(row: Mapping[str, str]) -> bool:
    """Whether a row has images to review: done, with at least one image."""
    return row["status"] in REVIEWABLE and bool(image_paths(row))


def ref_thumb_name(ref: object) -> str:
    """The thumbnail's name (under `thumbs/`, without `.jpg`) of a reference image or mask a card shows."""
    return "ref-" + hashlib.sha256(str(ref).encode()).hexdigest()[:16]


def _thumb_html(out: Path, source: Path, name: str, label: str, link: str | None = None) -> str:
    """The card's `<img>` of `source`, a placeholder naming its size if it is too large, or nothing."""
    try:
        thumb = ensure_thumbnail(out, source, name)
    except TooLarge as exc:
        html_ = f'<div class="big">{_esc(label)} {_esc(exc)}</div>'
        return f'<a href="{_esc(link)}">{html_}</a>' if link else html_
    if thumb is None:
        return ""
    if link:
        return f'<a href="{_esc(link)}"><img loading="lazy" src="{_esc(thumb)}" alt="{label}"></a>'
    return f'<img class="ref" loading="lazy" src="{_esc(thumb)}" alt="{label}" title="{label}">'


def _rows(out: Path) -> Generator[dict[str, str], None, None]:
    yield from read_csv(out / layout.RESULTS_CSV, layout.RESULTS_READ_COLUMNS)


def _card(row: dict[str, str], details: Mapping[str, PlannedRequest | Shown]) -> Card:
    card = Card(row)
    req = details.get(row["idempotency_key"])
    if req is not None:
        card.prompt, card.references, card.mask = req.prompt, list(req.reference_images), req.mask
    return card


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def row_reason(row: Mapping[str, str]) -> str:
    """Why a request fell short, in words (the service's error, its text on a `no_image`, what `unknown`
    means); empty for one that succeeded."""
    status = row["status"]
    reason = row.get("error") or ""
    if status == "no_image" and row.get("finish_reason") and row["finish_reason"] not in reason:
        reason = f"finishReason {row['finish_reason']}. {reason}"
    reason = reason or REASONS.get(status, "")
    return reason if status != "succeeded" else ""


def row_facts(row: Mapping[str, str]) -> list[str]:
    """A card's small print: route, model, pixel size, attempts."""
    size = f"{row['width']}x{row['height']}" if row.get("width") else ""
    return [x for x in (row["route"], row["model"], size, f"attempts {row.get('attempts') or 0}") if x]


def row_title(row: Mapping[str, str]) -> str:
    """`job #request` (and ` turn N` for a chain's later turns)."""
    turn = f" turn {row['turn_index']}" if row.get("turn_index") not in (None, "", "0") else ""
    return f"{row['job_id']} #{row['request_index']}{turn}"


_SAID = {"not_chosen": "not chosen (another picked)", "comment": "unreviewed, a comment"}
"""How a card says a decision whose record name is not a word a reader would use."""


def _review_html(row: Mapping[str, str], decision: Decision | None, state: str) -> str:
    """The card's review, read-only: approved or rejected (by whom, the note; "rejected, redone" once a
    newer variant replaced it), or unreviewed."""
    if not reviewable(row):
        return ""
    if decision is None or decision.decision == "cleared":
        return f'<div class="rv rv-{state}">{"unreviewed" if state == "unreviewed" else "replaced"}</div>'
    by = f" by {_esc(decision.reviewer)}" if decision.reviewer else ""
    note = f': <span class="note">{_esc(decision.note)}</span>' if decision.note else ""
    redone = ", redone" if state == "redone" else ""
    said = _SAID.get(decision.decision, decision.decision)
    return f'<div class="rv rv-{state}">{_esc(said)}{redone}{by}{note}</div>'


def _card_html(out: Path, card: Card, decision: Decision | None = None, replaced: bool = False) -> str:
    row = card.row
    status = row["status"]
    media: list[str] = []
    texts: list[str] = []
    for rel in filter(None, row.get("paths", "").split(";")):
        source = out / rel
        if rel.endswith((".png", ".jpg", ".jpeg")):
            media.append(_thumb_html(out, source, thumb_name(rel), "image", link=rel))
        elif rel.endswith(".txt") and source.is_file():
            texts.append(source.read_text(errors="replace")[:2000])
        elif rel.endswith(".no_image.json") and source.is_file():
            said = json.loads(source.read_text()).get("text")
            texts.append(f"no image; the service said: {said}" if said else "no image")
    for i, ref in enumerate([*card.references, *([card.mask] if card.mask else [])]):
        name = ref_thumb_name(ref)
        label = "mask" if card.mask is not None and i == len(card.references) else "reference"
        media.append(_thumb_html(out, Path(ref), name, label))
    reason = row_reason(row)
    facts = " · ".join(_esc(x) for x in row_facts(row))
    review = review_state(decision, replaced) if reviewable(row) else ""
    variant = f" variant {row['variant']}" if row.get("variant") not in (None, "", "1") else ""
    return (
        f'<div class="card s-{_esc(status)}" data-status="{_esc(status)}" data-route="{_esc(row["route"])}" '
        f'data-model="{_esc(row["model"])}" data-review="{review}">'
        f'<div class="media">{"".join(media)}</div>'
        f'<div class="id">{_esc(row_title(row))}{_esc(variant)} '
        f'<span class="st">{_esc(status_label(status))}</span></div>'
        f'<div class="prompt">{_esc(card.prompt)}</div><div class="facts">{facts} · key '
        f"{_esc(row['idempotency_key'][:16])}</div>"
        + "".join(f'<pre class="text">{_esc(t)}</pre>' for t in texts)
        + (f'<div class="reason">{_esc(reason)}</div>' if reason else "")
        + _review_html(row, decision, review)
        + "</div>"
    )


STYLE = """body{font:14px system-ui,sans-serif;margin:1em;background:#fafafa}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:10px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}.card[hidden]{display:none}
.media img{max-width:100%;max-height:256px;margin:2px}
.media .big{display:inline-block;max-width:240px;margin:2px;padding:6px;border:1px dashed #b00;color:#b00}
.media img.ref{max-height:64px;border:1px dashed #999}
.st{float:right;font-weight:bold}.s-succeeded .st,.s-skipped .st{color:#080}
.s-failed .st,.s-unknown .st{color:#b00}
.prompt{margin:4px 0}.facts{color:#666;font-size:12px}.reason{color:#b00;margin-top:4px}
pre.text{white-space:pre-wrap;max-height:12em;overflow:auto;background:#f4f4f4;padding:4px}
nav a{margin-right:8px}
.rv{margin-top:4px;font-weight:bold}.rv-approved{color:#080}.rv-rejected{color:#b00}.rv-unreviewed{color:#888}
.rv-redone{color:#a60}
.rv .note{font-weight:normal;color:#333}"""
SCRIPT = """const keys=['status','route','model','review'],f={};function apply(){let n=0;
for(const c of document.querySelectorAll('.card')){const ok=keys.every(k=>!f[k]||c.dataset[k]===f[k]);
c.hidden=!ok;if(ok)n++;}document.getElementById('shown').textContent=n;}
for(const s of document.querySelectorAll('select')){
s.addEventListener('change',()=>{f[s.name]=s.value;apply();});}
try{const p=new URLSearchParams(location.hash.slice(1));
for(const s of document.querySelectorAll('select')){const v=p.get(s.name);
if(keys.includes(s.name)&&v&&[...s.options].some(o=>o.value===v)){f[s.name]=v;s.value=v;}}}catch(e){}
apply();window.addEventListener('load',()=>{const imgs=[...document.images];
document.body.dataset.images=imgs.length;document.body.dataset.loaded=imgs.filter(i=>i.complete&&i.naturalWidth>0).length;});"""
"""The filters: a select per key, and the page's `#status=failed&review=rejected...` hash read once at
load. Only the four keys are read, and a value only when its select offers it (an unknown or malformed
hash shows every card); the hash never reaches a selector (`#status]=x` had thrown)."""


def _page(title: str, summary: str, nav: str, cards: list[str], options: dict[str, list[str]]) -> str:
    selects = "".join(
        f'<label>{name} <select name="{name}"><option value="">all</option>'
        + "".join(
            f'<option value="{_esc(v)}">{_esc(status_label(v) if name == "status" else v)}</option>'
            for v in values
        )
        + "</select></label> "
        for name, values in options.items()
    )
    csp = "default-src 'none'; img-src 'self' file: data:; style-src 'unsafe-inline'; "
    csp += "script-src 'unsafe-inline'"
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" '
        f'content="{csp}"><title>{_esc(title)}</title><style>{STYLE}</style></head><body>'
        f"<h1>{_esc(title)}</h1>{summary}<p>{selects} <span id=shown></span> shown on this page</p>"
        f'<nav>{nav}</nav><div class="cards">{"".join(cards)}</div><nav>{nav}</nav>'
        f"<script>{SCRIPT}</script></body></html>"
    )


def build_report(
    out: Path,
    page_size: int = PAGE_SIZE,
    details: Mapping[str, PlannedRequest | Shown] | None = None,
    decisions: Mapping[str, Decision] | None = None,
) -> Path:
    """Write `report.html` (and further pages) into the output folder `out`; return the first page.

    `details`: what each card shows of its planned request (prompt, references) by idempotency key, when
    the caller has it: any mapping, such as an on-disk index of the plan (`report.details.index_details`);
    otherwise the manifest run.json names is loaded again, if it is unchanged, into such an index.
    `decisions`: the review's decisions in force by key (`work.decisions.decided`), shown read-only on
    each card; by default the folder's own (`review.jsonl`; a bucket's report, built in a staging folder,
    is handed the bucket's). results.csv is read twice, for the summary (its rows indexed on disk,
    `report.rowindex`, and counted a request at a time) and then a page at a time, so memory holds one
    page of cards, not the run's."""
    out = Path(out)
    run_json = out / layout.RUN_JSON
    run = RunSummary.parse(raw, str(run_json)) if (raw := read_record(run_json)) else None
    shown = manifest_details(run) if details is None else details
    decisions = decided(FolderBackend(out)) if decisions is None else decisions
    index = RowIndex()
    try:
        summary, options, total = _summary(out, run, decisions, index)
        names = [layout.report_page(n) for n in range(1, max(1, math.ceil(total / page_size)) + 1)]
        rows = _rows(out)
        for number, name in enumerate(names, 1):
            page = [_card(row, shown) for row in itertools.islice(rows, page_size)]
            first = (number - 1) * page_size
            _write_page(
                out,
                name,
                number,
                names,
                summary,
                options,
                page,
                decisions,
                index.replaced(first, first + page_size - 1),
            )
        rows.close()
    finally:
        index.close()
    for stale in out.glob(layout.REPORT_PAGES):
        if stale.name not in names:
            stale.unlink()
    return out / names[0]


def _write_page(
    out: Path,
    name: str,
    number: int,
    names: list[str],
    summary: str,
    options: dict[str, list[str]],
    page: list[Card],
    decisions: Mapping[str, Decision],
    replaced: set[str],
) -> None:
    """Write page `number` (`name`, one of `names`) of the report, its `page` of cards."""
    many = len(names) > 1
    nav = "".join(f'<a href="{name}">page {i}</a>' for i, name in enumerate(names, 1)) if many else ""
    title = f"imagebatch report: {out.name}" + (f" (page {number})" if many else "")
    cards = [
        _card_html(out, c, decisions.get(key := c.row["idempotency_key"]), key in replaced) for c in page
    ]
    # Whole or not at all (a full disk cut a page mid-tag), and never through a link out of OUT.
    write_atomic(confined(out, name), _page(title, summary, nav, cards, options).encode())


_KEPT = ("job_id", "request_index", "turn_index", "variant", "idempotency_key", "status", "paths")
"""What the summary keeps of a row (in its `RowIndex`) to count its request's state."""


def _summary(
    out: Path, run: RunSummary | None, decisions: Mapping[str, Decision], index: RowIndex
) -> tuple[str, dict[str, list[str]], int]:
    """The report's summary (the set's state, the last run's counts beside it), its filters' options and
    the number of results.csv's rows; `index` gets the rows, and marks those a newer variant replaced."""
    statuses: Counter[str] = Counter()
    by_model: Counter[str] = Counter()
    routes: set[str] = set()
    images = 0
    for row in _rows(out):
        statuses[row["status"]] += 1
        by_model[row["model"]] += 1
        routes.add(row["route"])
        images += int(row.get("images") or 0) if row["status"] in DONE else 0
        index.add(row, kept=True, stored={k: row.get(k, "") for k in _KEPT})
    reviews: Counter[str] = Counter()
    requests: Counter[str] = Counter()
    for variants, _ in index.done().requests():  # a request at a time: its variants, never the set's
        counted, replaced = review_counts([r for r in variants if reviewable(r)], decisions)
        reviews += counted
        requests += set_counts(variants)
        index.mark_replaced(replaced)
    summary = (
        f"<p>the set: {requests.total()} requests · {images} images · "
        + " · ".join(f"{_esc(s)} {n}" for s, n in sorted(requests.items()))
        + (f"</p><p>last run: {_esc(last)}" if (last := last_run_line(run)) else "")
        + "</p><p>by model: "
        + " · ".join(f"{_esc(m)} {n}" for m, n in sorted(by_model.items()))
        + f"</p><p>review: {review_line(reviews)} (<code>imagebatch review OUT</code> to review)</p>"
    )
    options = {"status": sorted(statuses), "route": sorted(routes), "model": sorted(by_model)}
    options["review"] = [r for r in REVIEW_STATES if reviews[r]]
    return summary, options, statuses.total()
