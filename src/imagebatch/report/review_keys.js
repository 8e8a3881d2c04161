// --- keys, clicks, filter --------------------------------------------------------------------------
const KEYS = {j: () => move(1), k: () => move(-1), ArrowRight: () => move(1), ArrowLeft: () => move(-1),
              a: () => decide('approved'), r: () => decide('rejected'), n: openNote, u: undoLast,
              x: () => { const k = selectedKey(); if (k !== undefined) mark([k]); }, g: markGroup,
              A: approveMarked, v: showLarge, Enter: showLarge, p: pick,
              s: () => { survey = !survey; showLarge(); }, X: markShown, '/': () => $('search').focus(),
              d: () => { setDensity($('density').value === 'compact' ? 'comfortable' : 'compact'); refilter(selectedKey()); },
              1: () => rate(1), 2: () => rate(2), 3: () => rate(3), 4: () => rate(4), 5: () => rate(5)};
const VIEW_KEYS = {...KEYS, ArrowDown: () => move(1), ArrowUp: () => move(-1), Escape: hideLarge,
                   v: hideLarge, Enter: hideLarge, '0': () => setZoom(0), f: () => setZoom(0),
                   '1': () => setZoom(1), '+': () => setZoom('+'), '=': () => setZoom('+'),
                   '-': () => setZoom('-'), c: () => { compare = !compare; showLarge(); }};
for (const n of '2345') delete VIEW_KEYS[n];  // the large view's 1 is 100 %: ratings are the cards' keys
document.addEventListener('keydown', ev => {
  const t = ev.target;
  if (t instanceof HTMLInputElement || t instanceof HTMLSelectElement) return;
  if (t instanceof HTMLTextAreaElement) return;
  const keys = viewing ? VIEW_KEYS : KEYS;
  if (!viewing && ev.key === 'Escape' && marked.size) { mark([...marked]); return; }
  if (ev.ctrlKey || ev.metaKey || ev.altKey || !keys[ev.key]) return;
  ev.preventDefault();
  keys[ev.key]();
});
grid.addEventListener('click', ev => {
  const e = ev.target.closest('.card');
  const p = e ? view.indexOf(byKey.get(e.dataset.key)) : -1;
  if (p < 0) return;
  const from = sel;
  sel = p;
  justDecided = null;
  const b = ev.target.closest('button'), a = ev.target.closest('a');
  if (ev.shiftKey) {  // shift-click marks every card from the selected one to this one
    ev.preventDefault();
    mark(view.slice(Math.min(from, p), Math.max(from, p) + 1).map(i => cards[i].k));
  } else if (b) {
    const act = b.dataset.act;
    if (act === 'note') openNote();
    else if (act === 'view') showLarge();
    else if (act === 'mark') mark([e.dataset.key]);
    else decide(act);
  } else if (ev.target.closest('.refs') || (a && !ev.ctrlKey && !ev.metaKey)) {  // an image opens the large view (a new tab with Ctrl)
    ev.preventDefault();
    showLarge();
  }
  layout();
});
$('approvemarked').addEventListener('click', approveMarked);
$('unmark').addEventListener('click', () => mark([...marked]));
$('vclose').addEventListener('click', hideLarge);
$('filter').addEventListener('change', ev => { applyView(); ev.target.blur(); });
$('search').addEventListener('input', applyView);
$('starfilter').addEventListener('change', ev => { applyView(); ev.target.blur(); });
$('search').addEventListener('keydown', ev => {
  if (ev.key === 'Escape' || ev.key === 'Enter') { ev.preventDefault(); ev.target.blur(); }
});
$('markshown').addEventListener('click', markShown);
$('density').addEventListener('change', ev => { setDensity(ev.target.value); ev.target.blur(); refilter(selectedKey()); });
window.addEventListener('hashchange', () => { readAddress(); applyView(); });
$('reviewer').value = localStorage.getItem('imagebatch-reviewer') || D.reviewer;
$('reviewer').addEventListener('change', ev => {
  localStorage.setItem('imagebatch-reviewer', ev.target.value.trim());
});
window.addEventListener('scroll', later, {passive: true});
window.addEventListener('resize', () => { refilter(selectedKey()); if (viewing) sizeImages(); });
window.addEventListener('focus', () => refresh(false));
document.addEventListener('visibilitychange', () => { if (!document.hidden) refresh(false); });
// review_live.js polls the other reviewers' decisions (every 2 s) and hands each to reviewApplyDecision.
columnFilters();
readAddress();
setDensity(localStorage.getItem('imagebatch-density'));
readControls();
refilter();
performance.mark('first-cards');
loadUndo().then(() => { document.body.dataset.ready = '1'; });
setTimeout(haystack, 50);  // the search's text made once the first cards are up, not at the first key
