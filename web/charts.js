// charts.js: time-series charts on uPlot (vendored, web/vendor/uplot).
// A TimeChart shows lines over training steps, each optionally with a
// min/max band (the exact per-bucket extremes from the series API, so a
// one-step spike stays visible at any zoom), alert markers on the step axis,
// a legend with live values and a unit on the y axis. Drag to zoom (the
// owner refetches at finer resolution), double-click to zoom out.
// uPlot comes from vendor/uplot/uPlot.iife.min.js, loaded by index.html
const uPlot = window.uPlot;
import {fmt, fmtStep, rafThrottle} from './util.js';

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
   *  markers(): [{step, color, label}], compact} */
  constructor(parent, o) {
    this.o = o;
    this.el = document.createElement('div');
    this.el.className = 'chart' + (o.compact ? ' compact' : '');
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
    const key = JSON.stringify([this.o.unit, this.o.title, defs.map((d) => [d.label, d.color, !!d.band, d.dash, d.width])]);
    this.data = table;
    this.fetched = table[0] ? table[0].length : 0;
    this.reloading = false;
    // live steps that came while this data was being fetched
    if (this.backlog && table[0]) {
      const cols = 1 + defs.reduce((n, d) => n + (d.band ? 3 : 1), 0);
      if (table.length === cols) for (const [st, v] of this.backlog) this.push(st, v, defs);
    }
    this.backlog = null;
    this.pendingDefs = defs;
    this.pendingKey = key;
    return new Promise((resolve) => drawLater(this, resolve));
  }

  /** Runs queued by setData: builds or updates the uPlot instance. */
  render() {
    if (this.dead || !this.pendingDefs) return;
    const defs = this.pendingDefs, key = this.pendingKey;
    this.pendingDefs = null;
    if (this.u && key === this.key) this.u.setData(this.data);
    else {
      this.key = key;
      this.defs = defs;
      this.build();
    }
  }

  build() {
    if (this.u) this.u.destroy();
    const o = this.o, defs = this.defs;
    const series = [{label: 'step', value: (u, v) => fmtStep(v)}];
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
    const opts = {
      width, height: o.height || 220,
      title: o.title,
      series, bands,
      scales: {x: {time: false}, y: {range: yRange}},
      axes: [
        {label: 'step', labelSize: 18, size: 36, incrs: STEP_INCRS, values: (u, vals) => vals.map((v) => compactStep(v)),
         grid: {stroke: '#eceef1'}, ticks: {stroke: '#d6d9de'}},
        {label: o.unit || 'value', labelSize: 18, size: 58, values: (u, vals) => vals.map((v) => fmt(v, 3)),
         grid: {stroke: '#eceef1'}, ticks: {stroke: '#d6d9de'}},
      ],
      legend: {live: true},
      // cursor dots are one composited element per series (will-change):
      // with 30+ heads per chart and dozens of charts, painting them costs
      // more than everything else, so many-line charts go without
      cursor: {drag: {x: true, y: false, setScale: false}, focus: {prox: 16}, points: {show: defs.length <= 6}},
      focus: {alpha: 0.35},
      hooks: {
        setSelect: [(u) => {
          if (u.select.width < 4) return;
          const a = u.posToVal(u.select.left, 'x'), b = u.posToVal(u.select.left + u.select.width, 'x');
          u.setSelect({left: 0, width: 0, top: 0, height: 0}, false);
          if (o.onZoom) o.onZoom(Math.max(0, Math.floor(a)), Math.ceil(b));
        }],
        draw: [(u) => this.drawMarkers(u)],
      },
    };
    this.u = new uPlot(opts, this.data, this.el);
    this.el.style.minHeight = '';
    this.u.over.addEventListener('dblclick', () => { if (o.onReset) o.onReset(); });
  }

  drawMarkers(u) {
    const ms = this.o.markers ? this.o.markers() : [];
    const nf = this.nonfinite || [];
    if (!ms.length && !nf.length) return;
    const ctx = u.ctx, top = u.bbox.top, hgt = u.bbox.height;
    const [x0, x1] = [u.scales.x.min, u.scales.x.max];
    ctx.save();
    // buckets holding NaN/Inf: a red tick under the plot
    ctx.fillStyle = '#d62728';
    for (const st of nf) {
      if (st < x0 || st > x1) continue;
      const x = Math.round(u.valToPos(st, 'x', true));
      ctx.fillRect(x - 1.5 * devicePixelRatio, top + hgt - 9 * devicePixelRatio, 3 * devicePixelRatio, 9 * devicePixelRatio);
    }
    ctx.lineWidth = 1.5 * devicePixelRatio;
    for (const m of ms) {
      if (m.step < x0 || m.step > x1) continue;
      const x = Math.round(u.valToPos(m.step, 'x', true));
      ctx.strokeStyle = m.color || '#d62728';
      ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + hgt); ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = m.color || '#d62728';
      ctx.beginPath(); ctx.moveTo(x - 5 * devicePixelRatio, top); ctx.lineTo(x + 5 * devicePixelRatio, top);
      ctx.lineTo(x, top + 7 * devicePixelRatio); ctx.fill();
    }
    ctx.restore();
  }

  /** Appends one point (live step) to every column: values per def,
   * a band gets [v, v, v]. */
  /** Appends one point (live step) to every column: values per def, a
   * band gets [v, v, v]. Steps that arrive while the chart is (re)loading
   * wait in a backlog and are added to the new data once it is in. */
  append(step, values) {
    const busy = !this.data || !this.data[0] || this.reloading || (!this.u && !this.pendingDefs);
    const xs = busy ? null : this.data[0];
    // a live run would grow the chart by a point per step forever: once the
    // appended points outnumber the fetched buckets, refetch (downsampled)
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

  push(step, values, defs) {
    const xs = this.data[0];
    if (xs.length && step <= xs[xs.length - 1]) return false;
    let c = 1;
    xs.push(step);
    defs.forEach((d, i) => {
      const v = values[i] === undefined ? null : values[i];
      if (values[i] === null) (this.nonfinite ||= []).push(step);   // NaN/Inf arrive as null
      this.data[c++].push(v);
      if (d.band) { this.data[c++].push(v); this.data[c++].push(v); }
    });
    return true;
  }

  redraw = rafThrottle(() => { if (this.u) this.u.setData(this.data); });

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

/** The y range: the data's with 5% margins; a flat line (a constant lr)
 * gets a band around its value instead of an empty chart. */
function yRange(u, min, max) {
  if (min === null || max === null || !Number.isFinite(min) || !Number.isFinite(max)) return [0, 1];
  if (min === max) {
    const d = Math.abs(min) * 0.1 || 1;
    return [min - d, max + d];
  }
  const pad = (max - min) * 0.05;
  return [min - pad, max + pad];
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
