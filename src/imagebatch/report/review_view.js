// --- the large view: the selected image fit to the window (or 100 %, zoomed), beside the versions it
// replaces, each with its decision and note, and its request's reference images at the image's size ---
function caption(i, now) {  // a variant's (or, in the survey, a candidate's) decision and note
  const c = cards[i], d = current(c.k), cap = el('div', 'vcap');
  const name = survey ? c.t + (c.nv > 1 ? ` variant ${c.v}` : '') : `variant ${c.v}`;
  cap.append(name + (now ? ' (this card)' : '') + ' · ' + (d ? said(d) : 'unreviewed'));
  if (d && d.note) cap.append(': ', el('span', 'note', d.note));
  return cap;
}
function pane(i, j, now) {
  const c = cards[i], p = el('div', 'vpane' + (now ? ' now' : '')), box = el('div', 'vbox');
  const img = el('img');
  p.classList.add('d-' + reviewState(i));
  img.alt = `image ${j + 1} of ${c.t}, variant ${c.v}`;
  img.src = `/image/${encodeURIComponent(c.k)}/${j}`;
  img.addEventListener('load', () => sizeImages());
  box.append(img);
  box.addEventListener('scroll', () => follow(box));
  p.append(caption(i, now), box);
  return p;
}
function refPane(c, j) {  // a reference: the thumbnail the card has, drawn as large as the image beside
  const p = el('div', 'vpane ref'), box = el('div', 'vbox'), img = el('img');
  img.alt = `reference ${j + 1} of ${c.t}`;
  img.src = `/ref/${encodeURIComponent(c.k)}/${j}`;
  img.addEventListener('load', () => sizeImages());
  box.append(img);
  box.addEventListener('scroll', () => follow(box));
  p.append(el('div', 'vcap', `reference ${j + 1}` + (c.r > 1 ? ` of ${c.r}` : '') + ', the request\'s'), box);
  return p;
}
function beforePane(c) {  // the image approved for the row before its prompt changed (review_history.py)
  const [k, , who] = c.h, p = el('div', 'vpane before'), box = el('div', 'vbox'), img = el('img');
  img.alt = `${BEFORE} of ${c.t}`;
  img.src = `/image/${encodeURIComponent(k)}/0`;
  img.addEventListener('load', () => sizeImages());
  box.append(img);
  box.addEventListener('scroll', () => follow(box));
  p.append(el('div', 'vcap', BEFORE + (who ? ` (by ${who})` : '')), box);
  return p;
}
let showing = '';  // the images and mode the large view shows: the same again only updates its captions
function showLarge() {
  if (!view.length) { hideLarge(); return; }
  const i = view[sel], c = cards[i], panes = $('vpanes');
  const chain = compare ? c.pk.map(k => byKey.get(k)) : [], among = survey ? candidates(i) : [];
  const list = survey ? among.map(at => [at, 0]) : [...chain.map(at => [at, 0]), ...range(c.n).map(j => [i, j])];
  viewing = true;
  $('viewer').hidden = false;
  $('vtitle').textContent = `${c.t} · ${sel + 1} of ${fmt(view.length)}`;
  $('vcols').textContent = D.columns.map((n, j) => c.m[j] ? `${n} ${c.m[j]}` : '').filter(Boolean).join(' · ');
  const now = survey ? 'survey ' + among.join() : c.k + compare;
  if (showing === now) {  // another decision, or another candidate: the images (zoom, scroll) stay
    const shownPanes = panes.querySelectorAll('.vpane');
    list.forEach(([at], n) => {
      const p = shownPanes[n];
      p.className = 'vpane' + (at === i ? ' now' : '') + ' d-' + reviewState(at);
      p.firstChild.replaceWith(caption(at, at === i));
    });
    document.body.dataset.viewing = c.k;
    return;
  }
  showing = now;
  panes.textContent = '';
  for (const [at, j] of list) panes.append(pane(at, j, at === i));
  if (!survey && c.h) panes.append(beforePane(c));
  if (!survey) for (let j = 0; j < (c.r || 0); j++) panes.append(refPane(c, j));
  $('vcompare').textContent = survey ? `${among.length} to pick from: p picks this one · s leaves the survey` :
    c.pk.length ? (compare ? 'c hides the earlier variants' : 'c compares') : '';
  sizeImages();
  document.body.dataset.viewing = c.k;
}
function range(n) { return [...Array(n).keys()]; }
function hideLarge() {
  viewing = false;
  survey = false;
  showing = '';
  $('viewer').hidden = true;
  delete document.body.dataset.viewing;
  reveal();
}
function sizeImages() {  // fit (zoom 0), else the image's own pixels times `zoom`
  let scale = 0;
  for (const img of $('vpanes').querySelectorAll('.vpane:not(.ref) img')) {
    const box = img.parentElement;
    box.classList.toggle('fit', !zoom);
    img.style.width = zoom && img.naturalWidth ? img.naturalWidth * zoom + 'px' : '';
    img.style.height = zoom && img.naturalHeight ? img.naturalHeight * zoom + 'px' : '';
    if (!scale && img.naturalWidth) {
      scale = zoom || Math.min(1, box.clientWidth / img.naturalWidth, box.clientHeight / img.naturalHeight);
    }
  }
  // A reference is drawn at the size of the image beside it (its thumbnail scaled), so that their boxes
  // scroll together over the same spot
  const main = $('vpanes').querySelector('.now img');
  const w = main && main.naturalWidth ? main.clientWidth : 0, h = w ? main.clientHeight : 0;
  for (const img of $('vpanes').querySelectorAll('.ref img')) {
    img.parentElement.classList.toggle('fit', !zoom);
    img.style.width = w ? w + 'px' : '';
    img.style.height = h ? h + 'px' : '';
  }
  $('vzoom').textContent = (zoom ? '' : 'fit · ') + (scale ? Math.round(scale * 100) + ' %' : '');
  document.body.dataset.zoom = zoom ? String(zoom) : 'fit';
}
function setZoom(z) {
  if (z === '+' || z === '-') {
    const img = $('vpanes').querySelector('.now img'), box = img && img.parentElement;
    const now = zoom || (img && img.naturalWidth ?
      Math.min(1, box.clientWidth / img.naturalWidth, box.clientHeight / img.naturalHeight) : 1);
    z = Math.min(8, Math.max(0.05, z === '+' ? now * 1.25 : now / 1.25));
  }
  zoom = z;
  sizeImages();
}
let following = false;
function follow(box) {  // the panes scroll together at 100 % and beyond, so the same spot is compared
  if (following) return;
  following = true;
  for (const other of $('vpanes').querySelectorAll('.vbox')) {
    if (other !== box) { other.scrollLeft = box.scrollLeft; other.scrollTop = box.scrollTop; }
  }
  following = false;
}

