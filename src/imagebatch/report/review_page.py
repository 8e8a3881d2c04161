"""The review page `imagebatch review` serves: one HTML document, its cards' data inline as JSON, its
script allowed by a nonce (the Content-Security-Policy `report.review` sends allows nothing else).

The page renders only the cards in and near the window (fixed-size cards, absolutely placed in a grid
as tall as all of them): 10,000 requests are 10,000 small objects in memory and about 30 elements in the
document, so the first cards show at once and scrolling stays smooth; thumbnails are fetched as their
cards are made (`loading=lazy` as well).

Keys (ignored while typing in a field): `j`/`k` next/previous card; `a` approve, `r` reject (each
recorded at once, then the next card is selected); `n` the note of the selected card (Enter saves it:
with the card's decision, recorded again, or, on a card not yet decided, kept for its next `a` or `r`;
Escape leaves it); `u` undo: this page's last decision is taken back by recording what the card had
before it (its earlier decision and note, or `cleared` if it had none); `u` again takes back the one
before. The filter (all, unreviewed, approved, rejected) is also read from the address
(`#filter=unreviewed`). Decisions are sent one at a time, in order; the page asks the server for the
decisions that changed (another browser's) every 3 s while it is visible, and when it regains focus.
"""

from __future__ import annotations

import html
import json
from typing import Any

STYLE = """
* { box-sizing: border-box }
body { font: 14px system-ui, sans-serif; margin: 0; background: #fafafa }
header { position: sticky; top: 0; z-index: 2; background: #fff; border-bottom: 1px solid #ddd;
  padding: 8px 12px }
h1 { font-size: 18px; margin: 0 0 6px }
.bar { display: flex; flex-wrap: wrap; gap: 14px; align-items: center }
#count { font-weight: bold }
.keys, .aside { color: #666; font-size: 12px }
#status { color: #b00 }
#grid { position: relative; margin: 10px 12px }
#empty { margin: 20px 12px; color: #666 }
.card { position: absolute; top: 0; left: 0; width: 300px; height: 410px; background: #fff;
  border: 1px solid #ddd; border-radius: 6px; padding: 8px; overflow: hidden;
  display: flex; flex-direction: column }
.card.sel { outline: 3px solid #36c; border-color: #36c }
.card.d-approved { background: #f1fbf1; border-color: #080 }
.card.d-rejected { background: #fdf1f1; border-color: #b00 }
.media { height: 200px; flex: none; display: flex; gap: 2px; align-items: center; justify-content: center;
  background: #f4f4f4 }
.media a { flex: 1 1 0; min-width: 0; height: 100%; display: flex; align-items: center;
  justify-content: center }
.media img { max-width: 100%; max-height: 200px; object-fit: contain }
.id { margin-top: 4px; font-weight: bold }
.st { float: right; font-weight: normal; color: #666 }
.var { background: #36c; color: #fff; border-radius: 3px; padding: 0 4px; margin-right: 4px; font-size: 12px;
  font-weight: normal }
.prompt { margin: 4px 0; display: -webkit-box; -webkit-line-clamp: 3; -webkit-box-orient: vertical;
  overflow: hidden }
.facts { color: #666; font-size: 12px }
.rv { margin-top: auto; font-weight: bold; color: #888; display: -webkit-box; -webkit-line-clamp: 2;
  -webkit-box-orient: vertical; overflow: hidden; flex: none }
.d-approved .rv { color: #080 }
.d-rejected .rv { color: #b00 }
.rv .note { font-weight: normal; color: #333 }
.saving .rv::after { content: " (saving)"; color: #999; font-weight: normal }
.btns { display: flex; gap: 6px; margin-top: 4px }
.btns button { flex: 1 }
#notebar { position: fixed; bottom: 0; left: 0; right: 0; z-index: 3; background: #fff;
  border-top: 2px solid #36c; padding: 10px }
#notebar input { width: 60% }
"""

SCRIPT = r"""
'use strict';
const $ = id => document.getElementById(id);
const D = JSON.parse($('data').textContent);
const TOKEN = document.querySelector('meta[name="review-token"]').content;
const W = 300, H = 410, GAP = 10;  // a card's box, as the style sets it
const cards = D.cards, byKey = new Map(cards.map((c, i) => [c.k, i]));
const state = new Map(Object.entries(D.decisions));  // key -> {decision, note, reviewer, at}
const drafts = new Map(), pending = new Map(), shown = new Map(), undo = [];
const grid = $('grid'), fmt = n => n.toLocaleString('en-US');
let view = [], sel = 0, filter = 'all', version = D.version, cols = 1, frame = 0;
let chain = Promise.resolve(), saved = 0, failed = false, noteKey = null;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function say(text) { $('status').textContent = text; }
function current(k) { const d = state.get(k); return d && d.decision !== 'cleared' ? d : null; }
function selectedKey() { return view.length ? cards[view[sel]].k : undefined; }
function matches(i) {
  const d = current(cards[i].k);
  return filter === 'all' || (filter === 'unreviewed' ? !d : !!d && d.decision === filter);
}
function count() {
  let a = 0, r = 0;
  for (const c of cards) {
    const d = current(c.k);
    if (d) { if (d.decision === 'approved') a++; else r++; }
  }
  $('count').textContent = `${fmt(a + r)} of ${fmt(cards.length)} reviewed`;
  $('tally').textContent = `${fmt(a)} approved · ${fmt(r)} rejected`;
  $('shown').textContent = `${fmt(view.length)} shown`;
}

// --- cards: only those in and near the window are in the document ---------------------------------
function fill(e, k) {
  const d = current(k), rv = e.querySelector('.rv');
  e.classList.toggle('d-approved', !!d && d.decision === 'approved');
  e.classList.toggle('d-rejected', !!d && d.decision === 'rejected');
  e.classList.toggle('saving', !!pending.get(k));
  e.dataset.decision = d ? d.decision : '';
  rv.textContent = '';
  if (d) {
    rv.append(d.decision + (d.reviewer ? ' by ' + d.reviewer : ''));
    if (d.note) rv.append(': ', el('span', 'note', d.note));
  } else {
    rv.append('unreviewed');
    if (drafts.get(k)) rv.append(' · note: ', el('span', 'note', drafts.get(k)));
  }
  rv.title = rv.textContent;
}
function build(i) {
  const c = cards[i], e = el('div', 'card'), media = el('div', 'media'), k = encodeURIComponent(c.k);
  e.dataset.key = c.k;
  for (let j = 0; j < Math.min(c.n, 4); j++) {
    const a = el('a'), img = el('img');
    a.href = `/image/${k}/${j}`; a.target = '_blank'; a.rel = 'noopener';
    img.loading = 'lazy'; img.alt = `image ${j + 1} of ${c.t}`; img.src = `/thumb/${k}/${j}`;
    a.append(img); media.append(a);
  }
  const id = el('div', 'id');
  if (c.nv > 1 || c.v > 1) id.append(el('span', 'var', 'variant ' + c.v));
  id.append(c.t + ' ', el('span', 'st', c.s));
  const buttons = el('div', 'btns');
  const acts = [['approved', 'Approve (a)'], ['rejected', 'Reject (r)'], ['note', 'Note (n)']];
  for (const [act, label] of acts) {
    const b = el('button', '', label);
    b.type = 'button'; b.dataset.act = act; buttons.append(b);
  }
  e.append(media, id, el('div', 'prompt', c.p), el('div', 'facts', c.f), el('div', 'rv'), buttons);
  fill(e, c.k);
  return e;
}
function gridTop() { return grid.getBoundingClientRect().top + window.scrollY; }
function layout() {
  frame = 0;
  cols = Math.max(1, Math.floor((grid.clientWidth + GAP) / (W + GAP)));
  grid.style.height = Math.ceil(view.length / cols) * (H + GAP) + 'px';
  const top = window.scrollY - gridTop();
  const first = Math.max(0, Math.floor(top / (H + GAP)) - 1) * cols;
  const last = Math.min(view.length, (Math.floor((top + innerHeight) / (H + GAP)) + 2) * cols);
  const want = new Set();
  for (let p = first; p < last; p++) want.add(view[p]);
  for (const [i, e] of shown) if (!want.has(i)) { e.remove(); shown.delete(i); }
  for (let p = first; p < last; p++) {
    const i = view[p];
    let e = shown.get(i);
    if (!e) { e = build(i); shown.set(i, e); grid.append(e); }
    e.style.transform = `translate(${(p % cols) * (W + GAP)}px,${Math.floor(p / cols) * (H + GAP)}px)`;
    e.classList.toggle('sel', p === sel);
  }
  $('empty').hidden = view.length > 0;
}
function later() { if (!frame) frame = requestAnimationFrame(layout); }
function refilter(keepKey) {
  view = [];
  for (let i = 0; i < cards.length; i++) if (matches(i)) view.push(i);
  const p = keepKey === undefined ? -1 : view.indexOf(byKey.get(keepKey));
  sel = p >= 0 ? p : Math.max(0, Math.min(sel, view.length - 1));
  for (const [i, e] of shown) fill(e, cards[i].k);
  layout();
  count();
}
function reveal() {
  const header = document.querySelector('header').offsetHeight;
  const y = gridTop() + Math.floor(sel / cols) * (H + GAP);
  if (y - header - GAP < window.scrollY) window.scrollTo(0, y - header - GAP);
  else if (y + H + GAP > window.scrollY + innerHeight) window.scrollTo(0, y + H + GAP - innerHeight);
  layout();
}
function move(step) {
  if (!view.length) return;
  sel = Math.max(0, Math.min(view.length - 1, sel + step));
  reveal();
}

// --- decisions: sent one at a time, in order; the server's answer is what stands ------------------
function post(k, decision, note) {
  pending.set(k, (pending.get(k) || 0) + 1);
  const body = JSON.stringify({key: k, decision, note, reviewer: $('reviewer').value.trim()});
  const sent = chain.then(() => fetch('/api/decision', {
    method: 'POST', body, cache: 'no-store',
    headers: {'Content-Type': 'application/json', 'X-Review-Token': TOKEN},
  })).then(async r => {
    const answer = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(answer.error || 'HTTP ' + r.status);
    return answer;
  });
  chain = sent.catch(() => {});
  return sent.then(answer => {
    if (pending.get(k) === 1) state.set(k, answer.decision);
    document.body.dataset.saved = ++saved;
    say('');
  }, error => {
    failed = true;
    say(`not saved (${cards[byKey.get(k)].t}): ${error.message}`);
  }).finally(() => {
    const left = pending.get(k) - 1;
    if (left) pending.set(k, left); else pending.delete(k);
    if (!pending.size && failed) { failed = false; refresh(true); } else refilter(selectedKey());
  });
}
function record(k, decision, note) {
  state.set(k, {decision, note, reviewer: $('reviewer').value.trim(), at: ''});
  post(k, decision, note);
}
function decide(decision) {
  const k = selectedKey();
  if (k === undefined) return;
  const before = state.get(k) || null, next = sel + 1 < view.length ? cards[view[sel + 1]].k : k;
  const note = drafts.has(k) ? drafts.get(k) : (before && before.decision !== 'cleared' ? before.note : '');
  drafts.delete(k);
  undo.push({k, before});
  record(k, decision, note);
  refilter(next);
  reveal();
}
function undoLast() {
  const u = undo.pop();
  if (!u) { say('nothing to undo'); return; }
  const b = u.before && u.before.decision !== 'cleared' ? u.before : null;
  record(u.k, b ? b.decision : 'cleared', b ? b.note : '');
  refilter(u.k);
  reveal();
}
function openNote() {
  const k = selectedKey();
  if (k === undefined) return;
  const d = current(k);
  noteKey = k;
  $('notefor').textContent = cards[byKey.get(k)].t;
  $('note').value = drafts.has(k) ? drafts.get(k) : (d ? d.note : '');
  $('notebar').hidden = false;
  $('note').focus();
}
function closeNote() { $('notebar').hidden = true; noteKey = null; $('note').blur(); }
$('note').addEventListener('keydown', ev => {
  if (ev.key === 'Escape') { ev.preventDefault(); closeNote(); return; }
  if (ev.key !== 'Enter') return;
  ev.preventDefault();
  const k = noteKey, note = $('note').value.trim(), d = current(k);
  closeNote();
  if (d) { undo.push({k, before: state.get(k)}); record(k, d.decision, note); } else drafts.set(k, note);
  refilter(selectedKey());
});
async function refresh(full) {
  if (document.hidden && !full) return;
  try {
    const r = await fetch('/api/decisions?since=' + (full ? -1 : version), {cache: 'no-store'});
    if (!r.ok) throw new Error('HTTP ' + r.status);
    const answer = await r.json(), keep = selectedKey();
    for (const [k, d] of Object.entries(answer.decisions)) if (!pending.get(k)) state.set(k, d);
    if (full) {
      for (const k of [...state.keys()]) if (!pending.get(k) && !(k in answer.decisions)) state.delete(k);
    }
    version = answer.version;
    if (full || Object.keys(answer.decisions).length) refilter(keep);
  } catch (error) {
    say('cannot reach the review server: ' + error.message);
  }
}

// --- keys, clicks, filter --------------------------------------------------------------------------
const KEYS = {j: () => move(1), k: () => move(-1), a: () => decide('approved'), r: () => decide('rejected'),
              n: openNote, u: undoLast};
document.addEventListener('keydown', ev => {
  const t = ev.target;
  if (t instanceof HTMLInputElement || t instanceof HTMLSelectElement) return;
  if (t instanceof HTMLTextAreaElement) return;
  if (ev.ctrlKey || ev.metaKey || ev.altKey || !KEYS[ev.key]) return;
  ev.preventDefault();
  KEYS[ev.key]();
});
grid.addEventListener('click', ev => {
  const e = ev.target.closest('.card');
  const p = e ? view.indexOf(byKey.get(e.dataset.key)) : -1;
  if (p < 0) return;
  sel = p;
  layout();
  const b = ev.target.closest('button');
  if (b) { if (b.dataset.act === 'note') openNote(); else decide(b.dataset.act); }
});
$('filter').addEventListener('change', ev => {
  filter = ev.target.value;
  history.replaceState(null, '', '#filter=' + filter);
  ev.target.blur();
  refilter(selectedKey());
  window.scrollTo(0, 0);
});
$('reviewer').value = localStorage.getItem('imagebatch-reviewer') || D.reviewer;
$('reviewer').addEventListener('change', ev => {
  localStorage.setItem('imagebatch-reviewer', ev.target.value.trim());
});
window.addEventListener('scroll', later, {passive: true});
window.addEventListener('resize', later);
window.addEventListener('focus', () => refresh(false));
document.addEventListener('visibilitychange', () => { if (!document.hidden) refresh(false); });
setInterval(() => refresh(false), 3000);
try {
  const f = new URLSearchParams(location.hash.slice(1)).get('filter');
  if (['all', 'unreviewed', 'approved', 'rejected'].includes(f)) { filter = f; $('filter').value = f; }
} catch (error) {}
refilter();
performance.mark('first-cards');
document.body.dataset.ready = '1';
"""


def inline_json(data: Any) -> str:
    """`data` as JSON to put inside `<script type="application/json">`: no `</script>` or `<!--` in it can
    end or bend the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(title: str, token: str, nonce: str, cards: str, data: dict[str, Any]) -> bytes:
    """The page: `cards` (the cards' data, already `inline_json`: made once per results.csv) and `data`
    (decisions, version, reviewer, aside) inline, `token` in a meta tag for the script to send with each
    decision."""
    inline = f'{{"cards":{cards},{inline_json(data)[1:]}' if data else f'{{"cards":{cards}}}'
    esc = html.escape
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f'<meta name="review-token" content="{esc(token)}"><style>{STYLE}</style></head><body>'
        f'<header><h1>{esc(title)}</h1><div class="bar"><span id="count"></span><span id="tally"></span>'
        '<label>show <select id="filter"><option value="all">all</option>'
        '<option value="unreviewed">unreviewed</option><option value="approved">approved</option>'
        '<option value="rejected">rejected</option></select> <span id="shown"></span></label>'
        '<label>reviewer <input id="reviewer" size="12" maxlength="100"></label>'
        '<span class="keys">j/k move · a approve · r reject · n note · u undo</span>'
        f'<span class="aside">{esc(data.get("aside", ""))}</span><span id="status" role="status"></span>'
        '</div></header><div id="grid"></div><p id="empty" hidden>No card under this filter.</p>'
        '<div id="notebar" hidden><label>note for <b id="notefor"></b> '
        '<input id="note" maxlength="2000" autocomplete="off"></label> Enter saves, Escape cancels</div>'
        f'<script type="application/json" id="data">{inline}</script>'
        f'<script nonce="{esc(nonce)}">{SCRIPT}</script></body></html>'
    ).encode()
