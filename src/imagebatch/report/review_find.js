// --- search, column filters, the address, density --------------------------------------------------
// The search reads the page's own data (every card's title, key and shown columns), never the document:
// only the cards in the window are in it. The view (state filter, search, column filters) is kept in the
// address (#filter=open&q=fn-1055&c.colour=sand) so that it can be shared and reloaded.
const MAX_CHOICES = 200;  // a column with more values than this is searched, not chosen from a list
const query = {q: '', cols: new Map(), stars: ''};  // the search (lower case), column index -> value, stars
const STAR_FILTERS = ['1', '2', '3', '4', '5', 'none'];  // at least that many stars, or unrated
let hay = null;
function haystack() {
  if (!hay) hay = cards.map(c => [c.t, c.k, ...c.m].join('\n').toLowerCase());
  return hay;
}
function found(i) {
  for (const [j, v] of query.cols) if (cards[i].m[j] !== v) return false;
  if (query.stars) {
    const r = stars.get(cards[i].k);
    if (query.stars === 'none' ? r : !r || r[0] < +query.stars) return false;
  }
  return !query.q || haystack()[i].includes(query.q);
}
function columnFilters() {  // a choice per shown column of a few values (a SKU is searched)
  const box = $('colfilters');
  D.columns.forEach((name, j) => {
    const values = new Set();
    for (const c of cards) { values.add(c.m[j]); if (values.size > MAX_CHOICES) return; }
    if (values.size < 2) return;
    const s = el('select');
    s.dataset.col = j; s.title = 'filter on ' + name;
    s.append(new Option(`${name}: any`, ''));
    for (const v of [...values].sort()) s.append(new Option(v === '' ? '(empty)' : v, v));
    s.options[0].dataset.any = '1';
    s.addEventListener('change', () => { applyView(); s.blur(); });
    box.append(s);
  });
}
function colSelect(j) { return $('colfilters').querySelector(`select[data-col="${j}"]`); }
function readControls() {
  filter = $('filter').value;
  query.q = $('search').value.trim().toLowerCase();
  query.stars = $('starfilter').value;
  query.cols.clear();
  for (const s of $('colfilters').querySelectorAll('select')) {
    if (!s.selectedOptions[0].dataset.any) query.cols.set(+s.dataset.col, s.value);
  }
}
function applyView() {  // the controls' values in force, the address written, the cards found again
  const t0 = performance.now();
  readControls();
  const p = new URLSearchParams();
  if (filter !== 'all') p.set('filter', filter);
  if (query.q) p.set('q', $('search').value.trim());
  if (query.stars) p.set('stars', query.stars);
  for (const [j, v] of query.cols) p.set('c.' + D.columns[j], v);
  history.replaceState(null, '', p.toString() ? '#' + p : location.pathname + location.search);
  refilter(selectedKey());
  window.scrollTo(0, 0);
  document.body.dataset.searchMs = (performance.now() - t0).toFixed(1);  // found and drawn
}
function readAddress() {  // the view a shared address names (unknown names and values left out)
  const p = new URLSearchParams(location.hash.slice(1));
  $('filter').value = FILTERS.includes(p.get('filter')) ? p.get('filter') : 'all';
  $('search').value = p.get('q') || '';
  $('starfilter').value = STAR_FILTERS.includes(p.get('stars')) ? p.get('stars') : '';
  D.columns.forEach((name, j) => {
    const s = colSelect(j), v = p.get('c.' + name);
    if (!s) return;
    s.selectedIndex = 0;
    if (v !== null) for (const o of s.options) if (!o.dataset.any && o.value === v) o.selected = true;
  });
}
function markShown() { mark(view.map(i => cards[i].k)); }  // or unmark, when all are marked
function setDensity(name) {
  const d = SIZES[name] ? name : 'comfortable';
  [W, H] = SIZES[d];
  document.body.classList.toggle('compact', d === 'compact');
  $('density').value = d;
  localStorage.setItem('imagebatch-density', d);
}
