// charts.js: time-series charts on uPlot (vendored, web/vendor/uplot).
// A TimeChart shows lines over training steps, each optionally with a
// min/max band (the exact per-bucket extremes from the series API, so a
// one-step spike stays visible at any zoom), alert markers on the step axis,
// a legend with live values and a unit on the y axis. Drag to zoom (the
// owner refetches at finer resolution), double-click to zoom out.
// uPlot comes from vendor/uplot/uPlot.iife.min.js, which app.js loads before this module
const uPlot = window.uPlot;
import {downloadBlob, ema, fmt, fmtStep, h, rafThrottle, themeColors} from './util.js';

const charts = new Set();

// The draw queue: one chart per task (setTimeout 0), in the order asked.
const drawJobs = new Map();   // chart -> [resolve]
let drawing = false;
function drawLater(chart, resolve) {
  const w = drawJobs.get(chart);
  if (w) w.push(resolve); else drawJobs.set(chart, [resolve]);
  if (!drawing) { drawing = true; setTimeout(drawOne, 0); }
}
function drawOne() {
  const next = drawJobs.entries().next();
  if (next.done) { drawing = false; return; }
  const [chart, waiters] = next.value;
  drawJobs.delete(chart);
  try { chart.render(); } catch (e) { console.error('chart', e); }
  // uPlot draws in a microtask queued by render(): resolve after it
  queueMicrotask(() => waiters.forEach((r) => r()));
  if (drawJobs.size) setTimeout(drawOne, 0); else drawing = false;
}
const onResize = rafThrottle(() => { for (const c of charts) c.resize(); });
window.addEventListener('resize', onResize);
// a theme change (dark mode) rebuilds every chart with the new axis colours
window.addEventListener('themechange', () => { for (const c of charts) if (c.u) c.build(); });

/** EMA smoothing of every chart's lines (0 = off; TensorBoard's slider):
 * the lines are smoothed, the min-max bands stay the raw data's. */
let smoothing = 0;
export function setSmoothing(a) {
  smoothing = Math.min(0.999, Math.max(0, +a || 0));
  for (const c of charts) if (c.u) c.u.setData(c.shown());
}
export const getSmoothing = () => smoothing;

/* ---- the x axis: step, wall time or time since the start ---------------
 * Every step carries the trainer's clock; the run page feeds the pairs it
 * has (the timeline answer's bucket edges, the live ticks) to addClock. In
 * a time mode the charts' x values are the steps' times (interpolated
 * between known pairs, never decreasing), so a stall is a gap and a
 * slowdown a stretch; zooming and markers convert back to steps. */
/** The times of one run's steps: (step, time) pairs, interpolated between
 * (never decreasing), and the time its relative axis counts from. */
export class StepClock {
  constructor() { this.steps = []; this.times = []; this.t0 = null; }
  /** Adds (step, time) pairs (any order; null times skipped). */
  add(steps, times) {
    const m = new Map(this.steps.map((s, i) => [s, this.times[i]]));
    steps.forEach((s, i) => { if (Number.isFinite(times[i])) m.set(s, times[i]); });
    const ks = [...m.keys()].sort((a, b) => a - b);
    let run = -Infinity;
    this.steps = ks;
    this.times = ks.map((k) => (run = Math.max(run, m.get(k))));
    if (this.t0 === null && this.times.length) this.t0 = this.times[0];
  }
  get known() { return this.steps.length >= 1; }
  /** The time of a step (seconds: Unix time, or since t0 for 'rel'). */
  time(step, mode) {
    const t = interp(this.steps, this.times, step);
    return mode === 'rel' ? t - (this.t0 ?? 0) : t;
  }
  /** The step at a time of mode (the inverse of time). */
  step(x, mode) { return interp(this.times, this.steps, mode === 'rel' ? x + (this.t0 ?? 0) : x); }
}
// the run page's clock (one run; the compare view keeps one per run)
let clock = new StepClock();
let xMode = 'step';
export const X_MODES = ['step', 'wall', 'rel'];
/** The words of each mode in the x axis menus (run page and compare). */
export const X_NAMES = {step: 'step', wall: 'wall time', rel: 'relative time'};
export function setXMode(m) {
  m = X_MODES.includes(m) ? m : 'step';
  if (m === xMode) return;
  xMode = m;
  for (const c of charts) if (c.u && !c.o.x) c.build();
}
export const getXMode = () => xMode;
/** Forgets every step's time and the origin (a view showing another run). */
export function resetClock() { clock = new StepClock(); }
/** The time "relative time" counts from (the run's first step's). */
export function setClockOrigin(t) { if (Number.isFinite(t)) clock.t0 = t; }
/** Adds (step, time) pairs (any order; null times skipped). */
export function addClock(steps, times) { clock.add(steps, times); }
/** Whether the times of steps are known (a time axis can be drawn). */
export const hasClock = () => clock.known;
function interp(xs, ys, x) {
  const n = xs.length;
  if (!n) return NaN;
  if (n === 1) return ys[0];
  let lo = 0, hi = n - 1;
  if (x <= xs[0]) hi = 1; else if (x >= xs[n - 1]) lo = n - 2;
  else while (hi - lo > 1) { const m = (lo + hi) >> 1; if (xs[m] <= x) lo = m; else hi = m; }
  const dx = xs[hi] - xs[lo];
  return dx ? ys[lo] + ((ys[hi] - ys[lo]) * (x - xs[lo])) / dx : ys[lo];
}
/** The time of a step (seconds: Unix time, or since the start for 'rel'). */
export function timeOf(step, mode = xMode) { return clock.time(step, mode); }
/** The step at a time of the current mode (the inverse of timeOf). */
export function stepOf(x) { return clock.step(x, xMode); }
const pad2 = (v) => String(v).padStart(2, '0');
/** A wall-clock time as HH:MM:SS (with the date when the span is days). */
export function wallLabel(t, span) {
  const d = new Date(t * 1000);
  const hm = `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
  if (span > 2 * 86400) return `${d.getMonth() + 1}/${d.getDate()} ${hm}`;
  return span > 600 ? hm : `${hm}:${pad2(d.getSeconds())}`;
}
/** A duration: 42 s, 3 min 20 s, 2 h 05 min, 3 d 4 h. */
export function durLabel(s) {
  const a = Math.abs(s), sg = s < 0 ? '−' : '';
  if (a < 60) return sg + (a < 10 ? +a.toFixed(1) : Math.round(a)) + ' s';
  if (a < 3600) { const m = Math.floor(a / 60), r = Math.round(a % 60); return sg + m + ' min' + (r && m < 10 ? ` ${r} s` : ''); }
  if (a < 86400) { const hh = Math.floor(a / 3600), m = Math.round((a % 3600) / 60); return sg + hh + ' h' + (m ? ` ${pad2(m)} min` : ''); }
  const dd = Math.floor(a / 86400), hh = Math.round((a % 86400) / 3600);
  return sg + dd + ' d' + (hh ? ` ${hh} h` : '');
}
/** Nice tick spacings of a time axis, in seconds. */
const TIME_INCRS = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
                    86400, 172800, 604800, 2592000, 31536000];
/** The x axis of the mode in force, in step space (the timeline buckets by
 * step): label(step) in the mode's words, ticks(from, to, n) ~n steps to
 * label at nice values of the mode. */
export function xAxis(mode = xMode) {
  const timed = mode !== 'step' && hasClock();
  if (!timed) {
    return {mode: 'step', label: (st) => compactStep(st),
      ticks: (a, b, n) => { const inc = STEP_INCRS.find((x) => (b - a) / x <= n) || (b - a); const o = []; for (let v = Math.ceil(a / inc) * inc; v <= b; v += inc) o.push(v); return o; }};
  }
  return {mode, label: (st) => { const t = timeOf(st, mode); return mode === 'wall' ? wallLabel(t, timeOf(1e15, 'wall') - timeOf(0, 'wall')) : durLabel(t); },
    ticks: (a, b, n) => {
      const ta = timeOf(a, mode), tb = timeOf(b, mode);
      const inc = TIME_INCRS.find((x) => (tb - ta) / x <= n) || (tb - ta || 1);
      const o = [];
      for (let v = Math.ceil(ta / inc) * inc; v <= tb && o.length < 50; v += inc) o.push(stepOf(mode === 'rel' ? v : v));
      return o;
    }};
}
/** Words of the axis: what its values are. */
const X_TITLE = {step: 'step', wall: 'wall time (trainer clock)', rel: 'time since the run began'};

/** Markers closer than gap px fold into one group: {x, step, color, items}
 * (items most important first; x and colour the first one's). xOf(m)
 * gives a marker's x. */
export function foldMarkers(ms, xOf, gap) {
  const pts = ms.map((m) => ({m, x: xOf(m)})).filter((p) => Number.isFinite(p.x)).sort((a, b) => a.x - b.x);
  const groups = [];
  for (const p of pts) {
    const g = groups[groups.length - 1];
    if (g && p.x - g.last <= gap) { g.items.push(p.m); g.last = p.x; g.xs.push(p.x); } else groups.push({items: [p.m], xs: [p.x], last: p.x});
  }
  return groups.map((g) => {
    const items = g.items.slice().sort((a, b) => (b.prio || 0) - (a.prio || 0) || a.step - b.step);
    const top = items[0], x = g.xs[g.items.indexOf(top)];
    return {x, step: top.step, color: top.color || '#d62728', items};
  });
}

/** Metrics that span decades: their charts start on a log axis. */
const LOG_DEFAULT = new Set(['entropy_norm', 'max_logit', 'sigma_qk']);
export const logByDefault = (metric) => LOG_DEFAULT.has(metric);

/** Turns series API answers into one aligned table for uPlot.
 * lines: [{res (a series answer), y: 'mean'|'value'|'min'|'max', band: bool}]
 * Returns [xs, ...columns] where a line with band adds [y, max, min]. */
export function tableOf(lines) {
  const tables = lines.map((l) => {
    const r = l.res;
    const ncols = l.band ? 3 : 1;
    if (!r || !r.step || !r.step.length) return [[], ...Array.from({length: ncols}, () => [])];
    const y = l.y === 'value' && r.value ? r.value : (r[l.y] || r.mean);
    const t = [r.step.slice(), y.slice()];
    if (l.band) t.push(r.max.slice(), r.min.slice());
    return t;
  });
  if (tables.length === 1) return tables[0];
  const nonEmpty = tables.filter((t) => t[0].length);
  if (!nonEmpty.length) return [[], ...tables.flatMap((t) => t.slice(1))];
  return uPlot.join(tables);
}

/** The series of a split answer (?split=head|layer) as answers of their
 * own, {layer, head, step, end, width, min, max, mean, count, nonfinite
 * [, value]}: they share the answer's buckets, and tableOf takes them like
 * any other answer. */
export function splitOf(res) {
  if (!res || !Array.isArray(res.series)) return [];
  return res.series.map((s) => ({...s, step: res.step, end: res.end, width: res.width}));
}

/** Pools answers over the same buckets (the heads of a split answer) into
 * one, as the daemon pools cells: per bucket the lowest min, the highest
 * max, count and nonfinite summed, and mean = sum(mean * count) / sum(count)
 * (null where no series has a finite value). `value` is that mean. */
export function pooled(answers) {
  const first = answers[0] || {step: [], end: []}, n = first.step.length;
  const min = new Array(n).fill(null), max = new Array(n).fill(null), mean = new Array(n).fill(null);
  const count = new Array(n).fill(0), nonfinite = new Array(n).fill(0);
  for (let i = 0; i < n; i++) {
    let lo = Infinity, hi = -Infinity, sum = 0, c = 0, nf = 0;
    for (const r of answers) {
      const k = r.count[i];
      nf += r.nonfinite[i];
      if (!k) continue;
      if (r.min[i] < lo) lo = r.min[i];
      if (r.max[i] > hi) hi = r.max[i];
      sum += r.mean[i] * k;
      c += k;
    }
    count[i] = c;
    nonfinite[i] = nf;
    if (c) { min[i] = lo; max[i] = hi; mean[i] = sum / c; }
  }
  return {step: first.step, end: first.end, width: first.width, min, max, mean, count, nonfinite, value: mean};
}

export class TimeChart {
  /** parent: element; o: {title, unit, height, onZoom(from, to), onReset(),
   *  markers(): [{step, color, label}], compact, log (start on a log y
   *  axis), sync (crosshair group key), file (download file name base),
   *  x: {mode() -> 'step'|'wall'|'rel', label(x) -> legend text,
   *  toSteps(a, b) -> [from, to]}: the owner's x axis, whose tables
   *  already hold that mode's x values and whose markers may carry their
   *  own x (the compare view: each run on its own clock); without it,
   *  steps, mapped to times by the run page's clock in a time mode} */
  constructor(parent, o) {
    this.o = o;
    this.log = !!o.log;
    this.el = document.createElement('div');
    this.el.className = 'chart loading' + (o.compact ? ' compact' : '');
    this.logBtn = h('button', {class: 'tool', 'data-tool': 'log', title: 'logarithmic y axis', 'aria-pressed': String(this.log),
                               onclick: () => this.setLog(!this.log, true)}, 'log');
    this.tools = h('div', {class: 'chart-tools'}, this.logBtn,
      h('button', {class: 'tool', 'data-tool': 'png', title: 'download this chart as PNG', onclick: () => this.downloadPNG()}, 'PNG'),
      h('button', {class: 'tool', 'data-tool': 'csv', title: 'download the data of this chart as CSV', onclick: () => this.downloadCSV()}, 'CSV'));
    this.el.append(this.tools);
    parent.append(this.el);
    this.el.__chart = this;   // for tests and the console
    // the final height before data arrives, so lazy loading sees the real layout
    this.el.style.minHeight = (o.height || 220) + (o.compact ? 90 : 70) + 'px';
    this.u = null;
    this.defs = null;
    this.data = null;
    charts.add(this);
  }

  /** defs: [{label, color, width, dash, band}] — band adds a min/max band
   * around that line (its data columns: y, max, min). */
  /** defs: [{label, color, width, dash, band}] — band adds a min/max band
   * around that line (its data columns: y, max, min). The data is kept at
   * once; the drawing is queued (one chart per task, so many charts arriving
   * together never make one long task). Resolves once drawn. */
  setData(defs, table) {
    const key = JSON.stringify([this.o.unit, this.o.title, defs.map((d) => [d.label, d.color, !!d.band, d.dash, d.width]),
                                this.o.x ? this.o.x.mode() : null]);
    this.data = table;
    this.fetched = table[0] ? table[0].length : 0;
    // data flows again: an earlier "could not load" goes
    this.el.querySelector('.chart-error')?.remove();
    this.reloading = false;
    // live steps that came while this data was being fetched
    if (this.backlog && table[0]) {
      const cols = 1 + defs.reduce((n, d) => n + (d.band ? 3 : 1), 0);
      if (table.length === cols) for (const [st, v] of this.backlog) this.push(st, v, defs);
    }
    this.backlog = null;
    // autoLog: the first data decides the axis, log when the lines span
    // three decades or more of positive values (a click on "log" overrides)
    if (this.o.autoLog && !this.logDecided && table[0] && table[0].length) {
      this.logDecided = true;
      if (!this.log && spansDecades(table, defs)) { this.log = true; this.logBtn.setAttribute('aria-pressed', 'true'); }
    }
    this.pendingDefs = defs;
    this.pendingKey = key;
    return new Promise((resolve) => drawLater(this, resolve));
  }

  /** Runs queued by setData: builds or updates the uPlot instance. */
  render() {
    if (this.dead || !this.pendingDefs) return;
    const defs = this.pendingDefs, key = this.pendingKey;
    this.pendingDefs = null;
    if (this.u && key === this.key) this.u.setData(this.shown());
    else {
      this.key = key;
      this.defs = defs;
      this.build();
    }
  }

  build() {
    if (this.u) this.u.destroy();
    const o = this.o, defs = this.defs, th = themeColors();
    // o.x: the owner draws its own x values (the compare view: each run on
    // its own clock); else the run page's clock maps steps to times here
    const mode = o.x ? o.x.mode() : xMode;
    const timed = o.x ? mode !== 'step' : xMode !== 'step' && hasClock();
    this.timed = timed;
    const xLabel = (v) => (o.x ? o.x.label(v) : `${xAxis().label(stepOf(v))} (step ${fmtStep(stepOf(v))})`);
    const series = [{label: timed ? 'time' : 'step',
                     value: (u, v) => (v === null || v === undefined ? '' : timed ? xLabel(v) : fmtStep(v))}];
    const bands = [];
    for (const d of defs) {
      const i = series.length;
      // a null (a bucket whose values were all NaN/Inf) is a gap; a step
      // missing from one series of a joined table (undefined) is spanned
      series.push({label: d.label, stroke: d.color, width: d.width || 1.5, dash: d.dash, spanGaps: false,
                   points: {size: 4, fill: d.color}, value: (u, v) => fmt(v)});
      if (d.band) {
        const edge = {stroke: 'transparent', width: 0, class: 'band-edge', spanGaps: false, points: {show: false}};
        series.push({...edge, label: d.label + ' max', value: (u, v) => fmt(v)});
        series.push({...edge, label: d.label + ' min', value: (u, v) => fmt(v)});
        bands.push({series: [i + 1, i + 2], fill: d.color + '2e'});
      }
    }
    const width = Math.max(200, this.el.clientWidth || this.el.parentElement.clientWidth || 600);
    const axis = {stroke: th.axis, grid: {stroke: th.grid}, ticks: {stroke: th.tick}};
    const y = this.log
      ? {distr: 3, log: 10, range: yRangeLog}
      : {range: yRange};
    const opts = {
      width, height: o.height || 220,
      title: o.title,
      series, bands,
      scales: {x: {time: false}, y},
      axes: [
        timed
          ? {...axis, label: X_TITLE[mode], labelSize: 18, size: 36, incrs: TIME_INCRS, space: 70,
             values: (u, vals) => vals.map((v) => (mode === 'wall' ? wallLabel(v, u.scales.x.max - u.scales.x.min) : durLabel(v)))}
          : {...axis, label: 'step', labelSize: 18, size: 36, incrs: STEP_INCRS, values: (u, vals) => vals.map((v) => compactStep(v))},
        {...axis, label: o.unit || 'value', labelSize: 18, size: 58,
         splits: this.log ? logSplits : ySplits, values: this.log ? logTicks : linTicks,
         // the splits above are already thinned: keep uPlot from thinning them again
         filter: (u, splits) => splits},
      ],
      legend: {live: true},
      // cursor dots are one composited element per series (will-change):
      // with 30+ heads per chart and dozens of charts, painting them costs
      // more than everything else, so many-line charts go without.
      // dataIdx: the legend shows a series' value at the step under the
      // cursor or nothing, never the nearest step that has one (uPlot's
      // default would show eval_loss "at" a step where no eval ran).
      // sync: one crosshair across the page's charts, by step.
      cursor: {drag: {x: true, y: false, setScale: false}, focus: {prox: 16}, points: {show: defs.length <= 6},
               dataIdx: (u, si, idx) => (o.x && timed ? nearestDefined(u, si, idx) : idx),
               sync: o.sync ? {key: o.sync, setSeries: false} : undefined},
      focus: {alpha: 0.35},
      hooks: {
        setSelect: [(u) => {
          if (u.select.width < 4) return;
          let a = u.posToVal(u.select.left, 'x'), b = u.posToVal(u.select.left + u.select.width, 'x');
          if (this.timed && o.x) [a, b] = o.x.toSteps(a, b);
          else if (this.timed) { a = stepOf(a); b = stepOf(b); }
          u.setSelect({left: 0, width: 0, top: 0, height: 0}, false);
          if (o.onZoom) o.onZoom(Math.max(0, Math.floor(a)), Math.ceil(b));
        }],
        draw: [(u) => this.drawMarkers(u)],
      },
    };
    this.u = new uPlot(opts, this.shown(), this.el);
    this.el.classList.remove('loading');
    this.el.dataset.scale = this.log ? 'log' : 'linear';
    this.el.style.minHeight = '';
    this.u.over.addEventListener('dblclick', () => { if (o.onReset) o.onReset(); });
    // the folded markers' list on hover, near the top of the plot
    this.u.over.addEventListener('mousemove', (e) => this.markerHover(e));
    if (!this.leaveBound) {
      // on the chart, not its plot: a rebuild (new data, theme) replaces the plot under the pointer
      this.leaveBound = true;
      this.el.addEventListener('mouseleave', () => { if (this.mtip) this.mtip.hidden = true; });
    }
  }

  /** The table drawn: the data with each line EMA-smoothed (when smoothing
   * is on; the band columns stay raw) and, on a log axis, values <= 0 as
   * gaps (they have no place on it). this.data stays the raw data. */
  shown() {
    const t = this.data, defs = this.defs || this.pendingDefs;
    const timed = !this.o.x && xMode !== 'step' && hasClock();
    if (!t || !defs || (!smoothing && !this.log && !timed)) return t;
    const out = [timed ? t[0].map((st) => timeOf(st)) : t[0]];
    let c = 1;
    const pos = (col) => (this.log ? col.map((v) => (v === null || v === undefined || v > 0 ? v : null)) : col);
    for (const d of defs) {
      if (c >= t.length) break;
      out.push(pos(smoothing ? ema(t[c], smoothing) : t[c])); c++;
      if (d.band) { out.push(pos(t[c])); out.push(pos(t[c + 1])); c += 2; }
    }
    return out;
  }

  /** user: a click on "log" (told to o.onLog, which keeps it in the URL). */
  setLog(on, user = false) {
    this.log = !!on;
    this.logDecided = true;
    this.logBtn.setAttribute('aria-pressed', String(this.log));
    if (this.u) this.build();
    if (user && this.o.onLog) this.o.onLog(this.log);
  }

  /** The chart's data as CSV: a row per step, a column per line, plus its
   * band's max and min (what the chart shows; the raw values, and the
   * smoothed line as <label>_ema when smoothing is on). */
  csv() {
    const t = this.data, defs = this.defs;
    if (!t || !defs) return '';
    // an owner's time axis holds times, not steps, in the first column
    const head = [this.o.x && this.timed ? (this.o.x.mode() === 'wall' ? 'time' : 'seconds_since_start') : 'step'], cols = [];
    let c = 1;
    const sm = smoothing ? this.shown() : null;
    for (const d of defs) {
      head.push(d.label); cols.push(t[c]);
      if (sm) { head.push(d.label + '_ema'); cols.push(sm[c]); }
      c++;
      if (d.band) { head.push(d.label + '_max', d.label + '_min'); cols.push(t[c], t[c + 1]); c += 2; }
    }
    const cell = (v) => (v === null ? 'nan' : v === undefined ? '' : String(v));
    const q = (s) => (/[",\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s);
    const lines = [head.map(q).join(',')];
    for (let i = 0; i < t[0].length; i++) lines.push([t[0][i], ...cols.map((col) => cell(col[i]))].join(','));
    return lines.join('\n') + '\n';
  }

  fileName(ext) {
    const base = (this.o.file || this.o.title || 'chart').replace(/[^A-Za-z0-9._-]+/g, '_').replace(/^_+|_+$/g, '');
    return `${base || 'chart'}.${ext}`;
  }

  downloadCSV() { downloadBlob(this.fileName('csv'), new Blob([this.csv()], {type: 'text/csv'})); }

  /** The chart as drawn (axes, lines, markers) under its title, as PNG. */
  async downloadPNG() {
    if (!this.u) return;
    const src = this.u.ctx.canvas, dpr = window.devicePixelRatio || 1, th = themeColors();
    const top = Math.round(26 * dpr);
    const cv = document.createElement('canvas');
    cv.width = src.width; cv.height = src.height + top;
    const ctx = cv.getContext('2d');
    ctx.fillStyle = th.bg; ctx.fillRect(0, 0, cv.width, cv.height);
    ctx.fillStyle = th.ink; ctx.font = `600 ${Math.round(13 * dpr)}px system-ui, sans-serif`;
    ctx.textBaseline = 'middle';
    ctx.fillText(this.o.title || '', Math.round(8 * dpr), top / 2);
    ctx.drawImage(src, 0, top);
    const blob = await new Promise((r) => cv.toBlob(r, 'image/png'));
    downloadBlob(this.fileName('png'), blob);
  }

  /** Red ticks under NaN/Inf buckets; a dashed line per marker, and a
   * triangle with a label per group of markers closer than 14 px (a
   * group's label says how many it holds; the list shows on hover, see
   * markerHover). Labels that would overlap go to the next row, at most
   * three rows; the rest show on hover only. */
  drawMarkers(u) {
    const ms = this.o.markers ? this.o.markers() : [];
    const nf = this.nonfinite || [];
    this.markerGroups = [];
    if (!ms.length && !nf.length) return;
    const ctx = u.ctx, top = u.bbox.top, hgt = u.bbox.height, dpr = devicePixelRatio;
    const [x0, x1] = [u.scales.x.min, u.scales.x.max];
    // a marker's x: the owner's (m.x, on its own x axis) or its step's
    const xv = (st) => (this.timed ? (this.o.x ? NaN : timeOf(st)) : st);
    const mx = (m) => (this.o.x && m.x !== undefined ? m.x : xv(m.step));
    ctx.save();
    ctx.fillStyle = '#d62728';
    for (const st of nf) {
      const v = xv(st);
      if (!Number.isFinite(v)) continue;
      if (v < x0 || v > x1) continue;
      const x = Math.round(u.valToPos(v, 'x', true));
      ctx.fillRect(x - 1.5 * dpr, top + hgt - 9 * dpr, 3 * dpr, 9 * dpr);
    }
    ctx.lineWidth = 1.5 * dpr;
    ctx.font = `${Math.round(10.5 * dpr)}px system-ui, sans-serif`;
    ctx.textBaseline = 'top';
    ctx.textAlign = 'left';
    const rows = [[], [], []], bg = themeColors().bg;
    const right = u.bbox.left + u.bbox.width;
    const shown = ms.filter((m) => { const v = mx(m); return v >= x0 && v <= x1; });
    for (const m of shown) {
      const x = Math.round(u.valToPos(mx(m), 'x', true));
      ctx.strokeStyle = m.color || '#d62728';
      ctx.setLineDash([4 * dpr, 3 * dpr]);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + hgt); ctx.stroke();
    }
    ctx.setLineDash([]);
    const groups = foldMarkers(shown, (m) => Math.round(u.valToPos(mx(m), 'x', true)), 14 * dpr);
    this.markerGroups = groups.map((g) => ({...g, x: g.x / dpr}));
    // labels are placed most important group first, then by step
    const order = [...groups].sort((a, b) => (b.items[0].prio || 0) - (a.items[0].prio || 0) || a.step - b.step);
    for (const g of groups) {
      ctx.fillStyle = g.color;
      ctx.beginPath(); ctx.moveTo(g.x - 5 * dpr, top); ctx.lineTo(g.x + 5 * dpr, top);
      ctx.lineTo(g.x, top + 7 * dpr); ctx.fill();
    }
    for (const g of order) {
      if (this.o.compact) break;
      const labels = new Set(g.items.map((m) => m.label).filter(Boolean));
      if (!labels.size) continue;
      const label = g.items.length === 1 ? g.items[0].label
        : labels.size === 1 ? `${[...labels][0]} ×${g.items.length}` : `${g.items.length} markers`;
      const w = ctx.measureText(label).width + 6 * dpr;
      let lx = g.x + 4 * dpr;
      if (lx + w > right) lx = g.x - 4 * dpr - w;
      const r = rows.findIndex((row) => row.every(([a, b]) => lx + w < a || lx > b));
      if (r < 0) continue;
      rows[r].push([lx, lx + w]);
      const ly = top + (8 + 12 * r) * dpr;
      // a thin halo of the background keeps the label readable over lines
      // without hiding the data under a box
      ctx.strokeStyle = bg;
      ctx.lineWidth = 3 * dpr;
      ctx.lineJoin = 'round';
      ctx.strokeText(label, lx + 3 * dpr, ly + 1 * dpr);
      ctx.fillStyle = g.color;
      ctx.fillText(label, lx + 3 * dpr, ly + 1 * dpr);
    }
    ctx.restore();
  }

  /** Over the top of the plot, near a marker group: the list of what it
   * holds (rule or rollback, and step), as a tooltip. */
  markerHover(e) {
    const gs = this.markerGroups || [];
    const r = this.u.over.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
    const g = y <= 44 ? gs.find((m) => Math.abs(m.x - this.u.bbox.left / devicePixelRatio - x) <= 8) : null;
    if (!g) { if (this.mtip) this.mtip.hidden = true; return; }
    if (!this.mtip) { this.mtip = h('div', {class: 'hm-tip marker-tip', role: 'tooltip'}); this.el.append(this.mtip); }
    this.mtip.hidden = false;
    this.mtip.textContent = g.items.map((m) => `${m.label || 'marker'} · step ${fmtStep(m.step)}`).join('\n');
    const er = this.el.getBoundingClientRect();
    this.mtip.style.left = Math.min(e.clientX - er.left + 12, this.el.clientWidth - 240) + 'px';
    this.mtip.style.top = e.clientY - er.top + 14 + 'px';
  }

  /** Appends one point (live step) to every column: values per def, a
   * band gets [v, v, v] (or the [mean, min, max] given). Steps that arrive while the chart is (re)loading
   * wait in a backlog and are added to the new data once it is in. */
  append(step, values) {
    const busy = !this.data || !this.data[0] || this.reloading || (!this.u && !this.pendingDefs);
    const xs = busy ? null : this.data[0];
    // a live run would grow the chart by a point per step forever: once the
    // appended points outnumber the fetched buckets, refetch (downsampled;
    // reload() asks the page's request budget, budget.js, for a slot)
    const full = xs && xs.length > 2 * Math.max(this.fetched || 0, 500) && this.reload;
    if (busy || full) {
      if (!this.backlog) this.backlog = [];
      if (this.backlog.length < 20000) this.backlog.push([step, values]);
      if (full) { this.reloading = true; this.reload(); }
      return false;
    }
    // data set but not drawn yet: it is the new table, add to it
    if (!this.push(step, values, this.pendingDefs || this.defs)) return false;
    if (!this.pendingDefs) this.redraw();
    return true;
  }

  /** values[i]: a number, null (the step's value was NaN/Inf: a gap and a
   * red tick) or undefined (the step has no value of that metric, e.g. no
   * eval_loss at a step without eval: nothing, as in the fetched data). */
  push(step, values, defs) {
    const xs = this.data[0];
    if (xs.length && step <= xs[xs.length - 1]) return false;
    let c = 1;
    xs.push(step);
    defs.forEach((d, i) => {
      // a band's value may be [mean, min, max] (a live tick's figures)
      const a = Array.isArray(values[i]) ? values[i] : null, v = a ? a[0] : values[i];
      if (v === null) (this.nonfinite ||= []).push(step);
      this.data[c++].push(v);
      if (d.band) { this.data[c++].push(a ? a[2] : v); this.data[c++].push(a ? a[1] : v); }
    });
    return true;
  }

  redraw = rafThrottle(() => { if (this.u) this.u.setData(this.shown()); });

  resize() {
    if (!this.u) return;
    const w = this.el.clientWidth;
    if (w > 0 && Math.abs(w - this.u.width) > 2) this.u.setSize({width: w, height: this.u.height});
  }

  destroy() {
    this.dead = true;
    charts.delete(this);
    if (this.u) this.u.destroy();
    this.el.remove();
  }
}

/** On an owner's time axis each run's points sit at its own times, so
 * the index under the cursor rarely holds every run's value: the legend
 * takes series si's nearest point within 12 px instead (none beyond). */
function nearestDefined(u, si, idx) {
  const ys = u.data[si], xs = u.data[0];
  if (!ys || ys[idx] !== undefined) return idx;
  const px = (i) => u.valToPos(xs[i], 'x');
  const at = px(idx);
  for (let d = 1; d < 400; d++) {
    const a = idx - d, b = idx + d, pa = a >= 0 ? Math.abs(px(a) - at) : Infinity, pb = b < xs.length ? Math.abs(px(b) - at) : Infinity;
    if (pa > 12 && pb > 12) break;
    if (pa <= 12 && ys[a] !== undefined) return a;
    if (pb <= 12 && ys[b] !== undefined) return b;
  }
  return idx;
}

/** Steps are integers: no tick between two steps. */
const STEP_INCRS = (() => {
  const a = [];
  for (let e = 1; e <= 1e12; e *= 10) a.push(e, 2 * e, 5 * e);
  return a;
})();

/** Steps of the buckets that held non-finite values, over several answers. */
export function nonfiniteSteps(answers) {
  const out = [];
  for (const r of answers) {
    if (!r || !r.nonfinite) continue;
    for (let i = 0; i < r.nonfinite.length; i++) if (r.nonfinite[i] > 0) out.push(r.step[i]);
  }
  return out;
}

/** True when min..max is no wider than float32 rounding: the daemon
 * stores float32 values and prints a bucket's min/max at float32 precision
 * but its mean (a double) with more digits, so a constant lr reads
 * 0.100000001 and 0.10000000149. Drawn at double precision that 5e-10
 * filled the whole axis (the "phantom lr drop" where live points, at float32
 * precision, joined fetched means) with four ticks all reading 0.1. */
function flat(min, max) {
  return min === max || Math.abs(max - min) <= 2e-7 * Math.max(Math.abs(min), Math.abs(max));
}

/** The y range: the data's with 5% margins; a flat line (a constant lr)
 * gets a band of +-10% around its value instead of an empty chart. */
function yRange(u, min, max) {
  if (min === null || max === null || !Number.isFinite(min) || !Number.isFinite(max)) return [0, 1];
  if (flat(min, max)) {
    const c = (min + max) / 2, d = Math.abs(c) * 0.1 || 1;
    return [c - d, c + d];
  }
  const pad = (max - min) * 0.05;
  return [min - pad, max + pad];
}

/** Log axis: whole decades around the positive data. */
function yRangeLog(u, min, max) {
  if (min === null || max === null || !(min > 0) || !Number.isFinite(max)) return [1e-3, 1];
  let lo = 10 ** Math.floor(Math.log10(min)), hi = 10 ** Math.ceil(Math.log10(max));
  if (hi <= lo) { lo /= 10; hi *= 10; }
  return [lo, hi];
}

/** True when the lines' finite values are all positive and max/min >= 1000. */
function spansDecades(t, defs) {
  let lo = Infinity, hi = -Infinity, c = 1;
  for (const d of defs) {
    for (let k = 0; k < (d.band ? 3 : 1); k++, c++)
      for (const v of t[c] || []) if (v !== null && v !== undefined && Number.isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
  }
  return lo > 0 && hi / lo >= 1000;
}

/** A flat series gets one tick, at its value; others uPlot's. */
function ySplits(u, axisIdx, min, max, incr) {
  if (flatData(u)) return [(min + max) / 2];
  const out = [];
  for (let v = Math.ceil(min / incr) * incr; v <= max + incr * 1e-9; v += incr) out.push(+v.toPrecision(12));
  return out;
}
function flatData(u) {
  let lo = Infinity, hi = -Infinity;
  for (let s = 1; s < u.data.length; s++) {
    if (u.series[s] && u.series[s].show === false) continue;
    for (const v of u.data[s]) if (v !== null && v !== undefined && Number.isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
  }
  return lo <= hi && flat(lo, hi);
}

/** Tick labels with as many digits as tell them apart (3 to 8), so a
 * near-constant series never shows the same label twice. */
function linTicks(u, vals) {
  for (let dg = 3; dg <= 8; dg++) {
    const out = vals.map((v) => fmt(v, dg));
    if (new Set(out).size === out.length) return out;
  }
  return vals.map((v) => fmt(v, 8));
}

/** Log axis ticks: 1, 2, 5 per decade over three decades or fewer, else
 * the decades only (every k-th, for at most about 8 ticks), so a series
 * spanning 20 decades is not buried under 180 grid lines. */
function logSplits(u, axisIdx, min, max) {
  const a = Math.floor(Math.log10(min) + 1e-9), b = Math.ceil(Math.log10(max) - 1e-9);
  const out = [];
  if (b - a <= 3) {
    for (let e = a; e <= b; e++) for (const m of [1, 2, 5]) {
      const v = +(m * 10 ** e).toPrecision(6);
      if (v >= min * (1 - 1e-9) && v <= max * (1 + 1e-9)) out.push(v);
    }
    return out;
  }
  const k = Math.max(1, Math.ceil((b - a) / 8));
  for (let e = Math.ceil(a / k) * k; e <= b; e += k) out.push(10 ** e);
  return out;
}

/** A log axis labels its decades (every k-th when there are many). */
function logTicks(u, vals) {
  return vals.map((v) => {
    if (!(v > 0)) return '';
    const r = Math.round(Math.log10(v));
    if (Math.abs(v - 10 ** r) > 1e-9 * v) return fmt(v, 3);
    return r >= -3 && r <= 4 ? fmt(10 ** r, 3) : `1e${r}`;
  });
}

function compactStep(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return +(v / 1e6).toPrecision(3) + 'M';
  if (a >= 1e4) return +(v / 1e3).toPrecision(3) + 'k';
  return String(Math.round(v));
}

/** Buckets to ask for: one per CSS pixel of plot width (so min/max bands are
 * exact at screen resolution), within the API's limits. */
export function pointsFor(el, cap = 2000) {
  const w = (el && el.clientWidth) || 800;
  return Math.max(50, Math.min(cap, Math.round(w)));
}
