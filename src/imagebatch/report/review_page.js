'use strict';
// The review page's script (report/review_page.py says what the page does; these files, how): the cards,
// their decisions and notes here; the large view in review_view.js, search and filters in review_find.js,
// keys and start in review_keys.js (one script, in that order).
const $ = id => document.getElementById(id);
const D = JSON.parse($('data').textContent);
const TOKEN = document.querySelector('meta[name="review-token"]').content;
const SIZES = {comfortable: [320, 500], compact: [166, 200]};  // a card's box, as the style sets them
const GAP = 10, GH = 34;  // between cards, and a group's heading
let [W, H] = SIZES.comfortable;
const cards = D.cards, byKey = new Map(cards.map((c, i) => [c.k, i])), NONE = [];
for (const c of cards) if (!c.pk) c.pk = NONE;  // left out of the data where empty (as `r` and `x` are)
const state = new Map(Object.entries(D.decisions));  // key -> {decision, note, reviewer, at}
const stars = new Map(Object.entries(D.stars || {}));  // key -> [stars, reviewer]: the latest rating
const pending = new Map(), shown = new Map(), heads = new Map(), marked = new Set();
let undo = [];
const grid = $('grid'), fmt = n => n.toLocaleString('en-US');
const FILTERS = ['all', 'open', 'unreviewed', 'approved', 'rejected', 'redone', 'not_chosen'];
let view = [], sel = 0, filter = 'all', version = D.version, cols = 1, frame = 0;
let rows = [], cardRow = [], cardCol = [], height = 0;  // the grid's rows (headings and cards), laid out
let chain = Promise.resolve(), saved = 0, failed = false, noteKey = null;
let justDecided = null;  // {k, next}: the card `a`/`r` just decided, and the one it moved on to
let viewing = false, zoom = 0, compare = true, survey = false;  // the large view: zoom 0 is "fit to the window"

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function say(text) { $('status').textContent = text; }
function reviewer() { return $('reviewer').value.trim(); }
const NOT_DECIDED = ['cleared', 'comment'];  // in force, yet not a decision (work/decisions.py)
function current(k) { const d = state.get(k); return d && !NOT_DECIDED.includes(d.decision) ? d : null; }
function commentOf(k) { const d = state.get(k); return d && d.decision === 'comment' && d.note ? d : null; }
function selectedKey() { return view.length ? cards[view[sel]].k : undefined; }
// The review state of a card: report/setstate.py's `review_state`, the same rule (`x`: a newer variant
// replaced it). Open: unreviewed, or rejected and not yet redone.
function reviewState(i) {
  const c = cards[i], d = current(c.k);
  if (d && d.decision === 'approved') return 'approved';
  if (c.x) return 'redone';
  return d ? d.decision : 'unreviewed';
}
function matches(i) {
  if (!found(i)) return false;  // the search and the column filters (review_find.js)
  const s = reviewState(i);
  return filter === 'all' || s === filter || (filter === 'open' && (s === 'unreviewed' || s === 'rejected'));
}
function count() {
  const n = {unreviewed: 0, rejected: 0, approved: 0, redone: 0, not_chosen: 0};
  let reviewed = 0;
  for (let i = 0; i < cards.length; i++) { n[reviewState(i)]++; if (current(cards[i].k)) reviewed++; }
  $('count').textContent = `${fmt(reviewed)} of ${fmt(cards.length)} reviewed`;
  let tally = `${fmt(n.unreviewed + n.rejected)} open (${fmt(n.unreviewed)} unreviewed, ` +
              `${fmt(n.rejected)} rejected) · ${fmt(n.approved)} approved`;
  if (n.redone) tally += ` · ${fmt(n.redone)} redone`;
  if (n.not_chosen) tally += ` · ${fmt(n.not_chosen)} not chosen`;
  $('tally').textContent = tally;
  $('shown').textContent = `${fmt(view.length)} shown`;
  $('bulk').hidden = !marked.size;
  $('nmarked').textContent = `${fmt(marked.size)} marked`;
}
const BEFORE = 'approved before, for the earlier prompt';  // a changed row's earlier image (`h`)
function said(d) {  // "rejected by alice" (the note apart)
  return d.decision.replace('_', ' ') + (d.reviewer ? ' by ' + d.reviewer : '');
}

// --- cards: only those in and near the window are in the document ---------------------------------
function fill(e, i) {
  const c = cards[i], k = c.k, d = current(k), s = reviewState(i), rv = e.querySelector('.rv');
  for (const name of ['approved', 'rejected', 'redone', 'not_chosen']) e.classList.toggle('d-' + name, s === name);
  e.classList.toggle('saving', !!pending.get(k));
  e.classList.toggle('marked', marked.has(k));
  e.dataset.decision = d ? d.decision : '';
  e.dataset.state = s;
  rv.textContent = '';
  const cm = commentOf(k);
  if (d && s === 'redone' && d.decision === 'rejected') {
    rv.append(`redone after ${d.reviewer || 'a reviewer'} rejected it`);
  } else if (d && s === 'redone') rv.append(said(d) + ', redone');
  else if (d) rv.append(said(d));
  else rv.append(s === 'redone' ? 'replaced by a newer variant' : 'unreviewed');
  if (d && d.note) rv.append(': ', el('span', 'note', d.note));
  if (cm) rv.append(' · comment' + (cm.reviewer ? ' by ' + cm.reviewer : '') + ': ', el('span', 'note', cm.note));
  rv.title = rv.textContent;
  const st = stars.get(k);
  let se = e.querySelector('.stars');
  if (!st && se) se.remove();
  if (st && !se) { se = el('span', 'stars'); e.querySelector('.id .t').after(se); }
  if (st) {
    se.textContent = '★'.repeat(st[0]) + '☆'.repeat(5 - st[0]);
    se.title = `${st[0]} of 5 stars` + (st[1] ? ' by ' + st[1] : '') + ' (keys 1-5)';
  }
  const prev = e.querySelector('.prev');
  if (prev) {
    const p = c.pk[c.pk.length - 1], pd = current(p);
    prev.textContent = `replaces variant ${cards[byKey.get(p)].v}` + (pd ? ', ' + said(pd) : ', unreviewed');
    if (pd && pd.note) prev.append(': ', el('span', 'note', pd.note));
    prev.title = prev.textContent;
  }
}
function thumb(k, j, label, cls) {
  const a = el('a', cls), img = el('img'), q = encodeURIComponent(k);
  a.href = `/image/${q}/${j}`; a.target = '_blank'; a.rel = 'noopener';
  img.loading = 'lazy'; img.alt = label; img.src = `/thumb/${q}/${j}`;
  a.append(img);
  return a;
}
function build(i) {
  const c = cards[i], e = el('div', 'card'), media = el('div', 'media');
  e.dataset.key = c.k;
  const n = Math.min(c.n, c.pk.length || c.h ? 1 : 4);  // room for the version it replaces, or the one before
  for (let j = 0; j < n; j++) media.append(thumb(c.k, j, `image ${j + 1} of ${c.t}`));
  if (c.pk.length) {  // the version it replaces, beside it
    const p = cards[byKey.get(c.pk[c.pk.length - 1])], was = thumb(p.k, 0, `variant ${p.v} of ${c.t}`, 'was');
    was.append(el('span', 'tag', 'variant ' + p.v));
    media.append(was);
  }
  if (c.h) {  // the image approved for this row before its prompt changed
    const was = thumb(c.h[0], 0, `${BEFORE} of ${c.t}`, 'was before');
    was.append(el('span', 'tag', 'approved before'));
    media.append(was);
  }
  const id = el('div', 'id');
  if (c.nv > 1 || c.v > 1) id.append(el('span', 'var', `variant ${c.v} of ${Math.max(c.nv, c.v)}`));
  id.append(el('span', 't', c.t));
  if (c.s) id.append(el('span', 'st', c.s));
  id.title = c.t;
  const meta = el('div', 'cols');
  D.columns.forEach((name, j) => {
    if (c.m[j] === '') return;
    if (meta.childNodes.length) meta.append(' · ');
    meta.append(el('b', '', name + ' '), el('span', 'v', c.m[j]));
  });
  meta.title = meta.textContent;
  e.append(media, id, meta, el('div', 'prompt', c.p));
  if (c.r) {
    const refs = el('div', 'refs', 'refs');
    refs.title = 'the reference beside the image, large (v)';
    for (let j = 0; j < Math.min(c.r, 4); j++) {
      const img = el('img');
      img.loading = 'lazy'; img.alt = `reference ${j + 1}`; img.src = `/ref/${encodeURIComponent(c.k)}/${j}`;
      refs.append(img);
    }
    e.append(refs);
  }
  if (c.pk.length) e.append(el('div', 'prev'));
  if (c.h) e.append(el('div', 'earlier', BEFORE + (c.h[2] ? ` (by ${c.h[2]})` : '')));
  const buttons = el('div', 'btns');
  const acts = [['mark', '✓', 'mark (x)'], ['approved', 'Approve', 'a'], ['rejected', 'Reject', 'r'],
                ['note', 'Note', 'n'], ['view', 'View', 'v']];
  for (const [act, label, key] of acts) {
    const b = el('button', '', label);
    b.type = 'button'; b.dataset.act = act; b.title = key; buttons.append(b);
  }
  e.append(el('div', 'facts', c.f), el('div', 'rv'), buttons);
  fill(e, i);
  return e;
}
// Rows of cards, each group (with --group-by) starting a row under its heading.
function arrange() {
  cols = Math.max(1, Math.floor((grid.clientWidth + GAP) / (W + GAP)));
  rows = []; cardRow = new Array(view.length); cardCol = new Array(view.length);
  let y = 0, col = cols, group;
  for (let p = 0; p < view.length; p++) {
    const c = cards[view[p]];
    if (D.group && (p === 0 || c.g !== group)) {
      group = c.g;
      rows.push({top: y, head: group, first: p});
      y += GH; col = cols;
    }
    if (col === cols) { rows.push({top: y, first: p}); y += H + GAP; col = 0; }
    cardRow[p] = rows.length - 1; cardCol[p] = col++;
  }
  height = y;
  grid.style.height = height + 'px';
}
function firstRow(top) {  // the first row whose bottom is below `top`
  let lo = 0, hi = rows.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1, r = rows[mid];
    if (r.top + (r.head === undefined ? H : GH) < top) lo = mid + 1; else hi = mid;
  }
  return lo;
}
function heading(r, n) {
  const e = el('div', 'group');
  e.append(el('b', '', D.group + ' '), r.head || '(empty)', ' ', el('span', 'gn', `${n} shown · g marks them`));
  return e;
}
function layout() {
  frame = 0;
  const top = window.scrollY - gridTop(), want = new Set(), wantHeads = new Set();
  for (let r = firstRow(top - H); r < rows.length && rows[r].top < top + innerHeight + 2 * H; r++) {
    const row = rows[r];
    if (row.head !== undefined) { wantHeads.add(r); continue; }
    for (let p = row.first; p < view.length && cardRow[p] === r; p++) want.add(p);
  }
  const wanted = new Set([...want].map(p => view[p]));
  for (const [i, e] of shown) if (!wanted.has(i)) { e.remove(); shown.delete(i); }
  for (const [r, e] of heads) if (!wantHeads.has(r)) { e.remove(); heads.delete(r); }
  for (const r of wantHeads) {
    if (heads.has(r)) continue;
    let n = 0;
    for (let p = rows[r].first; p < view.length && cards[view[p]].g === rows[r].head; p++) n++;
    const e = heading(rows[r], n);
    e.style.top = rows[r].top + 'px';
    heads.set(r, e); grid.append(e);
  }
  for (const p of want) {
    const i = view[p];
    let e = shown.get(i);
    if (!e) { e = build(i); shown.set(i, e); grid.append(e); }
    e.style.transform = `translate(${cardCol[p] * (W + GAP)}px,${rows[cardRow[p]].top}px)`;
    e.classList.toggle('sel', p === sel);
  }
  $('empty').hidden = view.length > 0;
}
function later() { if (!frame) frame = requestAnimationFrame(layout); }
function gridTop() { return grid.getBoundingClientRect().top + window.scrollY; }
function refilter(keepKey) {
  view = [];
  for (let i = 0; i < cards.length; i++) if (matches(i)) view.push(i);
  const p = keepKey === undefined ? -1 : view.indexOf(byKey.get(keepKey));
  sel = p >= 0 ? p : Math.max(0, Math.min(sel, view.length - 1));
  for (const [i, e] of shown) fill(e, i);
  for (const e of heads.values()) e.remove();  // their counts change with the view
  heads.clear();
  arrange();
  layout();
  count();
  if (viewing) showLarge();
}
function reveal() {
  if (!view.length) return;
  const header = document.querySelector('header').offsetHeight, r = cardRow[sel];
  const y = gridTop() + rows[r].top, head = r > 0 && rows[r - 1].head !== undefined ? GH : 0;  // its heading too
  if (y - head - header - GAP < window.scrollY) window.scrollTo(0, y - head - header - GAP);
  else if (y + H + GAP > window.scrollY + innerHeight) window.scrollTo(0, y + H + GAP - innerHeight);
  layout();
}
function move(step) {
  justDecided = null;
  if (!view.length) return;
  sel = Math.max(0, Math.min(view.length - 1, sel + step));
  reveal();
  if (viewing) showLarge();
}

// --- decisions: sent one at a time, in order; the server's answer is what stands ------------------
function send(path, body) {  // in order, after the decisions sent before; the server's answer
  const sent = chain.then(() => fetch(path, {
    method: 'POST', body, cache: 'no-store',
    headers: {'Content-Type': 'application/json', 'X-Review-Token': TOKEN},
  })).then(async r => {
    const answer = await r.json().catch(() => ({}));
    if (!r.ok) throw Object.assign(new Error(answer.error || 'HTTP ' + r.status), {answer});
    return answer;
  });
  chain = sent.catch(() => {});
  return sent;
}
function post(k, decision, note, batch) {
  pending.set(k, (pending.get(k) || 0) + 1);
  const body = JSON.stringify({key: k, decision, note, reviewer: reviewer(), batch: batch || ''});
  return send('/api/decision', body).then(answer => {
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
function record(k, decision, note, batch) {
  state.set(k, {decision, note, reviewer: reviewer(), at: ''});
  post(k, decision, note, batch);
}
function noteOf(k) {  // the note a decision on `k` carries: its decision's, or its comment's
  const before = state.get(k);
  return before ? before.note : '';
}
function decide(decision) {
  const k = selectedKey();
  if (k === undefined) return;
  const next = sel + 1 < view.length ? cards[view[sel + 1]].k : k;
  undo.push({k, b: ''});
  record(k, decision, noteOf(k));
  refilter(next);
  reveal();
  justDecided = {k, next: selectedKey()};
}
// A star rating (keys 1-5), apart from the decision: recorded at once, the latest one (anyone's) counts.
function rate(n) {
  const k = selectedKey();
  if (k === undefined) return;
  stars.set(k, [n, reviewer()]);
  pending.set(k, (pending.get(k) || 0) + 1);
  const body = JSON.stringify({key: k, decision: 'rated', stars: n, reviewer: reviewer()});
  send('/api/decision', body).then(answer => {
    stars.set(k, answer.stars);
    document.body.dataset.rated = (+document.body.dataset.rated || 0) + 1;
  }, error => say(`not rated (${cards[byKey.get(k)].t}): ${error.message}`)).finally(() => {
    const left = pending.get(k) - 1;
    if (left) pending.set(k, left); else pending.delete(k);
    refilter(selectedKey());
  });
  refilter(k);
}
// The images one pick chooses among (the card's own included): its job's requests (candidates), else
// its group's cards (with --group-by: a product's colourways), each replaced variant left out; else its
// request's variants.
function candidates(i) {
  const c = cards[i], set = [];
  const same = c.j ? o => o.j === c.j && !o.x : D.group ? o => o.g === c.g && !o.x :
    o => o.pk.includes(c.k) || c.pk.includes(o.k);
  for (let n = 0; n < cards.length; n++) if (n === i || same(cards[n])) set.push(n);
  return set;
}
function batchId() {
  return [...crypto.getRandomValues(new Uint8Array(8))].map(x => x.toString(16).padStart(2, '0')).join('');
}
function pick() {  // the selected image approved, the others it was chosen among `not_chosen`: one batch
  const k = selectedKey();
  if (k === undefined) return;
  const among = candidates(byKey.get(k)).map(n => cards[n].k), b = batchId();
  if (among.length < 2) { say('nothing to pick among: one image (a job of several requests has more)'); return; }
  for (const o of among) {
    undo.push({k: o, b});
    record(o, o === k ? 'approved' : 'not_chosen', noteOf(o), b);
  }
  say(`picked ${cards[byKey.get(k)].t} of ${among.length}; u takes the pick back`);
  refilter(k);
}
function approveMarked() {  // each its own decision, in the page's order; one batch, undone at once
  const keys = cards.map(c => c.k).filter(k => marked.has(k));
  if (!keys.length) { say('nothing marked (x marks a card, g its group)'); return; }
  const b = batchId();
  for (const k of keys) {
    undo.push({k, b});
    record(k, 'approved', noteOf(k), b);
  }
  marked.clear();
  refilter(selectedKey());
}
function mark(keys) {
  const all = keys.every(k => marked.has(k));
  for (const k of keys) if (all) marked.delete(k); else marked.add(k);
  for (const [i, e] of shown) fill(e, i);
  count();
}
function markGroup() {
  if (!view.length) return;
  const g = cards[view[sel]].g;
  mark(view.filter(i => !D.group || cards[i].g === g).map(i => cards[i].k));
}
function undoLast() {  // the last decision, or the whole of the last bulk approve: the server decides
  const u = undo.pop();  // what comes back (never over another reviewer's later decision)
  if (!u) { say('nothing to undo'); return; }
  const keys = [u.k];
  while (u.b && undo.length && undo[undo.length - 1].b === u.b) keys.push(undo.pop().k);
  for (const k of keys) pending.set(k, (pending.get(k) || 0) + 1);
  const body = JSON.stringify({key: u.k, batch: u.b, reviewer: reviewer()});
  say('undoing…');
  const apply = answer => { for (const [k, d] of Object.entries(answer.decisions || {})) state.set(k, d); };
  send('/api/undo', body).then(answer => {
    apply(answer);
    const left = answer.refused ? `; ${fmt(answer.refused)} not: ${answer.reason}` : '';
    say(u.b ? `undid the approval of ${fmt(answer.undone)} image${answer.undone === 1 ? '' : 's'}${left}` : '');
    document.body.dataset.saved = saved += u.b ? answer.undone + answer.refused : 1;
  }, error => {  // refused (409: someone decided since), or not reached
    apply(error.answer || {});
    say(`${cards[byKey.get(u.k)].t}: ${error.message}`);
    document.body.dataset.refused = (+document.body.dataset.refused || 0) + 1;
  }).finally(() => {
    for (const k of keys) { const n = pending.get(k) - 1; if (n) pending.set(k, n); else pending.delete(k); }
    refilter(u.k);
  });
  reveal();
}
// `n` notes the selected card; right after `a` or `r` (nothing moved since), the card just decided: the
// note typed after a decision belongs to that card, the one typed before it is a comment it then carries.
function openNote() {
  const at = selectedKey(), k = justDecided && justDecided.next === at ? justDecided.k : at;
  if (k === undefined) return;
  noteKey = k;
  $('notefor').textContent = cards[byKey.get(k)].t;
  $('note').value = noteOf(k);
  $('notebar').hidden = false;
  $('note').focus();
}
function closeNote() { $('notebar').hidden = true; noteKey = null; justDecided = null; $('note').blur(); }
$('note').addEventListener('keydown', ev => {
  if (ev.key === 'Escape') { ev.preventDefault(); closeNote(); return; }
  if (ev.key !== 'Enter') return;
  ev.preventDefault();
  const k = noteKey, note = $('note').value.trim(), d = current(k);
  closeNote();
  if (d) { undo.push({k, b: ''}); record(k, d.decision, note); } else record(k, 'comment', note);
  refilter(selectedKey());
});
async function refresh(full) {
  if (document.hidden && !full) return;
  try {
    const r = await fetch('/api/decisions?since=' + (full ? -1 : version), {cache: 'no-store'});
    if (!r.ok) throw new Error('HTTP ' + r.status);
    const answer = await r.json(), keep = selectedKey();
    for (const [k, d] of Object.entries(answer.decisions)) if (!pending.get(k)) state.set(k, d);
    for (const [k, r] of Object.entries(answer.stars || {})) if (!pending.get(k)) stars.set(k, r);
    if (full) {
      for (const k of [...state.keys()]) if (!pending.get(k) && !(k in answer.decisions)) state.delete(k);
    }
    version = answer.version;
    if (full || Object.keys(answer.decisions).length) refilter(keep);
  } catch (error) {
    say('cannot reach the review server: ' + error.message);
  }
}
async function loadUndo() {  // what this reviewer can still undo, replayed by the server from the record
  try {
    const r = await fetch('/api/undo?reviewer=' + encodeURIComponent(reviewer()), {cache: 'no-store'});
    if (!r.ok) throw new Error('HTTP ' + r.status);
    undo = [...(await r.json()).undo, ...undo];
  } catch (error) {
    say('the earlier decisions cannot be undone: ' + error.message);
  }
}


// Another script's news of a decision (the live poll): `d` the decision in force on `k` (null: none).
let soon = 0;
window.reviewApplyDecision = (k, d) => {
  if (!byKey.has(k) || pending.get(k)) return;  // this page's own decision on it is on its way
  if (d) state.set(k, d); else state.delete(k);
  if (!soon) soon = setTimeout(() => { soon = 0; refilter(selectedKey()); }, 0);
};
// ... and of a rating: `r` the latest one, [stars, reviewer].
window.reviewApplyStars = (k, r) => {
  if (!byKey.has(k) || pending.get(k)) return;
  stars.set(k, r);
  if (!soon) soon = setTimeout(() => { soon = 0; refilter(selectedKey()); }, 0);
};
