// run.js: one run — training curves, the layer x head heatmap with a step
// scrubber and playback, per-layer small multiples of every head with the
// entropy bound, collapse signals (sigma_qk, max_logit, QK eigenspectrum,
// rank ratio, per-linear sigma and gamma), alerts and events.
//
// Data: every curve is a downsampled series (one bucket per pixel, exact
// min/max per bucket) over the shown step range; zooming asks again for the
// narrower range, so resolution grows down to single steps. Charts below the
// fold load when scrolled to. Live data comes from the event stream, as
// summaries (ticks=1: docs/http-api.md): a tick a second appends to the
// training curves, layers and cells events (as often) to the layer,
// signal and small-multiple charts, the heatmap, the head chart and the
// collapse timeline (timeline.js). A live page makes no request per step:
// only a verdict check (after alerts, and every 30 s), the head chart's
// refetch when the worst heads change, and a chart's (or the timeline's)
// refetch once its appended points outnumber its buckets; all of them go
// through the page's budget (budget.js: at most one started per 10 s),
// what the user asks for (a zoom, a metric) goes at once.
//
// View state lives in the URL (metric, tl, x, logs, from/to, smooth, ...):
// a view change (zoom, a metric, the x axis, a log toggle) pushes a history
// entry, so Back undoes it; scrubbing and following replace the entry.
import {api, getJSON, reparamOf, withToken} from './api.js';
import {TimeChart, X_MODES, addClock, resetClock, getSmoothing, hasClock, logByDefault, nonfiniteSteps, pointsFor, pooled, setClockOrigin,
        setSmoothing, setXMode, splitOf, tableOf} from './charts.js';
import {Heatmap} from './heatmap.js';
import {COLLAPSE_BELOW, FOLD_ROWS, Timeline} from './timeline.js';
import {streamState, subscribe, want} from './live.js';
import {ask, forget, served} from './budget.js';
import {color, describe, fmt, fmtAgo, fmtStep, h, unitOf, urlState, whenVisible} from './util.js';
import {normAlert, verdictOf} from './verdict.js';

// One split= answer holds at most this many series x buckets (daemon/query.h,
// QUERY_MAX_SERIES_BUCKETS): the most points a chart of n series may ask for.
const MAX_SERIES_BUCKETS = 262144;
const maxPoints = (n) => Math.max(1, Math.floor(MAX_SERIES_BUCKETS / Math.max(1, n)));

const HM_DEFAULTS = ['entropy_norm', 'entropy'];
const FIXED_DOMAIN = {entropy_norm: [0, 1]};
// collapse signals: how to fold heads into one line per layer
const SIGNAL_AGG = {sigma_qk: 'max', max_logit: 'max', eig_mean: 'mean', eig_var: 'mean'};
const ENTROPY_FAMILY = new Set(['entropy', 'entropy_norm', 'entropy_bound']);
const LINEAR = /^(sigma|gamma)_/;
const TRAINING_ORDER = ['loss', 'lr', 'grad_norm', 'tokens_per_s'];
// the heatmap's colour scale starts logarithmic for these (?hmlog=0|1 overrides)
const HM_LOG = new Set(['entropy_norm']);
// the side chart shows this many of the worst heads of the step shown
const WORST_K = 4;
let viewCount = 0;   // budget keys per view: a view's asks go with it
const VERDICT_TEXT = {healthy: 'Healthy', collapsing: 'Collapsing', collapsed: 'Collapsed', diverged: 'Diverged', stalled: 'Stalled',
                      sharp: 'Sharp heads, training'};
/** Timeline of the first render, for the benchmark (window.__render.marks). */
const mark = (what) => { const r = window.__render; if (r && !r.complete) (r.marks ||= []).push([what, Math.round(performance.now())]); };
// the timeline asks for at most this many cells (rows x buckets) and this
// few buckets: 12 x 12 heads get ~270 buckets (about 110 KB), 32 x 32 64
const TL_CELLS = 40000, TL_MIN_POINTS = 64;
/** "loss:1,sig:sigma_qk:0" (the URL's logs=) as a Map of chart key -> on. */
const parseLogs = (v) => new Map(String(v || '').split(',').filter(Boolean).map((x) => {
  const i = x.lastIndexOf(':');
  return [x.slice(0, i), x.slice(i + 1) === '1'];
}).filter(([k]) => k));
const int = (v) => (v === undefined || v === null || v === '' || Number.isNaN(+v) ? null : Math.max(0, Math.round(+v)));

export class RunView {
  constructor(root, s) {
    this.root = root;
    this.id = +s.run;
    this.st = {metric: s.metric || null, sm: s.sm || null, step: int(s.step), from: int(s.from), to: int(s.to),
               layer: int(s.layer), head: int(s.head), hmlog: s.hmlog === '1' ? true : s.hmlog === '0' ? false : null,
               tl: s.tl || null, x: X_MODES.includes(s.x) ? s.x : 'step', logs: parseLogs(s.logs)};
    setSmoothing(s.smooth);
    // the steps' times are this run's (the module keeps them for every chart)
    resetClock();
    setXMode(this.st.x);
    this.charts = [];       // {chart, load, loaded, kind}
    this.alerts = [];
    this.liveAlerts = new Map();
    this.pending = 0;
    this.eventsGen = 0;
    this.headerDone = false;
    this.wantStream();
    this.unsub = subscribe((t, d) => this.onLive(t, d));
    this.init();
  }

  /* ---- setup ------------------------------------------------------------ */

  /** The stream this page needs: its run's summaries, with the cells of
   * the heatmap's and the small multiples' metrics (and the entropy bound
   * the head chart draws beside entropy). */
  wantStream() {
    const sm = this.seen && this.seen.has('sm'), rows = sm || (this.seen && this.seen.has('sig'));
    const tl = this.st.tl && this.m && this.m.heads.includes(this.st.tl) ? [this.st.tl] : [];
    const cells = [...new Set([this.st.metric || 'entropy_norm', ...tl, ...(sm ? [this.st.sm || 'entropy'] : []),
      ...(this.st.metric === 'entropy' ? ['entropy_bound'] : [])])];
    want({run: this.id, ticks: 1, layers: rows ? 1 : undefined, cells: cells.join(',')});
  }

  /** The sections below the fold (small multiples, collapse signals) get
   * their share of the stream only while near the screen: a tab left on
   * the first screen costs the heatmap's cells and the ticks alone. A
   * section scrolled back to after missing live data loads again. */
  watchSection(body, name, kinds) {
    if (!window.IntersectionObserver) { (this.seen ||= new Set()).add(name); this.wantStream(); return; }
    const io = new IntersectionObserver((es) => {
      const on = es[es.length - 1].isIntersecting;
      this.seen ||= new Set();
      if (on === this.seen.has(name)) return;
      if (on) {
        this.seen.add(name);
        if (this.missed && this.missed.has(name)) {
          this.missed.delete(name);
          for (const c of this.charts) if (kinds.includes(c.kind) && c.loaded) c.load();
        }
      } else {
        this.seen.delete(name);
        (this.missed ||= new Set()).add(name);
      }
      this.wantStream();
    }, {rootMargin: '300px'});
    io.observe(body.closest('section'));
    (this.observers ||= []).push(io);
  }

  async init() {
    mark('init');
    let run = null;
    const pre = window.__prefetch;
    if (pre && pre.id === this.id) { window.__prefetch = null; this.preFrame = pre.frame; run = await pre.run; }
    try { if (!run) run = await api.run(this.id); } catch (e) {
      this.root.append(h('section', {class: 'card'}, h('h1', {}, 'Run ' + this.id),
        h('p', {class: 'error'}, `Cannot load run ${this.id}: ${e.message}`), h('a', {href: './'}, '← all runs')));
      return;
    }
    if (this.dead) return;
    this.run = run;
    mark('run');
    const m = run.metrics || {scalars: [], layers: [], heads: []};
    this.m = {scalars: m.scalars || [], layers: m.layers || [], heads: m.heads || []};
    if (!this.st.metric || !this.m.heads.includes(this.st.metric))
      this.st.metric = HM_DEFAULTS.find((x) => this.m.heads.includes(x)) || this.m.heads[0] || null;
    const tlOk = (x) => this.m.heads.includes(x) || this.m.layers.includes(x);
    if (!this.st.tl || !tlOk(this.st.tl))
      this.st.tl = ['entropy_norm', 'entropy'].find((x) => this.m.heads.includes(x)) || this.m.heads[0] || null;
    if (!this.st.sm || !this.m.heads.includes(this.st.sm))
      this.st.sm = ['entropy', 'entropy_norm'].find((x) => this.m.heads.includes(x)) || this.m.heads[0] || null;
    this.lastStep = run.last_step;
    this.firstStep = run.first_step ?? 0;
    this.wantStream();
    this.buildHeader();
    this.buildVerdict();
    this.loadAlerts();
    this.buildRange();
    // the heads first: the collapse is what the page is for, the loss follows
    this.buildTimeline();
    this.buildHeatmap();
    this.buildScalars();
    mark('first screen built');
    // let the first requests go out before building the (long) rest of the page
    await new Promise((r) => setTimeout(r, 0));
    if (this.dead) return;
    this.buildSmallMultiples();
    this.buildSignals();
    this.buildAlertsEvents();
    this.headerDone = true;
    mark('built');
    this.checkComplete();
  }

  section(title, sub, ...controls) {
    const body = h('div', {class: 'card-body'});
    const sec = h('section', {class: 'card'},
      h('div', {class: 'card-head'}, h('h2', {}, title), sub ? h('span', {class: 'muted'}, sub) : null,
        h('span', {class: 'spacer'}), ...controls),
      body);
    this.root.append(sec);
    return body;
  }

  buildHeader() {
    const r = this.run, rp = reparamOf(r.meta);
    this.statusEl = h('span', {class: 'badge st-' + r.status, id: 'run-status', text: r.status});
    this.lastStepEl = h('b', {id: 'last-step', text: fmtStep(r.last_step)});
    this.lastLossEl = h('b', {id: 'last-loss', text: '—'});
    const meta = r.meta && typeof r.meta === 'object' ? r.meta : {};
    // a few config facts, flat or nested (sigmatrain nests optimizer and data)
    const get = (path) => path.split('.').reduce((o, k) => (o && typeof o === 'object' ? o[k] : undefined), meta);
    const facts = [['norm', 'norm'], ['optimizer', 'optimizer.name'], ['optimizer', 'optimizer'], ['lr', 'optimizer.lr'],
                   ['lr', 'lr'], ['warmup', 'optimizer.warmup'], ['width', 'model.dim'], ['data', 'data.kind'],
                   ['seed', 'seed']];
    const shown = new Set(), pick = [];
    for (const [label, path] of facts) {
      const v = get(path);
      if (shown.has(label) || v === undefined || v === null || typeof v === 'object') continue;
      shown.add(label);
      pick.push([label, v]);
    }
    this.root.append(h('section', {class: 'card run-head'},
      h('div', {class: 'card-head'},
        h('a', {href: './', class: 'back', title: 'all runs'}, '←'),
        h('h1', {id: 'run-name'}, r.name), this.statusEl,
        rp ? h('span', {class: 'badge rp-' + rp, id: 'run-reparam'}, rp === 'sigma' ? 'σReparam' : rp === 'spectral' ? 'spectral norm' : 'no reparam') : null,
        h('span', {class: 'spacer'}),
        h('a', {class: 'btn light', href: `./?view=compare&runs=${r.id}`}, 'Compare with…'),
        h('a', {class: 'btn light', href: withToken(`/api/runs/${r.id}/export?format=csv`), download: true}, 'Export CSV')),
      h('div', {class: 'facts'},
        h('span', {}, 'last step ', this.lastStepEl),
        h('span', {}, 'loss ', this.lastLossEl, h('small', {class: 'muted'}, ' nats/token')),
        h('span', {}, 'shape ', h('b', {}, `${r.layers} layers × ${r.heads} heads`), `, T = ${r.seq_len}`),
        h('span', {}, 'started ', this.agoEl = h('b', {id: 'started-ago', title: new Date(r.created * 1000).toISOString()}, fmtAgo(r.created))),
        ...pick.map(([k, v]) => h('span', {}, k + ' ', h('b', {}, String(v))))),
      Object.keys(meta).length ? h('details', {class: 'meta'}, h('summary', {}, 'run config (hello meta)'),
        h('pre', {}, JSON.stringify(meta, null, 2))) : null));
    // relative times stay current
    this.agoTimer = setInterval(() => { this.agoEl.textContent = fmtAgo(this.run.created); }, 5000);
    api.frame(this.id, 'loss').then((f) => { if (f && this.lossShownStep === undefined) this.lastLossEl.textContent = fmt(f.values[0]); }).catch(() => {});
  }

  /** The run's status badge: "live" only while the stream is up (a live
   * run seen through a lost stream may have ended meanwhile). */
  showStatus(status) {
    if (status) this.run.status = status;
    const s = this.run.status, off = s === 'live' && streamState() !== 'open';
    this.statusEl.className = 'badge st-' + (off ? 'offline' : s);
    this.statusEl.textContent = off ? 'live? (no connection)' : s;
    this.statusEl.dataset.status = s;
  }

  /** The verdict banner: the run's state in a word with its step, the
   * heads it concerns and what is firing now. Filled by renderVerdict once
   * the alerts are in (the daemon's verdict needs none). */
  buildVerdict() {
    this.verdictState = h('span', {class: 'v-state', id: 'verdict-state'}, '…');
    this.verdictDetail = h('span', {class: 'v-detail', id: 'verdict-detail'});
    this.firingEl = h('span', {class: 'v-firing', id: 'firing-now'});
    this.verdictEl = h('section', {class: 'verdict', id: 'verdict', 'data-state': 'unknown', role: 'status'},
      this.verdictState, this.verdictDetail, h('span', {class: 'spacer'}), this.firingEl);
    this.root.append(this.verdictEl);
    // rules that read a metric this run never sent are never evaluated
    // for it: say so, or a quiet verdict reads as a healthy one
    const off = this.run.rules_unavailable || [];
    if (off.length) {
      this.root.append(h('p', {class: 'muted rules-off', id: 'rules-unavailable'},
        'Rules that cannot run for this run (it never sent what they read): ' +
        off.map((r) => `${r.rule} (needs ${r.missing.join(', ')})`).join('; ') + '.'));
    }
    if (this.run.verdict) this.renderVerdict();
  }

  renderVerdict() {
    if (!this.verdictEl) return;
    const v = verdictOf(this.run, this.alertsKnown ? this.alerts : null);
    if (!this.alertsKnown && v.source !== 'daemon') return;
    this.verdict = v;
    const at = v.since_step !== null ? fmtStep(v.since_step) : null;
    const word = VERDICT_TEXT[v.state];
    const head = v.state === 'healthy' ? word
      : v.state === 'collapsed' || v.state === 'diverged' ? `${word}${at ? ' at step ' + at : ''}`
      : `${word}${at ? ' since step ' + at : ''}`;
    this.verdictState.textContent = head;
    const heads = v.heads.slice(0, 8).map(([l, hd]) => `L${l} h${hd}`).join(', ') + (v.heads.length > 8 ? ` and ${v.heads.length - 8} more` : '');
    const why = {healthy: 'no entropy collapse alert has fired on this run',
                 collapsing: 'attention entropy collapsing', collapsed: 'attention entropy collapsed',
                 diverged: 'the loss became NaN or infinite', stalled: 'the trainer stopped sending',
                 sharp: 'attention entropy near zero while the loss trains (not a collapse)'}[v.state];
    this.verdictDetail.textContent = why + (heads ? ` in ${heads}` : '') + (v.rule ? ` (rule ${v.rule})` : '');
    Object.assign(this.verdictEl.dataset, {state: v.state, since: v.since_step ?? '', source: v.source});
    // what fires now: one chip per firing alert
    const firing = (this.alerts || []).map(normAlert).filter((a) => a.state === 'firing');
    this.firingEl.textContent = '';
    if (!firing.length) this.firingEl.append(h('span', {class: 'muted'}, this.alertsKnown ? 'nothing firing now' : ''));
    else {
      this.firingEl.append(h('span', {class: 'muted'}, 'firing now:'));
      for (const a of firing)
        this.firingEl.append(h('a', {href: '#', class: 'badge al-firing', title: a.summary,
          onclick: (e) => { e.preventDefault(); if (a.step !== null) this.jumpTo(a.step); }},
          `${a.rule} · ${a.where}${a.step !== null ? ' · since ' + fmtStep(a.step) : ''}`));
    }
  }

  buildRange() {
    this.rangeEl = h('span', {class: 'range-txt'});
    this.resetBtn = h('button', {class: 'btn light', onclick: () => this.setRange(null, null)}, 'Zoom out (whole run)');
    const bar = h('div', {class: 'rangebar'}, h('span', {class: 'muted'}, 'Drag across any chart to zoom; double-click to zoom out. Markers: ',
        h('span', {class: 'mk', style: 'color:#d62728'}, '▼ alert firing'), ' ', h('span', {class: 'mk', style: 'color:#9aa0a6'}, '▼ resolved'), ' ',
        h('span', {class: 'mk', style: 'color:#e68a00'}, '▼ rollback'), ' ', h('span', {class: 'mk', style: 'color:#3b6fb6'}, '▼ step in the heatmap')),
      h('span', {class: 'spacer'}), this.xControl(), this.smoothControl(), this.rangeEl, this.resetBtn);
    this.root.append(bar);
    this.showRange();
  }

  /** A view change into the URL as a new history entry (Back undoes it). */
  push(patch) { urlState.go({...urlState.get(), ...patch}); }

  /** The x axis of every chart: step, wall time or time since the start
   * (x= in the URL). */
  xControl() {
    const names = {step: 'step', wall: 'wall time', rel: 'relative time'};
    const sel = h('select', {id: 'x-axis', 'aria-label': 'x axis', onchange: (e) => {
      this.st.x = e.target.value;
      this.push({x: this.st.x === 'step' ? undefined : this.st.x});
      setXMode(this.st.x);
      if (this.tl) this.tl.draw();
    }}, ...X_MODES.map((m) => h('option', {value: m, selected: m === this.st.x}, names[m])));
    return h('label', {class: 'smooth', title: 'what the charts’ x axis counts: training steps, the trainer’s clock, or the time since the run began'}, 'x axis', sel);
  }

  /** EMA smoothing of every line on the page (the bands stay raw), 0..0.99,
   * kept in the URL as smooth=. */
  smoothControl() {
    const val = h('span', {class: 'small', id: 'smooth-val'}, String(getSmoothing()));
    const inp = h('input', {type: 'range', id: 'smooth', min: 0, max: 0.99, step: 0.01, value: getSmoothing(),
      'aria-label': 'smoothing', oninput: (e) => {
        setSmoothing(+e.target.value);
        val.textContent = String(getSmoothing());
        urlState.set({smooth: getSmoothing() || undefined});
      }});
    return h('label', {class: 'smooth', title: 'exponential moving average of the lines; the min–max bands stay the raw data'}, 'smoothing', inp, val);
  }

  showRange() {
    const z = this.st.from !== null || this.st.to !== null;
    this.rangeEl.textContent = z ? `steps ${fmtStep(this.st.from ?? this.firstStep)} – ${fmtStep(this.st.to ?? this.lastStep)}` : 'whole run';
    this.rangeEl.dataset.zoomed = z ? '1' : '0';
    this.resetBtn.hidden = !z;
  }

  /** extra.key names the chart in the URL's logs= (its log toggle kept). */
  chartOpts(title, unit, extra = {}) {
    const o = {title, unit, onZoom: (a, b) => this.setRange(a, b), onReset: () => this.setRange(null, null),
               markers: () => this.alertMarkers(), sync: 'run-' + this.id, file: `${this.run.name}-${title}`, ...extra};
    if (o.key) {
      if (this.st.logs.has(o.key)) { o.log = this.st.logs.get(o.key); o.autoLog = false; }
      o.onLog = (on) => { this.st.logs.set(o.key, on); this.push({logs: [...this.st.logs].map(([k, v]) => `${k}:${v ? 1 : 0}`).join(',')}); };
    }
    return o;
  }

  /** Registers a chart: load() fetches and draws it; it runs when the chart
   * is first scrolled near, and again on every range change once loaded. */
  addChart(chart, load, kind, eager = false) {
    const c = {chart, loaded: false, kind, key: this.bkey('chart:' + this.charts.length)};
    c.load = async () => {
      served(c.key);   // a waiting refetch of this chart is served by this load
      this.pending++;
      c.loaded = true;
      chart.reloading = true;   // live steps wait in the chart's backlog until the new data is in
      try { await load(chart); mark('chart ' + (chart.o.title || chart.el.id)); } catch (e) { if (e.name !== 'AbortError') this.chartError(chart, e); } finally {
        chart.reloading = false;
        this.pending--;
        this.checkComplete();
      }
    };
    this.charts.push(c);
    // the chart outgrew its buckets: refetched in the budget's next free slot
    chart.reload = () => ask(c.key, () => {
      if (this.dead || c.reloading) return;
      c.reloading = true;
      c.load().finally(() => { c.reloading = false; chart.reloading = false; });
    });
    if (eager) c.load(); else whenVisible(chart.el, c.load);
    return c;
  }

  chartError(chart, e) {
    const p = chart.el.querySelector('.chart-error') || chart.el.appendChild(h('p', {class: 'chart-error muted'}));
    p.textContent = e.status === 404 ? 'no data' : `could not load: ${e.message}`;
    chart.el.classList.remove('loading');
  }

  /** Buckets to ask for over the shown range: one per pixel at most, one
   * per 3 pixels at least (per 6 with div 2), and in between as many as keep
   * buckets >= 64 steps wide, so the daemon answers from rollups rather
   * than reading every raw step (a bucket's min/max are exact either way). */
  points(el, div = 1) {
    const w = pointsFor(el) / div;
    const lo = this.st.from ?? this.firstStep ?? 0, hi = this.st.to ?? this.lastStep ?? lo;
    const span = Math.max(1, hi - lo + 1);
    return Math.round(Math.max(w / 3, Math.min(w, Math.ceil(span / 64))));
  }

  q(extra) {
    return {from: this.st.from ?? undefined, to: this.st.to ?? undefined, ...extra};
  }

  /* ---- training curves -------------------------------------------------- */

  buildScalars() {
    // per-linear sigma/gamma of the LM head are scalars: they go with the collapse signals
    const s = this.m.scalars.filter((x) => !LINEAR.test(x));
    if (!s.length) return;
    const body = this.section('Training', 'line: bucket mean; band: exact min–max of the steps in each bucket; red tick: NaN/Inf in the bucket');
    const grid = h('div', {class: 'grid2'});
    body.append(grid);
    this.scalarCharts = [];
    const groups = [];
    const lossy = ['loss', 'eval_loss'].filter((x) => s.includes(x));
    if (lossy.length) groups.push({title: 'loss', metrics: lossy, unit: 'nats/token'});
    const rest = s.filter((x) => !lossy.includes(x))
      .sort((a, b) => (TRAINING_ORDER.indexOf(a) + 1 || 99) - (TRAINING_ORDER.indexOf(b) + 1 || 99) || a.localeCompare(b));
    for (const x of rest) groups.push({title: x, metrics: [x], unit: unitOf(x)});
    for (const g of groups) {
      const chart = new TimeChart(h('div', {class: 'cell'}), this.chartOpts(g.title, g.unit, {log: g.metrics.some(logByDefault), autoLog: true,
        key: 'sc:' + g.title}));
      grid.append(chart.el.parentElement);
      chart.metrics = g.metrics;
      chart.el.dataset.metrics = g.metrics.join(',');
      this.scalarCharts.push(chart);
      this.addChart(chart, async (c) => {
        const pts = this.points(c.el);
        const res = await Promise.all(g.metrics.map((m) => api.series(this.id, this.q({metric: m, points: pts}), {prio: 1})));
        const defs = g.metrics.map((m, i) => ({label: m, color: m === 'eval_loss' ? '#e15759' : color(i), band: true,
                                               width: m === 'eval_loss' ? 2 : 1.5}));
        c.nonfinite = nonfiniteSteps(res);
        await c.setData(defs, tableOf(res.map((r) => ({res: r, y: 'mean', band: true}))));
      }, 'scalar', groups.indexOf(g) < 4);
    }
  }

  /* ---- heatmap ---------------------------------------------------------- */

  buildHeatmap() {
    if (!this.m.heads.length) return;
    const sel = h('select', {id: 'hm-metric', 'aria-label': 'heatmap metric', onchange: (e) => {
      this.st.metric = e.target.value; this.push({metric: this.st.metric}); this.wantStream(); this.frameAt(this.follow ? null : +this.scrub.value);
    }}, ...this.m.heads.map((x) => h('option', {value: x, selected: x === this.st.metric}, x)));
    this.hmLogBox = h('input', {type: 'checkbox', id: 'hm-log', checked: this.hmLog(), onchange: (e) => {
      this.st.hmlog = e.target.checked; this.push({hmlog: e.target.checked ? 1 : 0}); this.redrawHeatmap();
    }});
    const body = this.section('Heads at a step', 'colour = value of the chosen metric per layer (row) and head (column); click a cell to follow that head',
      h('label', {class: 'hm-opts', title: 'logarithmic colour scale: tells 0.005 from 0.1'}, this.hmLogBox, 'log colour'), sel);
    this.scrub = h('input', {type: 'range', id: 'hm-scrub', min: this.firstStep, max: this.lastStep ?? 0, step: 1,
                              value: this.st.step ?? this.lastStep ?? 0, 'aria-label': 'step',
                              oninput: (e) => { this.stopPlay(); this.follow = false; this.frameAt(+e.target.value); }});
    this.playBtn = h('button', {class: 'btn', id: 'hm-play', onclick: () => this.togglePlay()}, '▶ Play');
    this.liveBtn = h('button', {class: 'btn light', id: 'hm-live', onclick: () => { this.stopPlay(); this.follow = true; this.frameAt(null); }}, 'Latest');
    this.stepEl = h('span', {class: 'hm-step', id: 'hm-step'}, '—');
    this.hmDescr = h('div', {class: 'muted small'});
    body.append(h('div', {class: 'scrubber'}, this.playBtn, this.scrub, this.liveBtn, this.stepEl), this.hmDescr);
    const left = h('div', {}), side = h('div', {class: 'hm-side'});
    body.append(h('div', {class: 'hm-wrap'}, left, side));
    this.hm = new Heatmap(left, {onPick: (l, hd) => this.pickHead(l, hd), layers: this.run.layers});
    // the worst heads' values at the step shown, in words
    this.worstEl = h('div', {class: 'worst', id: 'worst-heads'});
    left.append(this.worstEl);
    if (this.st.layer !== null) this.hm.sel = {l: this.st.layer, h: this.st.head ?? 0};
    // one head over the whole run, the scrubbed step marked in blue
    this.headNote = h('p', {class: 'muted small', id: 'head-note'});
    side.append(this.headNote);
    this.headChart = new TimeChart(side, this.chartOpts('', '', {height: 250, key: 'head',
      markers: () => [...this.alertMarkers(), ...(this.curStep !== undefined ? [{step: this.curStep, color: '#3b6fb6'}] : [])]}));
    this.headChart.el.id = 'head-chart';
    this.headEntry = {chart: this.headChart, loaded: false, kind: 'head'};
    this.headEntry.load = async () => {
      served(this.bkey('head'));
      this.headPend = null;   // a live refetch of new worst heads under way: this load serves it
      const sel = this.hm.sel;
      if (!sel) return;
      this.headEntry.loaded = true;
      this.pending++;
      try {
        const metric = this.st.metric, pts = this.points(this.headChart.el);
        const q = (m, l, hd) => api.series(this.id, this.q({metric: m, layer: l, head: hd, points: pts}), {prio: 1});
        if (metric !== this.headChart.metric) {
          this.headChart.metric = metric;
          this.headChart.setLog(this.st.logs.has('head') ? this.st.logs.get('head') : logByDefault(metric));
        }
        this.headChart.o.unit = unitOf(metric);
        let defs, lines, res;
        if (this.autoPick && this.worst && this.worst.length) {
          // the worst heads of the step shown, one line each
          const worst = this.worst;
          this.headWorst = worst;
          res = await Promise.all(worst.map(([l, hd]) => q(metric, l, hd)));
          this.headChart.o.title = `${metric} of the ${worst.length} worst heads at the step shown`;
          this.headChart.o.file = `${this.run.name}-${metric}-worst-heads`;
          defs = worst.map(([l, hd], i) => ({label: `L${l} h${hd}`, color: color(i), band: i === 0, width: i === 0 ? 2 : 1.4}));
          lines = res.map((r, i) => ({res: r, y: 'mean', band: i === 0}));
        } else {
          const withBound = metric === 'entropy' && this.m.heads.includes('entropy_bound');
          res = await Promise.all(withBound ? [q(metric, sel.l, sel.h), q('entropy_bound', sel.l, sel.h)] : [q(metric, sel.l, sel.h)]);
          this.headChart.o.title = `layer ${sel.l}, head ${sel.h}: ${metric}`;
          this.headChart.o.file = `${this.run.name}-${metric}-L${sel.l}-h${sel.h}`;
          defs = [{label: metric, color: '#3b6fb6', band: true, width: 1.8}];
          lines = [{res: res[0], y: 'mean', band: true}];
          if (withBound) { defs.push({label: 'entropy_bound', color: '#d62728', dash: [6, 4], width: 1.5}); lines.push({res: res[1], y: 'mean'}); }
        }
        mark('head data');
        this.headChart.nonfinite = nonfiniteSteps(res);
        await this.headChart.setData(defs, tableOf(lines));
        mark('head chart');
        this.headChart.el.dataset.layer = sel.l;
        this.headChart.el.dataset.head = sel.h;
      } catch (e) { if (e.name !== 'AbortError') this.chartError(this.headChart, e); } finally {
        this.pending--;
        this.checkComplete();
      }
    };
    this.charts.push(this.headEntry);
    // a zoomed link opens the heatmap inside its window (at its end unless it names a step)
    const lo = this.st.from ?? this.firstStep, hi = this.st.to ?? this.lastStep;
    if (this.st.from !== null || this.st.to !== null) { this.scrub.min = lo; this.scrub.max = hi; }
    const at = this.st.step ?? (this.st.to !== null ? hi : null);
    this.follow = at === null;
    this.frameAt(at === null ? null : Math.min(hi, Math.max(lo, at)));
  }

  /* ---- collapse timeline ---------------------------------------------- */

  /** Every head over the run (or the zoomed window): a row per head, a
   * column per step bucket, colour = the bucket's minimum (timeline.js). */
  buildTimeline() {
    const opts = [...this.m.heads, ...this.m.layers];
    if (!this.st.tl || !opts.length) return;
    const sel = h('select', {id: 'tl-metric', 'aria-label': 'timeline metric', onchange: (e) => {
      this.st.tl = e.target.value; this.push({tl: this.st.tl}); this.wantStream(); this.tl.layers.clear(); this.loadTimeline();
    }}, ...opts.map((x) => h('option', {value: x, selected: x === this.st.tl}, x)));
    const L = this.run.layers, H = this.run.heads;
    this.tlFold = L * H > FOLD_ROWS;
    const body = this.section('Collapse timeline',
      `${this.tlFold ? 'a row per layer (min over its heads; click one to expand it)' : 'a row per head, layer by layer'}; ` +
      'colour = lowest value in each step bucket; click a row to follow that head', sel);
    body.closest('section').id = 'timeline';
    this.tl = new Timeline(body, {
      onPick: (l, hd) => this.pickHead(l, hd),
      onExpand: (l, open) => this.expandLayer(l, open),
      markers: () => this.alertMarkers()});
    this.tl.scroll.style.minHeight = Math.min(360, 40 + Math.max(1, Math.min(10, Math.floor(300 / (this.tlFold ? L : L * H)))) * (this.tlFold ? L : L * H)) + 'px';
    if (this.st.layer !== null) this.tl.sel = {l: this.st.layer, h: this.st.head ?? 0};
    this.loadTimeline();
  }

  /** The timeline's query over the range shown: as many buckets as keep
   * rows x buckets within TL_CELLS (and the plot's width). */
  tlQuery(extra = {}) {
    const rows = extra.layer !== undefined ? this.run.heads : this.tlFold ? this.run.layers : this.run.layers * this.run.heads;
    const w = Math.max(200, (this.tl.root.clientWidth || 1000) - 60);
    const pts = Math.max(8, Math.min(w, Math.max(TL_MIN_POINTS, Math.floor(TL_CELLS / Math.max(1, this.tlRowsAll || rows)))));
    const u = new URLSearchParams({metric: this.st.tl, points: pts});
    if (this.st.from !== null) u.set('from', this.st.from);
    if (this.st.to !== null) u.set('to', this.st.to);
    if (this.tlFold && extra.layer === undefined) u.set('rows', 'layer');
    if (extra.layer !== undefined) u.set('layer', extra.layer);
    return `/api/runs/${this.id}/timeline?${u}`;
  }

  async loadTimeline() {
    if (!this.tl) return;
    served(this.bkey('timeline'));
    const gen = (this.tlGen = (this.tlGen || 0) + 1);
    this.pending++;
    try {
      this.tlRowsAll = this.tlFold ? this.run.layers : this.run.layers * this.run.heads;
      const url = this.tlQuery();
      const ans = await getJSON(url, {prio: 2});
      if (this.dead || gen !== this.tlGen) return;
      addClock([...ans.step, ...ans.end], [...ans.time, ...ans.end_time]);
      if (this.st.from === null && ans.time.length) setClockOrigin(ans.time[0]);
      else if (this.st.from !== null && !this.originAsked) {
        // zoomed: relative time still counts from the run's first step (one bucket of one row per layer)
        this.originAsked = true;
        getJSON(`/api/runs/${this.id}/timeline?metric=${encodeURIComponent(this.st.tl)}&points=1&rows=layer`)
          .then((o) => { if (!this.dead && o.time.length) { setClockOrigin(o.time[0]); if (this.st.x === 'rel') { setXMode('step'); setXMode('rel'); } } })
          .catch(() => {});
      }
      const fixed = this.st.tl === 'entropy_norm';
      this.tl.set(ans, {domain: fixed ? [0, 1] : this.domainOf(this.st.tl), collapse: fixed ? COLLAPSE_BELOW : null, url});
      // expanded layers over the new buckets
      for (const l of [...this.tl.layers.keys()]) this.expandLayer(l, true);
      const first = !this.tlLoaded;
      this.tlLoaded = true;
      this.tlError = null;
      this.tl.root.querySelector('.chart-error')?.remove();
      mark('timeline');
      // the charts drawn before the steps' times were known go on a time axis now
      if (first && this.st.x !== 'step' && hasClock()) { setXMode('step'); setXMode(this.st.x); }
    } catch (e) {
      this.tlError = e;
      const p = this.tl.root.querySelector('.chart-error') || this.tl.root.appendChild(h('p', {class: 'chart-error muted'}));
      p.textContent = e.status === 404 ? 'no data' : `could not load: ${e.message}`;
    } finally {
      this.pending--;
      this.checkComplete();
    }
  }

  /** Opens (the heads of) or folds a folded layer of the timeline. */
  async expandLayer(l, open) {
    if (!open) { this.tl.setLayer(l, null); return; }
    try {
      const ans = await getJSON(this.tlQuery({layer: l}), {prio: 2});
      if (!this.dead) this.tl.setLayer(l, ans);
    } catch { /* stays folded */ }
  }

  /** Lists the WORST_K worst heads of the frame shown with their values
   * (lowest entropy; highest of other metrics); a click follows the head. */
  showWorst(metric, f) {
    const high = !ENTROPY_FAMILY.has(metric);
    const worst = worstHeads(this.hm.flat, f.heads, WORST_K, high);
    this.worstEl.textContent = '';
    if (!worst.length) return;
    this.worstEl.append(h('div', {class: 'muted small'}, `${high ? 'highest' : 'lowest'} ${metric} at step ${fmtStep(f.step)}`));
    const tb = h('tbody');
    for (const [l, hd] of worst)
      tb.append(h('tr', {}, h('td', {}, h('a', {href: '#', onclick: (e) => { e.preventDefault(); this.pickHead(l, hd); }}, `L${l} h${hd}`)),
        h('td', {class: 'num', 'data-layer': l, 'data-head': hd}, fmt(this.hm.flat[l * f.heads + hd]))));
    this.worstEl.append(h('table', {class: 'mini worst-tbl'}, tb));
  }

  /** Whether the heatmap's colours are on a log scale: the URL's hmlog,
   * else by metric (entropy_norm: yes). */
  hmLog() { return this.st.hmlog ?? HM_LOG.has(this.st.metric); }

  redrawHeatmap() {
    if (this.hm && this.hm.frame) this.hm.set(this.hm.frame, unitOf(this.st.metric), this.domainOf(this.st.metric), this.hmLog());
  }

  /** Shows the frame at step (null: the latest). One request in flight; a
   * newer wish replaces a waiting one, so scrubbing never queues up. */
  frameAt(step) {
    this.wantFrame = {step, metric: this.st.metric};
    if (this.frameBusy) return this.framePromise;
    this.frameBusy = true;
    this.framePromise = (async () => {
      while (this.wantFrame) {
        const w = this.wantFrame;
        this.wantFrame = null;
        this.pending++;
        try {
          let f = null;
          const pf = this.preFrame;
          this.preFrame = null;
          if (pf && pf.metric === w.metric && pf.step === w.step) f = await pf.p;   // fetched before the modules loaded
          if (!f) f = await api.frame(this.id, w.metric, w.step, {prio: 3});
          if (this.dead) return;
          mark('frame');
          this.showFrame(f, w);
        } catch (e) {
          if (e.name !== 'AbortError') this.stepEl.textContent = e.status === 404 ? 'no frame yet' : 'error: ' + e.message;
          this.hmShown = true;
        } finally {
          this.pending--;
        }
      }
      this.frameBusy = false;
      this.checkComplete();
    })();
    return this.framePromise;
  }

  /** Draws frame f (an answer of GET .../frame, or a cells event of the
   * stream: the same shape) for the wish w ({step, metric, live}). */
  showFrame(f, w) {
    if (this.hmLogBox) this.hmLogBox.checked = this.hmLog();
    this.hm.set(f, unitOf(w.metric), this.domainOf(w.metric), this.hmLog());
    mark('heatmap');
    this.hmDescr.textContent = describe(w.metric) ? `${w.metric}: ${describe(w.metric)}` : w.metric;
    this.stepEl.textContent = 'step ' + fmtStep(f.step) + (this.follow ? ' (latest)' : '');
    this.stepEl.dataset.step = f.step;
    if (!this.follow || w.step !== null) this.scrub.value = f.step;
    else { if (f.step > +this.scrub.max) this.scrub.max = f.step; this.scrub.value = f.step; }
    this.hmShown = true;
    this.showWorst(w.metric, f);
    this.syncStepUrl(w.step === null ? null : f.step);
    this.curStep = f.step;
    let moved = false;
    if (!this.hm.sel) this.autoPick = true;
    if (this.autoPick && (!this.playing || !this.hm.sel)) {
      // follow the worst heads of the frame shown until the user picks
      // one: the lowest entropy, the highest of other metrics
      const high = !ENTROPY_FAMILY.has(w.metric);
      const worst = worstHeads(this.hm.flat, f.heads, WORST_K, high);
      const [l, hd] = worst[0] || [0, 0];
      if (!this.hm.sel || this.hm.sel.l !== l || this.hm.sel.h !== hd) { this.hm.select(l, hd); moved = true; }
      if (String(worst) !== String(this.worst)) { this.worst = worst; moved = true; }
      this.headNote.textContent = `the ${worst.length} ${high ? 'highest' : 'lowest'} ${w.metric} at step ${fmtStep(f.step)} — click a cell to follow one head`;
    }
    if (w.live && this.headEntry.loaded && w.metric === this.headMetric) this.liveHead(f, moved);
    else if (moved || !this.headEntry.loaded || w.metric !== this.headMetric) { this.headMetric = w.metric; this.headEntry.load(); }
    else if (this.headChart.u) this.headChart.u.redraw(false);
  }

  /** A live frame while the head chart already shows this metric: its
   * heads' values are appended (no request); when the worst heads changed,
   * the chart is refetched for the new ones (headChain). */
  liveHead(f, moved) {
    const hc = this.headChart, L = f.values;
    const at = (l, hd) => (L[l] && L[l][hd] !== undefined ? L[l][hd] : undefined);
    const heads = this.autoPick && this.headWorst ? this.headWorst : this.hm.sel ? [[this.hm.sel.l, this.hm.sel.h]] : [];
    const vals = heads.map(([l, hd]) => at(l, hd));
    if (hc.defs && hc.defs.length > vals.length) vals.push(undefined);   // the entropy bound: not on the stream here
    if (this.st.to === null) hc.append(f.step, vals);
    const p = this.headPend;
    if (p && f.step > p.to) { p.buf.push([f.step, p.heads.map(([l, hd]) => at(l, hd))]); if (p.buf.length > 2000) p.buf.shift(); }
    if (moved && this.autoPick && this.worst && this.worst.length) this.headChain();
    else if (moved) ask(this.bkey('head'), () => { if (!this.dead) this.headEntry.load(); });
  }

  /** The worst heads moved on a live page: their history, one series a
   * budget slot (one request per 10 s, not one per head at once), each up to
   * the step of the move, and the live frames since then kept aside, so the
   * chart changes to the new heads all at once, with no gap. The old heads'
   * lines go on meanwhile; a move during the chain starts another after it. */
  headChain() {
    if (this.headPend) { this.headPend.again = true; return; }
    const metric = this.st.metric, pts = this.points(this.headChart.el), to = this.lastStep ?? undefined;
    const p = (this.headPend = {heads: this.worst, metric, res: [], buf: [], to: to ?? -Infinity, again: false});
    const next = () => ask(this.bkey('head'), async () => {
      if (this.dead || this.headPend !== p) return;
      const [l, hd] = p.heads[p.res.length];
      try { p.res.push(await api.series(this.id, this.q({metric, layer: l, head: hd, points: pts, to}), {prio: 1})); } catch (e) {
        if (this.headPend === p) this.headPend = null;   // the next move asks again
        return;
      }
      if (this.headPend !== p || this.dead) return;
      if (p.res.length < p.heads.length) { next(); return; }
      this.headPend = null;
      if (metric !== this.st.metric || !this.autoPick) return;
      const hc = this.headChart;
      this.headWorst = p.heads;
      hc.o.title = `${metric} of the ${p.heads.length} worst heads at the step shown`;
      hc.o.file = `${this.run.name}-${metric}-worst-heads`;
      const defs = p.heads.map(([l, hd], i) => ({label: `L${l} h${hd}`, color: color(i), band: i === 0, width: i === 0 ? 2 : 1.4}));
      hc.nonfinite = nonfiniteSteps(p.res);
      await hc.setData(defs, tableOf(p.res.map((r, i) => ({res: r, y: 'mean', band: i === 0}))));
      if (this.st.to === null) for (const [st, vals] of p.buf) hc.append(st, vals);
      if (p.again) this.headChain();
    });
    next();
  }

  /** Colour range of a head metric: fixed where the metric has one
   * (entropy_norm 0..1; entropy and its bound 0..log T, the most a row can
   * have), so colours mean the same at every step; else the frame's range. */
  domainOf(metric) {
    if (FIXED_DOMAIN[metric]) return FIXED_DOMAIN[metric];
    if ((metric === 'entropy' || metric === 'entropy_bound') && this.run.seq_len > 1) return [0, Math.log(this.run.seq_len)];
    return undefined;
  }

  /** The heatmap's step into the URL, 200 ms after the last change: during
   * playback a history.replaceState per frame was the page's largest cost
   * (0.6 s of main thread over a 120-frame play of a 32 x 32 run). */
  syncStepUrl = (step) => {
    clearTimeout(this.urlTimer);
    this.urlTimer = setTimeout(() => urlState.set({step: step === null ? undefined : step}), 200);
  };

  togglePlay() { if (this.playing) this.stopPlay(); else this.startPlay(); }

  /** Playback: walks the whole run in about 20 s (at least one step per
   * frame), waiting for each frame to arrive before asking for the next. */
  startPlay() {
    this.playing = true;
    this.follow = false;
    this.playBtn.textContent = '❚❚ Pause';
    const lo = +this.scrub.min, hi = +this.scrub.max;
    let cur = +this.scrub.value >= hi ? lo : +this.scrub.value;
    const stride = Math.max(1, Math.round((hi - lo) / 600));
    const tick = async () => {
      if (!this.playing || this.dead) return;
      await this.frameAt(cur);
      if (cur >= hi) { this.stopPlay(); return; }
      cur = Math.min(hi, cur + stride);
      this.playTimer = setTimeout(() => requestAnimationFrame(tick), 16);
    };
    tick();
  }

  stopPlay() {
    this.playing = false;
    clearTimeout(this.playTimer);
    if (this.playBtn) this.playBtn.textContent = '▶ Play';
  }

  pickHead(l, hd) {
    this.st.layer = l; this.st.head = hd;
    urlState.set({layer: l, head: hd});
    this.hm.select(l, hd);
    if (this.tl) this.tl.select(l, hd);
    this.autoPick = false;
    this.headNote.textContent = 'the head picked on the heatmap; the blue line marks the step shown there';
    this.headEntry.load();
    const sm = this.smCharts && this.smCharts[l];
    if (sm) {
      sm.focusHead = hd;
      if (sm.chart.u) sm.chart.u.setSeries(1 + hd, {focus: true});
    }
  }

  /* ---- small multiples -------------------------------------------------- */

  buildSmallMultiples() {
    if (!this.m.heads.length) return;
    const sel = h('select', {id: 'sm-metric', 'aria-label': 'small multiples metric', onchange: (e) => {
      this.st.sm = e.target.value; this.push({sm: this.st.sm}); this.wantStream(); this.reloadKind('sm');
    }}, ...this.m.heads.map((x) => h('option', {value: x, selected: x === this.st.sm}, x)));
    const body = this.section('Every head, layer by layer',
      'one line per head (bucket mean); grey band: min–max over the layer’s heads; red dashed: entropy bound (mean over heads)', sel);
    const grid = h('div', {class: 'grid3'});
    body.append(grid);
    this.watchSection(body, 'sm', ['sm']);
    this.smCharts = [];
    const L = this.run.layers, H = this.run.heads;
    for (let l = 0; l < L; l++) {
      const chart = new TimeChart(h('div', {class: 'cell'}), this.chartOpts(`layer ${l}`, '', {height: 180, compact: true,
        log: logByDefault(this.st.sm), autoLog: true, key: 'sm:' + l}));
      grid.append(chart.el.parentElement);
      chart.el.dataset.layer = l;
      const entry = this.addChart(chart, async (c) => {
        // every head of the layer in one request (split=head); a point per
        // 3 px keeps the server on coarse rollups (bands stay exact per bucket)
        const metric = this.st.sm, pts = Math.min(Math.max(60, Math.min(200, this.points(c.el))), maxPoints(H));
        c.o.unit = unitOf(metric);
        const withBound = metric === 'entropy' && this.m.heads.includes('entropy_bound');
        const [res, bound] = await Promise.all([
          api.series(this.id, this.q({metric, layer: l, points: pts, split: 'head'})),
          withBound ? api.series(this.id, this.q({metric: 'entropy_bound', layer: l, points: pts, agg: 'mean'})) : null]);
        const heads = splitOf(res);
        const lines = heads.map((r) => ({res: r, y: 'mean'}));
        const defs = heads.map((r, k) => ({label: 'h' + r.head, color: color(k, H), width: 1.2}));
        // the grey band and dashed line over all heads, pooled from the heads' buckets
        lines.push({res: pooled(heads), y: 'mean', band: true});
        defs.push({label: 'all heads', color: '#6b7280', width: 1, dash: [2, 3], band: true});
        if (withBound) {
          lines.push({res: bound, y: 'value'});
          defs.push({label: 'entropy_bound', color: '#d62728', width: 1.5, dash: [6, 4]});
        }
        await c.setData(defs, tableOf(lines));
        if (entry.focusHead !== undefined && c.u) c.u.setSeries(1 + entry.focusHead, {focus: true});
      }, 'sm');
      this.smCharts.push(entry);
    }
  }

  /* ---- collapse signals ------------------------------------------------- */

  buildSignals() {
    const headSig = this.m.heads.filter((x) => !ENTROPY_FAMILY.has(x));
    const layerSig = this.m.layers.slice();
    const scalarSig = this.m.scalars.filter((x) => LINEAR.test(x));
    if (!headSig.length && !layerSig.length && !scalarSig.length) return;
    const body = this.section('Collapse signals', 'one line per layer; head metrics folded over the layer’s heads as stated in each title');
    this.watchSection(body, 'sig', ['sig-head', 'sig-layer', 'scalar']);
    const grid = h('div', {class: 'grid2'});
    body.append(grid);
    const L = this.run.layers;
    const mk = (metric, kind) => {
      const agg = kind === 'head' ? (SIGNAL_AGG[metric] || 'mean') : null;
      const title = kind === 'head' ? `${metric} (${agg} over heads)` : metric;
      const chart = new TimeChart(h('div', {class: 'cell'}), this.chartOpts(title, unitOf(metric), {height: 200, log: logByDefault(metric), autoLog: true,
        key: 'sig:' + metric}));
      grid.append(chart.el.parentElement);
      chart.el.dataset.metric = metric;
      chart.metric = metric;
      this.addChart(chart, async (c) => {
        const pts = Math.min(this.points(c.el, 2), maxPoints(L));   // lines only: at least a point per 6 px
        // every layer in one request (split=layer), heads folded by agg
        const layers = splitOf(await api.series(this.id, this.q({metric, split: 'layer', points: pts, agg: agg || undefined})));
        const defs = layers.map((r) => ({label: 'L' + r.layer, color: color(r.layer, L), width: 1.3}));
        await c.setData(defs, tableOf(layers.map((r) => ({res: r, y: kind === 'head' ? 'value' : 'mean'}))));
      }, kind === 'head' ? 'sig-head' : 'sig-layer');
      if (kind === 'layer') (this.layerCharts ||= []).push(chart);
    };
    // the order people read them in: QK norm and logits first, then spectrum, then rank, then linears
    const order = ['sigma_qk', 'max_logit', 'eig_mean', 'eig_var'];
    headSig.sort((a, b) => (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99));
    layerSig.sort((a, b) => rankLayer(a) - rankLayer(b) || a.localeCompare(b));
    for (const x of headSig) mk(x, 'head');
    for (const x of layerSig) mk(x, 'layer');
    for (const x of scalarSig.sort()) {
      const chart = new TimeChart(h('div', {class: 'cell'}), this.chartOpts(x, unitOf(x), {height: 200, autoLog: true, key: 'sc:' + x}));
      grid.append(chart.el.parentElement);
      chart.el.dataset.metric = x;
      chart.metrics = [x];
      (this.scalarCharts ||= []).push(chart);
      this.addChart(chart, async (c) => {
        const r = await api.series(this.id, this.q({metric: x, points: this.points(c.el)}));
        c.nonfinite = nonfiniteSteps([r]);
        await c.setData([{label: x, color: color(0), band: true}], tableOf([{res: r, y: 'mean', band: true}]));
      }, 'scalar');
    }
  }

  /* ---- alerts and events ------------------------------------------------ */

  buildAlertsEvents() {
    const body = this.section('Alerts and events', 'alerts are also marked on every chart’s step axis (red)');
    this.alertsEl = h('div', {class: 'list', id: 'alerts'}, h('p', {class: 'muted'}, 'loading…'));
    this.eventsEl = h('div', {class: 'list', id: 'events'}, h('p', {class: 'muted'}, 'loading…'));
    body.append(h('div', {class: 'grid2'},
      h('div', {}, h('h3', {}, 'Alerts'), this.alertsEl),
      h('div', {}, h('h3', {}, 'Events'), this.eventsEl)));
    this.renderAlerts();
    this.loadEvents();
  }

  async loadAlerts() {
    let a;
    try { a = await api.alerts(this.id); } catch (e) { this.alertsError = e.message; if (this.alertsEl) this.alertsEl.textContent = 'could not load alerts: ' + e.message; return; }
    this.alertsApi = a !== null;
    if (this.dead) return;
    // alerts seen on the stream but not (yet) in the API answer are kept;
    // a live transition newer than the API's row replaces it
    const live = new Map([...this.liveAlerts.values()].map((x) => [normAlert(x).key, x]));
    a = [...(a || []).filter((x) => !live.has(normAlert(x).key)), ...live.values()];
    this.alerts = a;
    this.alertsKnown = true;
    this.renderVerdict();
    this.renderAlerts();
    this.redrawMarkers();
  }

  renderAlerts() {
    if (!this.alertsEl) return;
    if (this.alertsError) { this.alertsEl.textContent = 'could not load alerts: ' + this.alertsError; return; }
    if (!this.alertsKnown) return;
    const a = this.alerts;
    this.alertsEl.textContent = '';
    if (a.length === 0 && this.alertsApi === false) {
      this.alerts = [];
      this.alertsEl.append(h('p', {class: 'muted'}, 'No alerts seen on the live stream; this daemon has no alerts history API yet (GET /api/runs/' + this.id + '/alerts).'));
      return;
    }
    if (!a.length) { this.alertsEl.append(h('p', {class: 'muted'}, 'No alerts for this run.')); return; }
    const tbl = h('table', {class: 'mini'}, h('thead', {}, h('tr', {},
      h('th', {}, 'state'), h('th', {}, 'rule'), h('th', {}, 'where'), h('th', {class: 'num'}, 'from step'), h('th', {}, 'summary'))));
    const tb = h('tbody');
    for (const x of a) {
      const al = normAlert(x);
      tb.append(h('tr', {class: 'alrow'},
        h('td', {}, h('span', {class: 'badge al-' + al.state}, al.state)),
        h('td', {}, al.rule), h('td', {class: 'where', title: al.where}, al.where),
        h('td', {class: 'num'}, al.step !== null ? h('a', {href: '#', onclick: (e) => { e.preventDefault(); this.jumpTo(al.step); }}, fmtStep(al.step)) : '—'),
        h('td', {class: 'muted summary'}, al.summary)));
    }
    tbl.append(tb);
    this.alertsEl.append(tbl);
  }

  alertMarkers() {
    return this.alerts.map(normAlert).filter((a) => a.step !== null)
      .map((a) => ({step: a.step, color: a.state === 'resolved' ? '#9aa0a6' : '#d62728', label: a.rule,
                    prio: (a.severity === 'critical' ? 2 : 0) + (a.state === 'firing' ? 1 : 0)}))
      .concat(this.rollbacks || []);
  }

  /** Alerts or rollbacks changed: every chart's markers and the timeline's. */
  redrawMarkers() {
    for (const c of this.charts) if (c.chart.u) c.chart.u.redraw(false);
    if (this.tl) this.tl.draw();
  }

  jumpTo(step) {
    const span = Math.max(200, Math.round(((this.lastStep ?? step) - this.firstStep) / 20));
    this.follow = false;
    this.setRange(Math.max(0, step - span), step + span);
    this.frameAt(step);
  }

  /** The events table, newest first, 300 a page ("Older events" loads the
   * next); then, in the background, every older page once, so that each
   * rollback in the run's history is marked on the charts. */
  async loadEvents() {
    let r;
    try { r = await api.eventsNewest(this.id, null, 300); } catch (e) { this.eventsEl.textContent = 'could not load events: ' + e.message; return; }
    if (this.dead) return;
    const ev = (r && r.events) || [];
    this.rollbacks = [];
    this.eventsEl.textContent = '';
    if (!ev.length) { this.eventsEl.append(h('p', {class: 'muted'}, 'No events.')); window.__rollbacks = []; return; }
    this.eventsBody = h('tbody');
    this.eventsEl.append(h('table', {class: 'mini'}, this.eventsBody));
    this.olderBtn = h('button', {class: 'btn light', id: 'events-older', onclick: () => this.olderEvents()}, 'Older events');
    this.eventsEl.append(this.olderBtn);
    this.showEvents(r);
    this.markRollbacks(ev);
    this.allRollbacks(r, ++this.eventsGen);
  }

  showEvents(r) {
    for (const e of r.events)
      this.eventsBody.append(h('tr', {}, h('td', {class: 'muted nowrap'}, new Date(e.time * 1000).toISOString().slice(5, 19).replace('T', ' ')),
        h('td', {}, h('span', {class: 'badge lv-' + e.level}, e.level)), h('td', {}, e.text)));
    this.oldestEvent = r.events.length ? r.events[r.events.length - 1].id : this.oldestEvent;
    this.olderBtn.hidden = !r.more;
  }

  async olderEvents() {
    const r = await api.eventsNewest(this.id, this.oldestEvent, 300).catch(() => null);
    if (r && !this.dead) this.showEvents(r);
  }

  /** A trainer that rolled back rewrote history from that step: mark it. */
  markRollbacks(ev) {
    const found = ev.map((e) => /rollback to step (\d+)/.exec(e.text || '')).filter(Boolean)
      .map((m) => ({step: +m[1], color: '#e68a00', label: 'rollback', prio: 4}));
    if (!found.length) return;
    this.rollbacks.push(...found);
    this.redrawMarkers();
  }

  async allRollbacks(r, gen) {
    const current = () => !this.dead && gen === this.eventsGen;  // a newer loadEvents took over
    for (let pages = 0; r && r.more && r.events.length && pages < 1000 && current(); pages++) {
      r = await api.eventsNewest(this.id, r.events[r.events.length - 1].id, 1000).catch(() => null);
      if (r && current()) this.markRollbacks(r.events || []);
    }
    if (current()) window.__rollbacks = this.rollbacks.map((m) => m.step);
  }

  /* ---- range, live ------------------------------------------------------ */

  setRange(from, to) {
    if (from !== null && to !== null && to - from < 2) to = from + 2;
    if (from === this.st.from && to === this.st.to) return;
    this.st.from = from; this.st.to = to;
    this.push({from: from ?? undefined, to: to ?? undefined});
    this.showRange();
    this.loadTimeline();
    this.scrubWindow();
    for (const c of this.charts) if (c.loaded) c.load();
  }

  /** The heatmap's scrubber (and Play) span the zoomed window; a step
   * outside it moves to its nearest end. */
  scrubWindow() {
    if (!this.scrub) return;
    const lo = this.st.from ?? this.firstStep ?? 0, hi = Math.max(lo, this.st.to ?? this.lastStep ?? lo);
    this.scrub.min = lo;
    this.scrub.max = hi;
    const cur = this.curStep;
    if (cur !== undefined && (cur < lo || cur > hi)) {
      this.stopPlay();
      this.follow = false;
      this.frameAt(Math.min(hi, Math.max(lo, cur)));
    }
  }

  reloadKind(kind) { for (const c of this.charts) if (c.kind === kind && c.loaded) c.load(); }

  onLive(type, d) {
    if (!this.run || this.dead) return;
    if (type === 'state') { this.showStatus(); return; }
    if (type === 'open') { this.reconnected(); return; }
    if (type === 'reset') { this.refreshAll(); return; }
    if (!d || d.run !== this.id) return;
    if (type === 'run') {
      if (d.status === 'deleted') { this.root.prepend(h('p', {class: 'error'}, 'This run was deleted.')); return; }
      this.showStatus(d.status);
      this.refreshVerdict();
      return;
    }
    if (type === 'alert') {
      // the transition itself updates the list and the markers: no refetch
      const k = normAlert(d).key;
      this.liveAlerts.set(k, d);   // the latest transition of each alert
      if (this.alertsKnown) {
        this.alerts = [...this.alerts.filter((x) => normAlert(x).key !== k), d];
        this.renderAlerts();
        this.redrawMarkers();
      }
      this.refreshVerdict();
      return;
    }
    if (type !== 'tick' && type !== 'layers' && type !== 'cells') return;
    if (!this.m.scalars.length && !this.m.layers.length && !this.m.heads.length) {
      // the run had no data when the page opened: build the page now that it has
      if (!this.rebuilding) { this.rebuilding = true; setTimeout(() => window.dispatchEvent(new PopStateEvent('popstate')), 200); }
      return;
    }
    const step = d.step;
    if (type === 'tick') this.liveTick(d);
    else if (type === 'layers') this.liveLayers(d);
    else this.liveCells(d);
    if (this.scrub && this.st.to === null && step > +this.scrub.max) this.scrub.max = step;
    this.verdictPoll();
  }

  /** A tick: the header's step and loss, and a point per training curve
   * (mean, with the tick's min-max as its band). */
  liveTick(d) {
    const step = d.step, sc = d.scalars || {};
    if (Number.isFinite(d.time)) addClock([step], [d.time]);
    if (this.lastStep === null || this.lastStep === undefined || step > this.lastStep) this.lastStep = step;
    this.lastStepEl.textContent = fmtStep(step);
    this.lastStepEl.dataset.step = step;
    if (sc.loss) { this.lastLossEl.textContent = fmt(sc.loss[3]); this.lossShownStep = step; }
    if (this.run.status !== 'live') this.showStatus('live');
    // appended live only while showing up to the end of the run
    if (this.st.to !== null) return;
    for (const c of this.scalarCharts || [])
      // a metric the tick did not carry (eval_loss between evals) is
      // undefined, nothing; a null mean is NaN/Inf all through the tick (red tick)
      c.append(step, c.metrics.map((m) => (m in sc ? [sc[m][1], sc[m][0], sc[m][2]] : undefined)));
  }

  /** Layer metrics (mean per layer) and head metrics folded per layer
   * (min, mean, max over heads) since the last layers event. */
  liveLayers(d) {
    this.lastLayers = d;
    if (this.st.to !== null) return;
    for (const c of this.layerCharts || [])
      if (d.layers && d.layers[c.metric]) c.append(d.step, d.layers[c.metric]);
    for (const e of this.charts) {
      if (e.kind !== 'sig-head') continue;
      const f = d.heads && d.heads[e.chart.metric];
      if (f) e.chart.append(d.step, f[SIGNAL_AGG[e.chart.metric] || 'mean']);
    }
  }

  /** A head metric's values at a step: the heatmap (when it follows the
   * latest step), the head chart and the small multiples. */
  liveCells(d) {
    if (this.tl && d.metric === this.st.tl && this.st.to === null && this.tlLoaded && !this.tl.addCells(d)) {
      // the live columns outnumber the fetched ones: refetch, wider buckets, in the budget's next slot
      ask(this.bkey('timeline'), () => { if (!this.dead) this.loadTimeline(); });
    }
    if (d.metric === this.st.metric && this.hm && this.follow && !this.playing && !this.frameBusy) {
      this.showFrame(d, {step: null, metric: d.metric, live: true});
      this.checkComplete();
    }
    if (d.metric !== this.st.sm || this.st.to !== null || !this.smCharts) return;
    const fold = this.lastLayers && this.lastLayers.step === d.step && this.lastLayers.heads ? this.lastLayers.heads : {};
    const band = fold[d.metric], bound = fold.entropy_bound;
    for (let l = 0; l < this.smCharts.length; l++) {
      const c = this.smCharts[l].chart, row = d.values[l] || [];
      if (!c.defs && !c.pendingDefs && !c.data) continue;
      const vals = [...row, band ? [band.mean[l], band.min[l], band.max[l]] : undefined];
      if (d.metric === 'entropy' && this.m.heads.includes('entropy_bound')) vals.push(bound ? bound.mean[l] : undefined);
      c.append(d.step, vals);
    }
  }

  /** The stream is back after a loss: error overlays go, the charts whose
   * load failed meanwhile load again, and the alerts list is asked again
   * (a reset, when the daemon cannot replay, reloads everything instead). */
  reconnected() {
    this.showStatus();
    for (const c of this.charts) {
      const err = c.chart.el.querySelector('.chart-error');
      if (!err) continue;
      err.remove();
      if (c.loaded) c.load();
    }
    if (this.alertsError) { this.alertsError = null; this.loadAlerts(); }
    if (this.tlError) this.loadTimeline();
    if (this.stepEl && /^error/.test(this.stepEl.textContent) && this.hm) this.frameAt(this.follow ? null : +this.scrub.value);
  }

  /** The daemon's verdict changes with alerts and the run's end: ask again
   * a second after the event (a collapse fires many alerts at once: one
   * ask), first in the budget's next slot (at most one request per 10 s);
   * a derived verdict follows the alerts. */
  refreshVerdict(urgent = true) {
    this.renderVerdict();
    if (!this.run.verdict || this.verdictTimer) return;
    this.verdictTimer = setTimeout(() => {
      this.verdictTimer = null;
      ask(this.bkey('verdict'), async () => {
        this.verdictAt = performance.now();
        if (this.dead) return;
        try { const r = await api.run(this.id); if (!this.dead && r) { this.run.verdict = r.verdict; this.renderVerdict(); } } catch { /* next event */ }
      }, {urgent});
    }, 1000);
  }

  /** The daemon's verdict can turn (collapsing while a rule is pending)
   * without an alert event: on a live run, asked every 30 s (in the budget,
   * behind the asks before it). */
  verdictPoll() {
    const now = performance.now();
    if (this.verdictAt === undefined) this.verdictAt = now;
    if (now - this.verdictAt >= 30000) { this.verdictAt = now; this.refreshVerdict(false); }
  }

  /** A budget key of this view (budget.js). */
  bkey(k) { return `run${this.id}.${this.viewNo ??= ++viewCount}:${k}`; }

  async refreshAll() {
    try {
      const run = await api.run(this.id);
      this.showStatus(run.status);
      this.lastStep = run.last_step;
      this.lastStepEl.textContent = fmtStep(run.last_step);
      if (this.scrub) this.scrub.max = run.last_step ?? 0;
    } catch { /* the next event retries */ }
    for (const c of this.charts) if (c.loaded) c.load();
    if (this.hm) this.frameAt(this.follow ? null : +this.scrub.value);
    this.loadTimeline();
    this.loadAlerts();
    this.loadEvents();
  }

  checkComplete() {
    const r = window.__render;
    if (!r || r.complete || !this.headerDone || this.pending > 0) return;
    if (this.hm && !this.hmShown) return;
    if (this.tl && !this.tlLoaded && !this.tlError) return;
    if (this.charts.length && !this.charts.some((c) => c.loaded)) return;
    r.complete = true;
    r.completeAt = performance.now();
    r.charts = this.charts.filter((c) => c.loaded).length;
  }

  destroy() {
    this.dead = true;
    this.stopPlay();
    clearTimeout(this.verdictTimer);
    forget(this.bkey(''));
    clearTimeout(this.urlTimer);
    clearInterval(this.agoTimer);
    this.unsub();
    for (const io of this.observers || []) io.disconnect();
    for (const c of this.charts) c.chart.destroy();
    if (this.hm) this.hm.destroy();
    if (this.tl) this.tl.destroy();
    // the next view (another run, compare) starts on steps with no clock
    setXMode('step');
    resetClock();
  }
}

/** [[layer, head], ...] of the k lowest (high: highest) finite values of a
 * flat L x H frame, worst first. */
function worstHeads(flat, H, k, high = false) {
  // one pass keeping the k worst in order (k is small; a sort of every head ran per frame of playback)
  const top = [];
  const worse = (i, j) => (high ? flat[i] > flat[j] : flat[i] < flat[j]);
  for (let i = 0; i < flat.length; i++) {
    if (!Number.isFinite(flat[i])) continue;
    if (top.length === k && !worse(i, top[k - 1])) continue;
    let p = top.length < k ? top.length : k - 1;
    top[p] = i;
    while (p > 0 && worse(top[p], top[p - 1])) { [top[p], top[p - 1]] = [top[p - 1], top[p]]; p--; }
  }
  return top.map((i) => [Math.floor(i / H), i % H]);
}

function rankLayer(name) {
  if (name === 'rank_ratio') return 0;
  if (name === 'cos_sim') return 1;
  if (/^sigma/.test(name)) return 2;
  if (/^gamma/.test(name)) return 3;
  return 4;
}
