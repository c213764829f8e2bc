// runs.js: the runs list — one page of runs per request to GET /api/runs
// (paged with cursors, sorted, filtered and searched by the daemon), each
// with its verdict, status, σReparam, last step, last loss, lowest
// entropy_norm and firing alerts from the summary the daemon keeps; steps
// and status changes of the runs on screen arrive live from the event
// stream (every run's ticks, a summary a second: no per-step events); an
// alert or a status change re-reads only the rows it names (GET
// /api/runs/{id}, at most one request per row per 2 s), never the whole
// page; tick runs (up to 10) to compare them. A page the user left is
// cancelled. Hello meta keys can be shown as columns (?cols=lr,norm) and
// filtered on (?meta.KEY=V, done by the daemon); the filters, the sort,
// the columns and the page (?pages=: the cursors of the pages paged
// through) are in the URL, and each change is a history entry: Back undoes it.
import {api, reparamOf, runsQuery, takePrefetchedRuns} from './api.js';
import {subscribe, want} from './live.js';
import {fmt, fmtAgo, fmtStep, h, urlState} from './util.js';
import {MAX_RUNS, flatKeys, metaAt, metaFilters} from './meta.js';

const REPARAM_TEXT = {sigma: 'σReparam', spectral: 'spectral norm', none: 'none'};
const PAGE = 100;
const VERDICT_TITLE = {
  healthy: 'no collapse, divergence or stall', collapsing: 'entropy collapsing on a live run',
  collapsed: 'attention entropy collapsed', diverged: 'loss became NaN/Inf, or the run failed',
  stalled: 'the trainer went silent or vanished without ending the run',
  sharp: 'heads near one-hot while the loss trains: sharp, not collapsed',
};
const SORTS = [['id', 'newest'], ['updated', 'last update'], ['created', 'created'], ['name', 'name'], ['verdict', 'verdict'],
  ['min_entropy_norm', 'min entropy_norm'], ['last_loss', 'loss'], ['last_step', 'last step']];

export class RunsView {
  constructor(root, state) {
    this.root = root;
    this.rows = new Map();   // id -> {run, tr, cells}
    this.selected = new Set();
    this.q = {status: state.status || '', verdict: state.verdict || '', search: state.q || '',
      reparam: state.reparam || '', sort: state.sort || 'id', order: state.order || 'desc', meta: {}};
    for (const [k, v] of Object.entries(state)) if (k.startsWith('meta.') && k.length > 5 && v) this.q.meta[k] = v;
    if (this.q.meta['meta.reparam']) { this.q.reparam = this.q.reparam || this.q.meta['meta.reparam']; delete this.q.meta['meta.reparam']; }
    this.cols = (state.cols || '').split(',').filter(Boolean);
    // cursor of each page visited; the last is the current one
    this.cursors = [null, ...(state.pages || '').split(',').filter(Boolean)];
    this.tbody = h('tbody');
    this.empty = h('p', {class: 'muted empty', hidden: true},
      'No runs yet. Start a trainer against this daemon (sigmatrain --daemon unix:DATA/entropyd.sock) and it appears here at once.');
    this.cmpBtn = h('button', {class: 'btn', disabled: true, onclick: () => this.compare()}, 'Compare selected');
    this.count = h('span', {class: 'muted', id: 'runs-count'});
    this.prevBtn = h('button', {class: 'btn light', id: 'runs-prev', disabled: true, onclick: () => this.page(-1)}, '‹ newer');
    this.nextBtn = h('button', {class: 'btn light', id: 'runs-next', disabled: true, onclick: () => this.page(1)}, 'older ›');
    const sel = (id, label, key, opts) => h('select', {id, 'aria-label': label, onchange: (e) => this.setFilter(key, e.target.value)},
      ...opts.map(([v, t]) => h('option', {value: v, selected: v === this.q[key]}, t)));
    const search = h('input', {type: 'search', id: 'runs-search', placeholder: 'search names', value: this.q.search,
      'aria-label': 'search run names', oninput: (e) => {
        clearTimeout(this.searchTimer);
        this.searchTimer = setTimeout(() => this.setFilter('search', e.target.value.trim()), 200);
      }});
    this.metaInput = h('input', {type: 'search', id: 'runs-meta', class: 'meta-filter', placeholder: 'meta: key=value, …',
      value: Object.entries(this.q.meta).map(([k, v]) => `${k.slice(5)}=${v}`).join(', '),
      'aria-label': 'hello meta filters, key=value', title: 'runs whose hello meta has these values (e.g. lr=0.01, optimizer.name=adam)',
      onchange: (e) => this.setMeta(metaFilters(e.target.value))});
    this.colsBox = h('div', {class: 'cols-list', id: 'runs-cols-list'});
    this.colsMenu = h('details', {class: 'cols-menu', id: 'runs-cols'}, h('summary', {class: 'btn light'}, 'columns'), this.colsBox);
    this.headRow = h('tr');
    root.append(
      h('section', {class: 'card'},
        h('div', {class: 'card-head'},
          h('h1', {}, 'Runs'), this.count,
          h('span', {class: 'spacer'}), search,
          sel('runs-status', 'status filter', 'status', ['', 'live', 'stale', 'finished', 'failed', 'aborted'].map((s) => [s, s || 'all statuses'])),
          sel('runs-verdict', 'verdict filter', 'verdict', ['', 'healthy', 'collapsing', 'collapsed', 'diverged', 'stalled', 'sharp'].map((s) => [s, s || 'all verdicts'])),
          sel('runs-reparam', 'reparametrization filter', 'reparam', [['', 'any σReparam'], ['sigma', 'σReparam'], ['none', 'none'], ['spectral', 'spectral norm']]),
          sel('runs-sort', 'sort by', 'sort', SORTS.map(([v, t]) => [v, 'by ' + t])),
          sel('runs-order', 'order', 'order', [['desc', '↓'], ['asc', '↑']]),
          this.metaInput, this.colsMenu,
          this.cmpBtn),
        h('table', {class: 'runs', id: 'runs-table'}, h('thead', {}, this.headRow), this.tbody),
        h('div', {class: 'pager'}, this.prevBtn, this.nextBtn),
        this.empty));
    this.dirty = new Set();   // ids of rows to re-read (patchSoon)
    want({ticks: 1});
    this.unsub = subscribe((t, d) => this.onLive(t, d));
    this.tick = setInterval(() => this.refreshAges(), 5000);
    this.load();
  }

  /** The table's head: the fixed columns, then the meta columns chosen. */
  showHead() {
    this.headRow.textContent = '';
    this.headRow.append(
      h('th', {class: 'sel'}, ''), h('th', {}, 'run'), h('th', {title: 'computed by the daemon from the alert rules; kept after the run ends'}, 'verdict'),
      h('th', {}, 'status'), h('th', {}, 'σReparam'),
      ...this.cols.map((k) => h('th', {class: 'meta-col', dataset: {key: k}, title: `hello meta ${k}`}, k)),
      h('th', {class: 'num'}, 'layers × heads'), h('th', {class: 'num'}, 'last step'),
      h('th', {class: 'num', title: 'latest training loss, nats/token'}, 'loss (nats)'),
      h('th', {class: 'num', title: 'lowest normalized attention entropy of any head at any step'}, 'min entropy_norm'),
      h('th', {class: 'num'}, 'alerts firing'), h('th', {}, 'updated'));
  }

  /** The columns menu: a box per meta key of the runs on this page (and
   * the ones chosen). */
  showColsMenu(runs) {
    const keys = new Set(this.cols);
    for (const r of runs) for (const k of flatKeys(r.meta)) keys.add(k);
    this.colsBox.textContent = '';
    if (!keys.size) this.colsBox.append(h('span', {class: 'muted'}, 'the runs on this page have no hello meta'));
    for (const k of [...keys].sort()) this.colsBox.append(h('label', {class: 'pick'},
      h('input', {type: 'checkbox', value: k, checked: this.cols.includes(k), onchange: (e) => this.setCol(k, e.target.checked)}), ' ', k));
  }

  setCol(k, on) {
    this.cols = on ? [...this.cols.filter((x) => x !== k), k] : this.cols.filter((x) => x !== k);
    this.writeUrl();
    this.showHead();
    // the rows again from what they hold: no request
    for (const [id, row] of [...this.rows]) { const tr = this.addRow(row.run); row.tr.replaceWith(tr); }
  }

  /** The URL of the view as it is: a history entry (Back undoes the change). */
  writeUrl() {
    const metaOff = Object.fromEntries(Object.keys(urlState.get()).filter((k) => k.startsWith('meta.')).map((k) => [k, undefined]));
    urlState.push({...metaOff, status: this.q.status, verdict: this.q.verdict, q: this.q.search, reparam: this.q.reparam,
      sort: this.q.sort === 'id' ? '' : this.q.sort, order: this.q.order === 'desc' ? '' : this.q.order,
      ...this.q.meta, cols: this.cols.join(','), pages: this.cursors.slice(1).join(',')});
  }

  setFilter(key, v) {
    if (this.q[key] === v) return;
    this.q[key] = v;
    this.cursors = [null];
    this.writeUrl();
    this.load();
  }

  /** m: {"meta.KEY": V}; meta.reparam goes to the σReparam filter. */
  setMeta(m) {
    m = {...m};
    if (m['meta.reparam']) { this.q.reparam = m['meta.reparam']; delete m['meta.reparam']; this.root.querySelector('#runs-reparam').value = this.q.reparam; }
    if (JSON.stringify(m) === JSON.stringify(this.q.meta)) return;
    this.q.meta = m;
    this.metaInput.value = Object.entries(m).map(([k, v]) => `${k.slice(5)}=${v}`).join(', ');
    this.cursors = [null];
    this.writeUrl();
    this.load();
  }

  page(dir) {
    if (dir > 0 && this.next) this.cursors.push(this.next);
    else if (dir < 0 && this.cursors.length > 1) this.cursors.pop();
    else return;
    this.writeUrl();
    this.load();
  }

  /** One request for the page; one that is still loading is cancelled. */
  async load() {
    if (this.ctl) this.ctl.abort();
    const ctl = this.ctl = new AbortController();
    const p = {limit: PAGE, sort: this.q.sort, order: this.q.order, cursor: this.cursors[this.cursors.length - 1]};
    if (this.q.status) p.status = this.q.status;
    if (this.q.verdict) p.verdict = this.q.verdict;
    if (this.q.search) p.q = this.q.search;
    if (this.q.reparam) p['meta.reparam'] = this.q.reparam;
    Object.assign(p, this.q.meta);
    // the first page may be on its way already (index.html); null if it failed
    let page = await takePrefetchedRuns(runsQuery(p), ctl.signal);
    try { if (!page) page = await api.runsPage(p, {signal: ctl.signal}); } catch (e) {
      if (e.name !== 'AbortError' && !this.dead) this.showError(e);
      return;
    }
    if (this.dead || ctl !== this.ctl) return;
    this.ctl = null;
    this.next = page.next;
    this.tbody.textContent = '';
    this.rows.clear();
    this.showHead();
    this.showColsMenu(page.runs);
    const frag = document.createDocumentFragment();
    for (const r of page.runs) frag.append(this.addRow(r));
    this.tbody.append(frag);
    const first = (this.cursors.length - 1) * PAGE;
    this.count.textContent = page.total ? `${first + 1}–${first + page.runs.length} of ${page.total.toLocaleString('en-US')} runs` : '';
    this.prevBtn.disabled = this.cursors.length <= 1;
    this.nextBtn.disabled = !page.next;
    this.empty.hidden = page.runs.length > 0;
    if (!page.runs.length && (this.q.status || this.q.verdict || this.q.search || this.q.reparam || Object.keys(this.q.meta).length))
      this.empty.textContent = 'No run matches.';
    window.__render.complete = true;
    window.__render.completeAt = performance.now();
  }

  addRow(r) {
    const rp = reparamOf(r.meta);
    const v = r.verdict || {state: 'healthy', since_step: null, heads: []};
    const cells = {
      sel: h('input', {type: 'checkbox', 'aria-label': 'select ' + r.name, checked: this.selected.has(r.id), onchange: (e) => {
        if (e.target.checked) this.selected.add(r.id); else this.selected.delete(r.id);
        this.cmpBtn.disabled = this.selected.size < 2 || this.selected.size > MAX_RUNS;
        this.cmpBtn.textContent = `Compare selected (${this.selected.size})`;
        this.cmpBtn.title = this.selected.size > MAX_RUNS ? `at most ${MAX_RUNS} runs at once` : '';
      }}),
      status: h('span', {class: 'badge st-' + r.status, text: r.status}),
      step: h('td', {class: 'num step', text: fmtStep(r.last_step)}),
      loss: h('td', {class: 'num loss', text: r.last_loss === null || r.last_loss === undefined ? '—' : fmt(r.last_loss)}),
      ent: h('td', {class: 'num ent', text: r.min_entropy_norm === null || r.min_entropy_norm === undefined ? '—' : fmt(r.min_entropy_norm)}),
      alerts: h('td', {class: 'num alerts'}),
      updated: h('td', {class: 'muted updated', text: fmtAgo(r.updated)}),
    };
    cells.ent.classList.toggle('bad', r.min_entropy_norm !== null && r.min_entropy_norm < 0.01);
    const heads = (v.heads || []).map(([l, hd]) => `L${l}H${hd}`);
    const vtitle = VERDICT_TITLE[v.state] + (v.since_step !== null ? `; from step ${v.since_step}` : '') +
      (heads.length ? `; heads ${heads.slice(0, 12).join(' ')}${heads.length > 12 ? ' …' : ''}` : '') + (v.rule ? ` (${v.rule})` : '');
    const tr = h('tr', {dataset: {run: r.id, status: r.status, verdict: v.state}},
      h('td', {class: 'sel'}, cells.sel),
      h('td', {}, h('a', {href: `./?run=${r.id}`, class: 'run-link'}, r.name)),
      h('td', {class: 'verdict-cell'}, h('span', {class: 'badge v-' + v.state, title: vtitle},
        v.state + (v.since_step !== null && v.state !== 'healthy' ? ` @${fmtStep(v.since_step)}` : ''))),
      h('td', {}, cells.status),
      h('td', {class: 'reparam', dataset: {reparam: rp || 'unknown'}},
        rp ? h('span', {class: 'badge rp-' + rp}, REPARAM_TEXT[rp]) : h('span', {class: 'muted', title: 'the run’s meta does not say'}, '?')),
      ...this.cols.map((k) => this.metaCell(r, k)),
      h('td', {class: 'num', text: `${r.layers} × ${r.heads}`}),
      cells.step, cells.loss, cells.ent, cells.alerts, cells.updated);
    const row = {run: r, tr, cells};
    this.setAlerts(row, r.alerts_firing || 0);
    this.rows.set(r.id, row);
    return tr;
  }

  /** A meta column's cell: the value; a click filters the list by it. */
  metaCell(r, k) {
    const v = metaAt(r.meta, k);
    if (!v) return h('td', {class: 'meta muted', dataset: {key: k}}, '—');
    return h('td', {class: 'meta', dataset: {key: k}}, h('button', {class: 'linkish', title: `only runs with ${k}=${v}`,
      onclick: () => this.setMeta({...this.q.meta, ['meta.' + k]: v})}, v));
  }

  setAlerts(row, n) {
    row.cells.alerts.textContent = '';
    row.cells.alerts.append(n > 0 ? h('span', {class: 'badge alert'}, String(n)) : h('span', {class: 'muted'}, '0'));
  }

  onLive(type, d) {
    if (type === 'reset') { this.load(); return; }
    if (!d || d.run === undefined) return;
    const row = this.rows.get(d.run);
    if (!row) {
      // a run not on this page: only a new one changes the first page
      if (type === 'run' && this.cursors.length === 1) this.reloadSoon();
      return;
    }
    if (type === 'step' || type === 'tick') {
      row.run.last_step = d.step;
      row.cells.step.textContent = fmtStep(d.step);
      row.cells.step.dataset.step = d.step;
      // a step event carries a value, a tick [min, mean, max, last]
      const loss = d.scalars && d.scalars.loss;
      if (loss !== undefined) row.cells.loss.textContent = fmt(Array.isArray(loss) ? loss[3] : loss);
      row.run.updated = d.ct || Date.now() / 1000;
      row.cells.updated.textContent = fmtAgo(row.run.updated);
      if (row.run.status !== 'live') this.setStatus(row, 'live');
    } else if (type === 'run') {
      if (d.status === 'deleted') { row.tr.remove(); this.rows.delete(d.run); return; }
      this.setStatus(row, d.status);
      this.patchSoon(d.run); // the verdict is final once a run ends
    } else if (type === 'alert') {
      this.patchSoon(d.run); // its verdict and firing count
    }
  }

  /** Re-reads the rows of ids marked dirty: one GET /api/runs/{id} each,
   * the first a moment after the event (a collapse fires alerts in bursts),
   * then at most every 2 s. */
  patchSoon(id) {
    this.dirty.add(id);
    if (this.patchTimer) return;
    const wait = Math.max(150, 2000 - (performance.now() - (this.patchedAt ?? -Infinity)));
    this.patchTimer = setTimeout(async () => {
      this.patchTimer = null;
      this.patchedAt = performance.now();
      const ids = [...this.dirty];
      this.dirty.clear();
      await Promise.all(ids.map(async (rid) => {
        let r;
        try { r = await api.run(rid); } catch { return; }
        const old = this.rows.get(rid);
        if (this.dead || !old || !r) return;
        const tr = this.addRow(r);
        old.tr.replaceWith(tr);
      }));
      window.__runsPatched = (window.__runsPatched || 0) + ids.length;
    }, wait);
  }

  setStatus(row, s) {
    row.run.status = s;
    row.tr.dataset.status = s;
    row.cells.status.className = 'badge st-' + s;
    row.cells.status.textContent = s;
  }

  reloadSoon() {
    clearTimeout(this.reloadTimer);
    this.reloadTimer = setTimeout(() => this.load(), 150);
  }

  refreshAges() { for (const row of this.rows.values()) row.cells.updated.textContent = fmtAgo(row.run.updated); }

  compare() {
    urlState.go({view: 'compare', runs: [...this.selected].join(',')});
    window.dispatchEvent(new PopStateEvent('popstate'));
  }

  showError(e) {
    this.empty.hidden = false;
    this.empty.textContent = `Cannot list runs: ${e.message} (status ${e.status}).` +
      (e.status === 401 ? ' This daemon wants a token: open the page as /?token=TOKEN.' : '');
  }

  destroy() {
    this.dead = true;
    if (this.ctl) this.ctl.abort(); // the page the user left loads nothing more
    this.unsub(); clearInterval(this.tick); clearTimeout(this.reloadTimer); clearTimeout(this.searchTimer); clearTimeout(this.patchTimer);
  }
}
