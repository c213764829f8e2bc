// compare.js: up to 10 runs overlaid on the same axes (say a baseline and
// its σReparam twins), every metric they report on a chart of its own: the
// scalars (loss, eval_loss, ...), then the head and layer metrics folded
// over every layer and head (line: their mean, min or max per bucket;
// band: the exact min–max over all heads in each bucket) or one layer of
// them; each run's alerts marked on every chart in the run's colour, and
// the lines EMA-smoothed on demand. Grouped by a hello meta key
// (?group=KEY), each group is one line, the mean of its runs, with their
// min–max as its band.
//
// The runs come from a picker that searches and pages the daemon's runs
// list (GET /api/runs?limit=&q=&status=&verdict=&meta.KEY=: one page of
// PICK_PAGE per request, never the unpaged list), so it costs the same
// with 10 runs stored as with 10,000. The URL holds the runs and every
// setting; a change of runs or of a chart setting is a history entry, so
// Back undoes it (the picker's own search and filters replace the entry).
// The x axis (?x=wall|rel, the run page's key) is steps, the trainer's
// clock or the time since each run's first step: each run on its own
// clock, from its timeline answer's bucket edges (one request per run,
// made only when a time axis is chosen) and its live ticks.
// Not the run page: no heatmap, no per-head view.
import {api, getJSON, reparamOf} from './api.js';
import {StepClock, TimeChart, X_MODES, X_NAMES, durLabel, logByDefault, pointsFor, setSmoothing, getSmoothing, wallLabel} from './charts.js';
import {subscribe, want} from './live.js';
import {color, fmtStep, h, unitOf, urlState, whenVisible} from './util.js';
import {normAlert} from './verdict.js';
import {MAX_RUNS, flatKeys, metaAt, metaFilters} from './meta.js';

const PICK_PAGE = 20;
/** Buckets of a run's clock request (the times of its steps at their edges). */
const CLOCK_POINTS = 400;
const int = (v) => (v === undefined || v === null || v === '' || Number.isNaN(+v) ? null : Math.max(0, Math.round(+v)));

/** The run ids of a URL's runs= (positive integers, first MAX_RUNS, no repeats). */
export function idsOf(s) {
  const out = [];
  for (const x of String(s || '').split(',')) {
    const id = +x;
    if (Number.isInteger(id) && id > 0 && !out.includes(id)) out.push(id);
  }
  return out.slice(0, MAX_RUNS);
}

const push = (patch) => urlState.push(patch);

export class CompareView {
  constructor(root, s) {
    this.root = root;
    this.ids = idsOf(s.runs);
    this.st = {metric: s.metric || '', layer: int(s.layer), from: int(s.from), to: int(s.to),
               agg: ['mean', 'min', 'max'].includes(s.agg) ? s.agg : 'mean', group: s.group || '',
               smooth: Math.min(0.99, Math.max(0, +s.smooth || 0)), x: X_MODES.includes(s.x) ? s.x : 'step'};
    this.pick = {q: s.pq || '', status: s.pstatus || '', verdict: s.pverdict || '', meta: s.pmeta || '', cursors: [null]};
    setSmoothing(this.st.smooth);
    this.charts = [];
    this.runs = [];
    this.alerts = new Map();   // run id -> [normAlert]
    this.clocks = new Map();   // run id -> StepClock (time axes)
    this.clockAsked = new Map();   // run id + range -> Promise of its clock request
    this.pending = 0;
    want({ticks: 1});
    this.unsub = subscribe((t, d) => this.onLive(t, d));
    this.shell();
    this.loadPicker();
    this.loadRuns();
  }

  /* ---- the picker -------------------------------------------------------- */

  shell() {
    this.pickTimers = {};
    this.chips = h('div', {class: 'chips', id: 'cmp-chips'});
    const sel = (id, label, key, opts) => h('select', {id, 'aria-label': label, onchange: (e) => this.setPick(key, e.target.value)},
      ...opts.map((v) => h('option', {value: v, selected: v === this.pick[key]}, v || label)));
    const typed = (id, key, placeholder, label) => h('input', {type: 'search', id, placeholder, value: this.pick[key], 'aria-label': label,
      oninput: (e) => {
        // a timer per field: typing in one does not drop the other's change
        clearTimeout(this.pickTimers[key]);
        this.pickTimers[key] = setTimeout(() => this.setPick(key, e.target.value.trim()), 200);
      }});
    this.pickList = h('div', {class: 'pick-list', id: 'cmp-pick-list', role: 'list'});
    this.pickCount = h('span', {class: 'muted', id: 'cmp-pick-count'});
    this.pickPrev = h('button', {class: 'btn light', id: 'cmp-pick-prev', disabled: true, onclick: () => this.pickPage(-1)}, '‹ newer');
    this.pickNext = h('button', {class: 'btn light', id: 'cmp-pick-next', disabled: true, onclick: () => this.pickPage(1)}, 'older ›');
    this.picker = h('details', {class: 'picker-box', id: 'cmp-picker', open: this.ids.length < 2},
      h('summary', {}, 'Pick runs ', h('span', {class: 'muted'}, `(search and filter every stored run; up to ${MAX_RUNS})`)),
      h('div', {class: 'pick-filters'},
        typed('cmp-pick-q', 'q', 'search names', 'search run names'),
        sel('cmp-pick-status', 'all statuses', 'status', ['', 'live', 'stale', 'finished', 'failed', 'aborted']),
        sel('cmp-pick-verdict', 'all verdicts', 'verdict', ['', 'healthy', 'collapsing', 'collapsed', 'diverged', 'stalled', 'sharp']),
        typed('cmp-pick-meta', 'meta', 'meta: key=value, …', 'hello meta filters, key=value'),
        this.pickCount),
      this.pickList,
      h('div', {class: 'pager'}, this.pickPrev, this.pickNext));
    this.root.append(h('section', {class: 'card'},
      h('div', {class: 'card-head'}, h('h1', {}, 'Compare runs'),
        h('span', {class: 'muted'}, 'every metric, each run in its colour, on steps or each run’s own clock')),
      this.chips, this.picker));
    this.body = h('div', {id: 'compare-body'});
    this.root.append(this.body);
  }

  setPick(key, v) {
    if (this.pick[key] === v) return;
    this.pick[key] = v;
    urlState.set({pq: this.pick.q, pstatus: this.pick.status, pverdict: this.pick.verdict, pmeta: this.pick.meta});
    this.pick.cursors = [null];
    this.loadPicker();
  }

  pickPage(dir) {
    if (dir > 0 && this.pickNextCursor) this.pick.cursors.push(this.pickNextCursor);
    else if (dir < 0 && this.pick.cursors.length > 1) this.pick.cursors.pop();
    else return;
    this.loadPicker();
  }

  /** One page of the runs list for the picker; a page still loading is cancelled. */
  async loadPicker() {
    if (this.pickCtl) this.pickCtl.abort();
    const ctl = this.pickCtl = new AbortController();
    const p = {limit: PICK_PAGE, sort: 'id', order: 'desc', cursor: this.pick.cursors[this.pick.cursors.length - 1],
               status: this.pick.status, verdict: this.pick.verdict, q: this.pick.q, ...metaFilters(this.pick.meta)};
    let page;
    try { page = await api.runsPage(p, {signal: ctl.signal}); } catch (e) {
      if (e.name === 'AbortError' || this.dead) return;
      this.pickList.textContent = '';
      this.pickList.append(h('p', {class: 'error'}, `Cannot list runs: ${e.message}`));
      return;
    }
    if (this.dead || ctl !== this.pickCtl) return;
    this.pickCtl = null;
    this.pickNextCursor = page.next;
    this.pickList.textContent = '';
    for (const r of page.runs) this.pickList.append(this.pickRow(r));
    if (!page.runs.length) this.pickList.append(h('p', {class: 'muted'}, page.total === 0 && !this.filtered() ? 'No runs stored yet.' : 'No run matches.'));
    const first = (this.pick.cursors.length - 1) * PICK_PAGE;
    this.pickCount.textContent = page.total ? `${first + 1}–${first + page.runs.length} of ${page.total.toLocaleString('en-US')}` : '';
    this.pickPrev.disabled = this.pick.cursors.length <= 1;
    this.pickNext.disabled = !page.next;
    this.pickShown = true;
    this.done();
  }

  filtered() { return !!(this.pick.q || this.pick.status || this.pick.verdict || this.pick.meta); }

  pickRow(r) {
    const on = this.ids.includes(r.id), v = (r.verdict && r.verdict.state) || 'healthy';
    const box = h('input', {type: 'checkbox', value: r.id, checked: on, disabled: !on && this.ids.length >= MAX_RUNS,
      'aria-label': 'compare ' + r.name, onchange: (e) => this.toggle(r.id, e.target.checked)});
    return h('label', {class: 'pick', role: 'listitem', dataset: {run: r.id}}, box, ' ', h('b', {}, r.name), ' ',
      h('span', {class: 'badge v-' + v}, v), ' ',
      h('span', {class: 'muted'}, `#${r.id} · ${r.status} · ${r.layers}×${r.heads} · step ${fmtStep(r.last_step)}` +
        (reparamOf(r.meta) === 'sigma' ? ' · σReparam' : '')));
  }

  /** Adds or removes a run: a history entry, then the charts again. */
  toggle(id, on) {
    if (on && !this.ids.includes(id) && this.ids.length < MAX_RUNS) this.ids.push(id);
    if (!on) this.ids = this.ids.filter((x) => x !== id);
    push({runs: this.ids.join(',')});
    for (const b of this.pickList.querySelectorAll('input[type=checkbox]')) {
      b.checked = this.ids.includes(+b.value);
      b.disabled = !b.checked && this.ids.length >= MAX_RUNS;
    }
    this.loadRuns();
  }

  showChips() {
    this.chips.textContent = '';
    if (!this.ids.length) { this.chips.append(h('span', {class: 'muted'}, 'No runs picked: tick two or more below.')); return; }
    const by = new Map(this.runs.map((r) => [r.id, r]));
    this.ids.forEach((id) => {
      const r = by.get(id);
      const col = this.colorOf(id);
      this.chips.append(h('span', {class: 'chip', dataset: {run: id}},
        h('span', {class: 'swatch', style: `background:${col}`}),
        r ? h('a', {href: `./?run=${id}`}, r.name) : h('span', {class: 'muted'}, `#${id} (not found)`),
        h('button', {class: 'chip-x', title: 'remove from the comparison', 'aria-label': 'remove run ' + id,
                     onclick: () => this.toggle(id, false)}, '×')));
    });
    this.chips.append(h('span', {class: 'muted'}, ` ${this.ids.length} of at most ${MAX_RUNS}`));
  }

  /* ---- the runs and their charts -------------------------------------- */

  /** The picked runs and their alerts, then the charts. A newer call wins. */
  async loadRuns() {
    const seq = this.runsSeq = (this.runsSeq || 0) + 1;
    window.__render.complete = false;
    const ids = [...this.ids];
    const runs = await Promise.all(ids.map((id) => api.run(id).catch(() => null)));
    if (this.dead || seq !== this.runsSeq) return;
    this.runs = runs.filter(Boolean);
    this.showChips();
    this.build();
    for (const r of this.runs) if (!this.alerts.has(r.id)) this.loadAlerts(r.id);
  }

  async loadAlerts(id) {
    this.alerts.set(id, []);
    this.pending++;
    try {
      const a = await api.alerts(id);
      this.alerts.set(id, (a || []).map(normAlert).filter((x) => x.step !== null));
      this.redrawMarkers();
    } catch { /* no markers for it */ } finally { this.pending--; this.done(); }
  }

  redrawMarkers() { for (const c of this.charts) if (c.chart.u) c.chart.u.redraw(false, false); }

  colorOf(id) {
    const i = this.ids.indexOf(id);
    return color(i < 0 ? 0 : i);
  }

  /** The groups of the runs by the meta key st.group (null: no grouping):
   * [{label, runs, color}] in order of first appearance. */
  groups() {
    if (!this.st.group) return null;
    const g = new Map();
    for (const r of this.runs) {
      const v = metaAt(r.meta, this.st.group) || '(none)';
      if (!g.has(v)) g.set(v, []);
      g.get(v).push(r);
    }
    return [...g.entries()].map(([v, rs], i) => ({label: `${this.st.group}=${v} (${rs.length} run${rs.length > 1 ? 's' : ''})`,
                                                  runs: rs, color: color(i)}));
  }

  build() {
    for (const c of this.charts) c.chart.destroy();
    this.charts = [];
    this.body.textContent = '';
    if (this.runs.length < 1) {
      this.body.append(h('p', {class: 'muted card'}, 'Pick runs above.'));
      this.armed = true;
      this.done();
      return;
    }
    const names = (k) => [...new Set(this.runs.flatMap((r) => (r.metrics && r.metrics[k]) || []))].sort();
    this.kinds = {};
    for (const k of ['layers', 'heads', 'scalars']) for (const m of names(k)) this.kinds[m] = k;
    // loss first, then the other scalars; entropy_norm first of the heads
    const rank = (m) => ({loss: 0, eval_loss: 1, entropy_norm: 10, entropy: 11}[m] ?? {scalars: 5, heads: 12, layers: 20}[this.kinds[m]]);
    const metrics = Object.keys(this.kinds).sort((a, b) => rank(a) - rank(b) || (a < b ? -1 : 1));
    if (this.st.metric && this.kinds[this.st.metric]) metrics.splice(0, 0, ...metrics.splice(metrics.indexOf(this.st.metric), 1));
    const maxL = Math.max(...this.runs.map((r) => r.layers));
    const keys = new Set();
    for (const r of this.runs) for (const k of flatKeys(r.meta)) keys.add(k);
    const mSel = h('select', {id: 'cmp-metric', 'aria-label': 'first chart', onchange: (e) => this.setSt({metric: e.target.value})},
      ...metrics.map((m) => h('option', {value: m, selected: m === metrics[0]}, `first: ${m} (${this.kinds[m].slice(0, -1)})`)));
    const lSel = h('select', {id: 'cmp-layer', 'aria-label': 'layer', onchange: (e) => this.setSt({layer: int(e.target.value)})},
      h('option', {value: ''}, 'all layers'), ...Array.from({length: maxL}, (_, l) => h('option', {value: l, selected: l === this.st.layer}, 'layer ' + l)));
    const aSel = h('select', {id: 'cmp-agg', 'aria-label': 'line', onchange: (e) => this.setSt({agg: e.target.value})},
      ...['mean', 'min', 'max'].map((a) => h('option', {value: a, selected: a === this.st.agg}, `line: ${a} over heads/layers`)));
    const gSel = h('select', {id: 'cmp-group', 'aria-label': 'group by', onchange: (e) => this.setSt({group: e.target.value})},
      h('option', {value: ''}, 'no grouping'),
      ...[...keys].sort().map((k) => h('option', {value: k, selected: k === this.st.group}, 'group by ' + k)));
    if (this.st.group && !keys.has(this.st.group)) gSel.append(h('option', {value: this.st.group, selected: true}, 'group by ' + this.st.group));
    const smVal = h('span', {class: 'muted', id: 'cmp-smooth-val', text: this.st.smooth ? String(this.st.smooth) : 'off'});
    const sm = h('input', {type: 'range', id: 'cmp-smooth', min: 0, max: 0.99, step: 0.01, value: this.st.smooth, 'aria-label': 'smoothing',
      oninput: (e) => { setSmoothing(+e.target.value); smVal.textContent = +e.target.value ? e.target.value : 'off'; },
      onchange: (e) => { this.st.smooth = getSmoothing(); push({smooth: this.st.smooth || undefined}); }});
    const xSel = h('select', {id: 'x-axis', 'aria-label': 'x axis', onchange: (e) => this.setSt({x: e.target.value})},
      ...X_MODES.map((m) => h('option', {value: m, selected: m === this.st.x}, X_NAMES[m])));
    const xCtl = h('label', {class: 'muted', title: 'what the charts’ x axis counts: training steps, the trainer’s clock, or the time since each run began'},
      'x axis ', xSel);
    this.xNote = h('span', {class: 'muted small', id: 'cmp-x-note'});
    this.rangeEl = h('span', {class: 'range-txt'});
    const reset = h('button', {class: 'btn light', onclick: () => this.setRange(null, null)}, 'Zoom out');
    this.body.append(h('div', {class: 'rangebar'}, mSel, lSel, aSel, gSel, xCtl, h('label', {class: 'muted'}, 'smoothing ', sm, ' ', smVal),
      this.xNote, h('span', {class: 'spacer'}), this.rangeEl, reset));
    this.showRange();
    const grid = h('div', {class: 'grid2 card', id: 'cmp-charts'});
    this.body.append(grid);
    for (const m of metrics) this.addChart(grid, m);
    this.armed = false;
    // the charts near the viewport start loading from the observer's first
    // callbacks (delivered with the next frame): until then nothing is pending
    requestAnimationFrame(() => requestAnimationFrame(() => { this.armed = true; this.done(); }));
  }

  /** Applies a chart setting: a history entry and the charts again. */
  setSt(patch) {
    Object.assign(this.st, patch);
    const u = {};
    for (const k of Object.keys(patch)) {
      u[k] = patch[k] === null || patch[k] === '' || (k === 'agg' && patch[k] === 'mean') || (k === 'x' && patch[k] === 'step') ? undefined : patch[k];
    }
    push(u);
    window.__render.complete = false;
    this.build();
  }

  /** The step range every run is asked for: the zoom, else from the first
   * run's first step to the last run's last, the same for all, so that
   * their buckets line up (a group's mean needs them aligned). */
  span() {
    const lo = this.st.from ?? Math.min(...this.runs.map((r) => r.first_step ?? 0));
    const hi = this.st.to ?? Math.max(lo, ...this.runs.map((r) => r.last_step ?? 0));
    return [lo, hi];
  }

  addChart(grid, metric) {
    const kind = this.kinds[metric];
    const layer = kind === 'scalars' ? null : this.st.layer;
    const fold = kind === 'heads' ? (layer === null ? 'all layers and heads' : `layer ${layer}, all heads`)
      : kind === 'layers' ? (layer === null ? 'all layers' : `layer ${layer}`) : '';
    const line = fold ? this.st.agg : 'mean';
    const groups = this.groups();
    const title = groups
      ? `${metric}${fold ? ' — ' + fold + ` (${line})` : ''}: per group, line: mean of its runs, band: their min–max`
      : fold ? `${metric} — ${fold} (line: ${line}, band: min–max)` : `${metric} (line: mean, band: min–max)`;
    const cell = h('div', {class: 'cell'});
    grid.append(cell);
    const chart = new TimeChart(cell, {title, unit: unitOf(metric), height: 240, sync: 'compare', file: `compare-${metric}`,
      log: logByDefault(metric), autoLog: true, markers: () => this.markers(), x: this.xAxis(),
      onZoom: (a, b) => this.setRange(a, b), onReset: () => this.setRange(null, null)});
    chart.el.dataset.metric = metric;
    const c = {chart, loaded: false};
    c.load = async () => {
      c.loaded = true;
      this.pending++;
      try {
        const [lo, hi] = this.span();
        const pts = Math.round(Math.max(pointsFor(chart.el) / 3, Math.min(pointsFor(chart.el), Math.ceil((hi - lo + 1) / 64))));
        const runs = this.runs;
        const res = await Promise.all(runs.map((r) => {
          const q = {metric, points: pts, from: lo, to: hi};
          if (kind !== 'scalars') { q.agg = this.st.agg; if (layer !== null && layer < r.layers) q.layer = layer; }
          return (r.metrics && (r.metrics[kind] || []).includes(metric)) ? api.series(r.id, q).catch(() => null) : null;
        }));
        if (this.st.x !== 'step') await this.ensureClocks();
        if (this.dead || chart.dead) return;
        const by = new Map(runs.map((r, i) => [r.id, res[i]]));
        const xOf = (r) => this.xOfRun(r.id);
        let defs, table;
        if (groups) {
          defs = groups.map((g) => ({label: g.label, color: g.color, band: true, width: 2}));
          table = joinLines(groups.map((g) => groupLine(g.runs.map((r) => [by.get(r.id), xOf(r)]))));
        } else {
          defs = runs.map((r) => ({label: `${r.name}` + (reparamOf(r.meta) === 'sigma' ? ' (σReparam)' : ''),
                                   color: this.colorOf(r.id), band: true, width: 1.8}));
          table = joinLines(runs.map((r, i) => runLine(res[i], xOf(r))));
        }
        await chart.setData(defs, table);
        chart.el.dataset.runs = runs.map((r) => r.id).join(',');
        chart.el.dataset.groups = groups ? groups.length : '';
        chart.el.dataset.x = this.st.x;
      } finally {
        this.pending--;
        this.done();
      }
    };
    this.charts.push(c);
    whenVisible(chart.el, c.load);
  }

  /** Every picked run's alerts at their start step, in the run's colour
   * (its group's when grouped); resolved ones paler. */
  markers() {
    const groups = this.groups();
    const colOf = (id) => (groups ? groups.find((g) => g.runs.some((r) => r.id === id)).color : this.colorOf(id));
    const out = [];
    for (const r of this.runs) {
      const xOf = this.xOfRun(r.id);
      for (const a of this.alerts.get(r.id) || [])
        out.push({step: a.step, x: xOf(a.step), color: colOf(r.id) + (a.state === 'resolved' ? '99' : ''), label: a.rule,
                  prio: a.state === 'firing' ? 1 : 0, run: r.id});
    }
    return out;
  }

  /* ---- the x axis: steps, or each run's own clock ----------------------- */

  /** The charts' x axis (TimeChart's o.x): the mode in force, its legend
   * text, and a zoom's x range back to steps. */
  xAxis() {
    return {
      mode: () => this.st.x,
      label: (v) => (this.st.x === 'wall' ? wallLabel(v, 0) : durLabel(v)),
      toSteps: (a, b) => this.stepsIn(a, b),
    };
  }

  /** step -> x of run id on the axis in force (NaN when its steps' times
   * are not known). */
  xOfRun(id) {
    const mode = this.st.x, c = this.clocks.get(id);
    if (mode === 'step') return (st) => st;
    if (!c || !c.known) return () => NaN;
    return (st) => c.time(st, mode);
  }

  /** The steps a zoom over times a..b of the axis covers: from the lowest
   * to the highest step any run spent in that window (every run is then
   * asked for those steps, as a step zoom asks all for the same range). */
  stepsIn(a, b) {
    let lo = Infinity, hi = -Infinity;
    for (const r of this.runs) {
      const c = this.clocks.get(r.id);
      if (!c || !c.known) continue;
      const first = r.first_step ?? 0, last = Math.max(first, r.last_step ?? first);
      const ta = c.time(first, this.st.x), tb = c.time(last, this.st.x);
      if (tb < a || ta > b) continue;
      lo = Math.min(lo, Math.max(first, c.step(Math.max(a, ta), this.st.x)));
      hi = Math.max(hi, Math.min(last, c.step(Math.min(b, tb), this.st.x)));
    }
    return lo <= hi ? [lo, hi] : [NaN, NaN];
  }

  /** The clocks the charts need: each run's whole run (its origin, for
   * relative time) and, when zoomed, the steps shown at finer resolution:
   * one timeline request each (rows=layer: the smallest answer), made once.
   * A run with neither a head nor a layer metric has no clock and is left
   * off a time axis (said beside the menu). */
  async ensureClocks() {
    const asks = [];
    for (const r of this.runs) {
      const m = r.metrics || {}, head = (m.heads || [])[0], layer = (m.layers || [])[0];
      if (!head && !layer) continue;
      const zoomed = this.st.from !== null || this.st.to !== null;
      for (const range of zoomed ? [null, this.span()] : [null]) {
        const key = `${r.id}:${range ? range.join('-') : 'all'}`;
        if (!this.clockAsked.has(key)) {
          const q = new URLSearchParams({metric: head || layer, points: CLOCK_POINTS});
          if (head) q.set('rows', 'layer');
          if (range) { q.set('from', range[0]); q.set('to', range[1]); }
          this.clockAsked.set(key, getJSON(`/api/runs/${r.id}/timeline?${q}`, {prio: 1}).then((ans) => {
            if (!this.clocks.has(r.id)) this.clocks.set(r.id, new StepClock());
            const c = this.clocks.get(r.id);
            c.add([...ans.step, ...ans.end], [...ans.time, ...ans.end_time]);
            // the whole run's first bucket starts at its first step: the origin of relative time
            if (!range && ans.time.length) c.t0 = ans.time[0];
          }, () => { this.clockAsked.delete(key); }));
        }
        asks.push(this.clockAsked.get(key));
      }
    }
    await Promise.all(asks);
    const none = this.runs.filter((r) => !(this.clocks.get(r.id) || {}).known).map((r) => r.name);
    this.xNote.textContent = this.st.x !== 'step' && none.length ? `no step times for ${none.join(', ')}: not drawn on this axis` : '';
  }

  setRange(from, to) {
    if ((from !== null && !Number.isFinite(from)) || (to !== null && !Number.isFinite(to))) return;   // a time window no run was in
    this.st.from = from; this.st.to = to;
    push({from: from ?? undefined, to: to ?? undefined});
    this.showRange();
    for (const c of this.charts) if (c.loaded) c.load();
  }

  showRange() {
    const z = this.st.from !== null || this.st.to !== null;
    this.rangeEl.textContent = z ? `steps ${fmtStep(this.st.from ?? 0)} – ${this.st.to === null ? 'end' : fmtStep(this.st.to)}` : 'whole runs';
    this.rangeEl.dataset.zoomed = z ? '1' : '';
  }

  onLive(type, d) {
    if (this.dead) return;
    if (type === 'reset') { this.alerts.clear(); this.loadRuns(); this.loadPicker(); return; }
    if (!d || !this.ids.includes(d.run)) return;
    const r = this.runs.find((x) => x.id === d.run);
    if (type === 'alert' && r) {
      const a = normAlert(d);
      if (a.step === null) return;
      const list = (this.alerts.get(r.id) || []).filter((x) => x.key !== a.key);
      list.push(a);
      this.alerts.set(r.id, list);
      this.redrawMarkers();
      return;
    }
    if ((type !== 'step' && type !== 'tick') || !r) return;
    // a live run's clock grows with its ticks (the step's trainer time)
    const c = this.clocks.get(r.id);
    if (c && Number.isFinite(d.step) && Number.isFinite(d.time)) c.add([d.step], [d.time]);
    if (this.st.to !== null) return;
    r.last_step = Math.max(r.last_step ?? 0, d.step);
    // live runs redraw at most every 2 s: a compare view is for reading, not for every step
    if (this.liveTimer) return;
    this.liveTimer = setTimeout(() => { this.liveTimer = null; if (!this.dead) for (const c of this.charts) if (c.loaded) c.load(); }, 2000);
  }

  done() {
    const r = window.__render;
    if (!r || r.complete || !this.armed || !this.pickShown || this.pending > 0) return;
    r.complete = true;
    r.completeAt = performance.now();
    r.charts = this.charts.filter((c) => c.loaded).length;
  }

  destroy() {
    this.dead = true;
    clearTimeout(this.liveTimer);
    for (const t of Object.values(this.pickTimers)) clearTimeout(t);
    if (this.pickCtl) this.pickCtl.abort();
    this.unsub();
    for (const c of this.charts) c.chart.destroy();
  }
}

/** The line of a series answer: the agg's `value` (head and layer
 * metrics) or the bucket mean (scalars). */
const lineOf = (res) => (res.value || res.mean);

/** A run's line from its series answer: [x, line, max, min] per bucket
 * that holds values (an empty bucket past the run's end is nothing, not a
 * gap), x = xOf(step); buckets without an x (no known time) are left out. */
function runLine(r, xOf) {
  const out = [];
  if (!r || !r.step) return out;
  const line = lineOf(r);
  r.step.forEach((s, i) => {
    if (!r.count[i] && !r.nonfinite[i]) return;
    const x = xOf(s);
    if (Number.isFinite(x)) out.push([x, line[i], r.max[i], r.min[i]]);
  });
  return out;
}

/** A group's line: per step (the runs' buckets line up: the same range and
 * points) the mean of its runs' lines (those with a finite value there),
 * their min and max as the band, at the mean of those runs' x of the step
 * (on a time axis each run's own time of it). members: [[answer, xOf]]. */
function groupLine(members) {
  const at = new Map();   // step -> [sum, n, hi, lo, xsum, xn]
  for (const [r, xOf] of members) {
    if (!r || !r.step) continue;
    const line = lineOf(r);
    r.step.forEach((s, i) => {
      const v = line[i];
      if (!r.count[i] || v === null || !Number.isFinite(v)) return;
      const x = xOf(s);
      let a = at.get(s);
      if (!a) at.set(s, (a = [0, 0, -Infinity, Infinity, 0, 0]));
      a[0] += v; a[1]++;
      if (v > a[2]) a[2] = v;
      if (v < a[3]) a[3] = v;
      if (Number.isFinite(x)) { a[4] += x; a[5]++; }
    });
  }
  const out = [];
  for (const [, a] of [...at.entries()].sort((p, q) => p[0] - q[0])) if (a[5]) out.push([a[4] / a[5], a[0] / a[1], a[2], a[3]]);
  return out;
}

/** One table for uPlot from lines of [x, y, max, min]: the union of their
 * x values, and per line its y and band (undefined where it has no point:
 * spanned, not a gap). */
function joinLines(lines) {
  const xs = [...new Set(lines.flatMap((l) => l.map((p) => p[0])))].sort((a, b) => a - b), at = new Map(xs.map((x, i) => [x, i]));
  const cols = [];
  for (const l of lines) {
    const y = new Array(xs.length).fill(undefined), hi = new Array(xs.length).fill(undefined), lo = new Array(xs.length).fill(undefined);
    for (const [x, v, a, b] of l) { const k = at.get(x); y[k] = v; hi[k] = a; lo[k] = b; }
    cols.push(y, hi, lo);
  }
  return [xs, ...cols];
}
