'use strict';
// The review page's live part (report/review_page.py inlines it after review_page.js, under the same
// nonce): the decisions that changed since the page's version, polled from GET /api/changes every 2 s
// while the page is visible (and at once when it is shown again), each handed to review_page.js through
// window.reviewApplyDecision(key, state), so that other reviewers' decisions show without a reload; and,
// on each card where two or more reviewers' own decisions stand, who decided what
// ("alice approved, bob rejected"), marked as a conflict when they differ. The ratings that changed come
// with them, each handed over through window.reviewApplyStars(key, [stars, reviewer]). The latest decision is the one
// in force; the line says that a colleague thinks otherwise.
(() => {
  const POLL = 2000;
  const data = JSON.parse(document.getElementById('data').textContent);
  const grid = document.getElementById('grid'), status = document.getElementById('status');
  const views = new Map(Object.entries(data.views || {}));
  let version = data.version, busy = false, failing = false;
  if (data.signedIn) {  // decisions carry the signed-in reviewer's name, whatever this field says
    const field = document.getElementById('reviewer');
    field.value = data.reviewer;
    field.readOnly = true;
    field.title = 'signed in as ' + data.reviewer;
  }
  function line(v) {
    return v.map(([name, decision]) => `${name || 'someone'} ${decision.replace('_', ' ')}`).join(', ');
  }
  function show(card) {  // the card's line of views, made, changed or taken away
    const v = views.get(card.dataset.key) || [];
    let e = card.querySelector('.views');
    if (!v.length) { if (e) e.remove(); return; }
    if (!e) {
      e = document.createElement('div');
      e.className = 'views';
      e.style.cssText = 'flex:none;font-size:12px;font-weight:bold;white-space:normal';
      const rv = card.querySelector('.rv');
      card.insertBefore(e, rv ? rv.nextSibling : null);
    }
    const text = line(v), conflict = new Set(v.map(pair => pair[1])).size > 1;
    if (e.textContent !== text) e.textContent = text;
    e.classList.toggle('conflict', conflict);
    e.style.color = conflict ? '#a40' : '#555';
    e.title = conflict ? 'the reviewers disagree; the latest decision is in force' : '';
  }
  function showAll() { for (const card of grid.querySelectorAll('.card[data-key]')) show(card); }
  new MutationObserver(records => {  // the page makes cards as they scroll into the window
    for (const r of records) {
      for (const n of r.addedNodes) if (n.nodeType === 1 && n.dataset && n.dataset.key) show(n);
    }
  }).observe(grid, {childList: true});
  async function poll() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const r = await fetch('/api/changes?since=' + version, {cache: 'no-store'});
      if (!r.ok) throw new Error(r.status === 401 ? 'signed out: open your sign-in link again' : 'HTTP ' + r.status);
      const answer = await r.json();
      for (const [k, d] of Object.entries(answer.decisions)) {
        const {views: v, ...state} = d;
        views.set(k, v || []);
        if (window.reviewApplyDecision) window.reviewApplyDecision(k, state);
      }
      for (const [k, r] of Object.entries(answer.stars || {})) {
        if (window.reviewApplyStars) window.reviewApplyStars(k, r);
      }
      version = answer.version;
      showAll();
      if (failing) status.textContent = '';
      failing = false;
    } catch (error) {
      failing = true;
      status.textContent = 'live updates stopped: ' + error.message;
    } finally {
      busy = false;
    }
  }
  setInterval(poll, POLL);
  document.addEventListener('visibilitychange', poll);
  showAll();
})();
