// timeline.js: the collapse timeline — one row per (layer, head), one
// column per step bucket, colour = the bucket's minimum of a head metric
// (GET /api/runs/{id}/timeline: from the rollups, docs/http-api.md), so
// when and where collapse spreads reads at a glance. Alert and rollback
// markers along the top (overlapping ones fold into one with a count);
// hover names the cell; a click (or Enter on the keyboard cursor) follows
// the head. Above FOLD_ROWS heads the rows fold per layer (the minimum
// over its heads) and a click on a folded row expands it.
//
// It is a canvas drawn from an image one pixel per (row, screen column):
// each column shows the lowest bucket minimum that touches it, so a
// one-bucket collapse never falls between pixels. It does not fetch: the
// run page hands it answers (set, setLayer) and live cells (addCells).
// What it shows is exposed as window.__timeline for tests.
import {foldMarkers, xAxis} from './charts.js';
import {scaleLUT} from './heatmap.js';
import {fmt, fmtStep, h, themeColors} from './util.js';

/** More rows than this fold per layer (issue 33: 32 x 32 draws unfolded). */
export const FOLD_ROWS = 2048;
/** entropy_norm below this is the collapse region (the entropy_collapse
 * rule's threshold, schema/default_rules.json), drawn in reds. */
export const COLLAPSE_BELOW = 0.05;
// the collapse region's reds, darkest at 0: a hue viridis never takes, at
// least 3.4:1 against the card in the light and the dark theme (white: 4.8
// and 3.5, #1c2027: 3.4 and 4.7)
const RED0 = [220, 40, 60], RED1 = [240, 80, 110];
const NAN_CODE = 320;
const PAD_L = 46, PAD_T = 18, PAD_B = 22, PAD_R = 8;

/** Decodes an answer's min (base64 of uint16 codes over [lo, hi], 65535:
 * none) into rows of Float32 (NaN: no finite value in the bucket). */
export function decodeMin(ans) {
  const bin = atob(ans.min || ''), nb = ans.step.length, rows = ans.cells.length;
  const span = ans.hi !== null && ans.lo !== null ? ans.hi - ans.lo : 0;
  const out = [];
  for (let r = 0; r < rows; r++) {
    const a = new Float32Array(nb);
    for (let i = 0; i < nb; i++) {
      const p = 2 * (r * nb + i), c = bin.charCodeAt(p) | (bin.charCodeAt(p + 1) << 8);
      a[i] = c === 65535 ? NaN : ans.lo + (c * span) / 65534;
    }
    out.push(a);
  }
  return out;
}

export class Timeline {
  /** o: {onPick(layer, head), onExpand(layer, open), markers(): [{step,
   * color, label}], describe: (metric) => text} */
  constructor(parent, o = {}) {
    this.o = o;
    this.canvas = h('canvas', {class: 'tl-canvas', tabindex: 0, role: 'application',
      'aria-roledescription': 'timeline', 'aria-label': 'collapse timeline: rows are heads, columns steps; arrow keys move, Enter follows the head'});
    this.tip = h('div', {class: 'hm-tip tl-tip', hidden: true, role: 'tooltip'});
    this.live = h('div', {class: 'sr-only', 'aria-live': 'polite'});
    this.scroll = h('div', {class: 'tl-scroll'}, this.canvas);
    this.legend = h('div', {class: 'tl-legend', id: 'tl-legend'});
    this.root = h('div', {class: 'timeline'}, h('div', {class: 'tl-plot'}, this.scroll, this.tip), this.legend, this.live);
    parent.append(this.root);
    this.ans = null;
    this.layers = new Map();   // layer -> expanded rows (answers of rows=head&layer=l)
    this.cursor = null;        // {row, col} of the keyboard cursor
    this.canvas.addEventListener('mousemove', (e) => this.hover(e));
    this.canvas.addEventListener('mouseleave', () => { this.tip.hidden = true; });
    this.canvas.addEventListener('click', (e) => { const c = this.cellAt(e); if (c && !c.marker) this.activate(c.row, c.x < PAD_L); });
    this.canvas.addEventListener('keydown', (e) => this.key(e));
    this.canvas.addEventListener('focus', () => { if (!this.cursor && this.rows) this.moveCursor(0, 0); });
    this.canvas.addEventListener('blur', () => { this.tip.hidden = true; });
    this.onTheme = () => this.draw();
    window.addEventListener('themechange', this.onTheme);
    this.ro = new ResizeObserver(() => this.draw());
    this.ro.observe(this.root);
  }

  /** ans: a timeline answer (rows=head or rows=layer) over the range shown;
   * expanded layers are kept (their answers come through setLayer). */
  set(ans, {domain, collapse, url} = {}) {
    this.ans = ans;
    this.url = url || null;
    this.steps = ans.step.slice();
    this.ends = ans.end.slice();
    this.width = ans.width;
    this.fetchedCols = ans.step.length;
    this.vals = decodeMin(ans);
    this.domain = domain || (ans.lo !== null ? [ans.lo, ans.hi > ans.lo ? ans.hi : ans.lo + 1] : [0, 1]);
    this.collapse = collapse ?? null;
    for (const [l, a] of this.layers) if (!sameBuckets(a.ans, ans)) this.layers.delete(l);
    this.build();
  }

  /** The heads of a folded layer (an answer of rows=head&layer=l over the
   * same buckets), or null to fold it again. */
  setLayer(l, ans) {
    if (!ans) this.layers.delete(l);
    else if (this.ans && sameBuckets(ans, this.ans)) this.layers.set(l, {ans, vals: decodeMin(ans)});
    this.build();
  }

  /** The rows drawn: the answer's, with each expanded layer's heads in place
   * of its folded row. */
  build() {
    const a = this.ans;
    if (!a) return;
    const rows = [];
    a.cells.forEach(([l, hd], r) => {
      const ex = hd === null && this.layers.get(l);
      if (ex) ex.ans.cells.forEach(([l2, h2], k) => rows.push({l: l2, h: h2, vals: ex.vals[k], open: true}));
      else rows.push({l, h: hd, vals: this.vals[r], folded: hd === null && a.kind === 'head'});
    });
    this.rows = rows;
    if (this.cursor && this.cursor.row >= rows.length) this.cursor.row = rows.length - 1;
    this.draw();
  }

  /** A live frame (a cells event, shaped as GET .../frame) of the metric
   * shown: its values go into the last bucket, or open the next one. The
   * live columns hold the sampled steps (a frame a second), not every step:
   * the next fetch makes them exact. Returns false when the owner should
   * refetch (the live columns outnumber the fetched ones). */
  addCells(f) {
    if (!this.rows || f.metric !== this.ans.metric) return true;
    if (!this.steps.length) return false;   // fetched before any step: fetch again
    const s = f.step, n = this.steps.length, w = this.width;
    let i = n - 1;
    if (s < this.steps[i]) return true;
    // bucket starts are multiples of the width from the first unclipped one
    const ref = n > 1 ? this.steps[1] : this.steps[0];
    const grow = (v) => { const u = new Float32Array(n + 1); u.set(v); u[n] = NaN; return u; };
    if (s >= this.steps[i] + w && (n > 1 || s > this.ends[i])) {
      this.steps.push(s - ((((s - ref) % w) + w) % w));
      this.ends.push(s);
      i = n;
      this.vals = this.vals.map(grow);
      for (const ex of this.layers.values()) ex.vals = ex.vals.map(grow);
    } else if (s > this.ends[i]) this.ends[i] = s;
    const put = (cells, vals) => cells.forEach(([l, hd], k) => {
      const row = f.values[l] || [];
      let m = Infinity;
      if (hd === null) { for (const v of row) if (Number.isFinite(v) && v < m) m = v; }
      else if (Number.isFinite(row[hd])) m = row[hd];
      if (m !== Infinity && !(vals[k][i] <= m)) vals[k][i] = m;
    });
    put(this.ans.cells, this.vals);
    for (const ex of this.layers.values()) put(ex.ans.cells, ex.vals);
    this.build();
    return this.steps.length <= 2 * Math.max(this.fetchedCols, 32);
  }

  /** The step range on the x axis: the answer's, up to the live end. */
  range() {
    const a = this.ans;
    const lo = a.from, hi = Math.max(a.to, this.ends.length ? this.ends[this.ends.length - 1] : a.to);
    return [lo, Math.max(hi, lo + 1)];
  }

  /** The colour code of value v, ordered as the values are (a lower
   * value never gets a higher code): 0..63 the collapse region's reds,
   * 64..319 viridis, NAN_CODE for NaN/Inf. A screen column shows the
   * lowest code of its buckets, which is the colour of their lowest value. */
  code(v) {
    if (!(v === v) || v === Infinity || v === -Infinity) return NAN_CODE;
    if (this.collapse !== null && v < this.collapse) return Math.min(63, Math.max(0, Math.floor((64 * v) / this.collapse)));
    const [lo, hi] = this.domain;
    return 64 + Math.round(255 * Math.min(1, Math.max(0, (v - lo) / (hi - lo || 1))));
  }

  /** [r, g, b] of code c. */
  codeRGB(c) {
    if (c >= NAN_CODE) return [210, 210, 215];
    if (c < 64) return [0, 1, 2].map((k) => Math.round(RED0[k] + ((RED1[k] - RED0[k]) * c) / 63));
    const lut = scaleLUT(), k = (c - 64) * 3;
    return [lut[k], lut[k + 1], lut[k + 2]];
  }

  /** [r, g, b] of value v. */
  rgb(v) { return this.codeRGB(this.code(v)); }

  /** Row heights: one to 14 px each, so 8 rows and 1,024 both fit; layers
   * a pixel apart when there are several. */
  geom() {
    const rows = this.rows.length;
    const rh = Math.max(1, Math.min(10, Math.floor(300 / Math.max(1, rows))));
    const y = new Array(rows + 1);
    let yy = PAD_T;
    for (let r = 0; r < rows; r++) {
      if (r && this.rows[r].l !== this.rows[r - 1].l) yy += rows > 16 ? 1 : 2;
      y[r] = yy;
      yy += rh;
    }
    y[rows] = yy;
    const W = Math.max(240, Math.floor(this.root.clientWidth || 800));
    return {rh, y, W, H: yy + PAD_B, pw: W - PAD_L - PAD_R};
  }

  draw() {
    if (!this.rows || !this.root.isConnected) return;
    const t0 = performance.now();
    const g = this.geom(), rows = this.rows, dpr = window.devicePixelRatio || 1, th = themeColors();
    this.g = g;
    const cv = this.canvas;
    if (cv.width !== Math.round(g.W * dpr) || cv.height !== Math.round(g.H * dpr)) {
      cv.width = Math.round(g.W * dpr); cv.height = Math.round(g.H * dpr);
      cv.style.width = g.W + 'px'; cv.style.height = g.H + 'px';
    }
    const ctx = cv.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, g.W, g.H);
    const [x0, x1] = this.range(), pw = g.pw;
    const px = (st) => ((st - x0) / (x1 - x0 + 1)) * pw;
    // per screen column the buckets touching it: [first, last] bucket index
    const n = this.steps.length, colLo = new Int32Array(pw).fill(-1), colHi = new Int32Array(pw).fill(-1);
    for (let i = 0; i < n; i++) {
      const a = Math.max(0, Math.floor(px(this.steps[i]))), b = Math.min(pw - 1, Math.max(a, Math.ceil(px(this.ends[i] + 1)) - 1));
      for (let x = a; x <= b; x++) { if (colLo[x] < 0) colLo[x] = i; colHi[x] = i; }
    }
    this.cols = {colLo, colHi};
    const img = new ImageData(pw, rows.length), px32 = new Uint32Array(img.data.buffer);
    // the palette as RGBA words (little-endian: A B G R from the top byte)
    const pal = new Uint32Array(NAN_CODE + 1);
    for (let c = 0; c <= NAN_CODE; c++) { const [r, gg, b] = this.codeRGB(c); pal[c] = (255 << 24 | b << 16 | gg << 8 | r) >>> 0; }
    const codes = new Uint16Array(n);
    let drawnCells = 0;
    for (let r = 0; r < rows.length; r++) {
      const v = rows[r].vals, o = r * pw;
      for (let i = 0; i < n; i++) codes[i] = this.code(v[i]);
      for (let x = 0; x < pw; x++) {
        const a = colLo[x];
        if (a < 0) continue;
        let m = codes[a];
        for (let i = a + 1, b = colHi[x]; i <= b; i++) if (codes[i] < m) m = codes[i];
        px32[o + x] = pal[m];
        drawnCells++;
      }
    }
    if (!this.off || this.off.width !== pw || this.off.height !== rows.length) {
      this.off = document.createElement('canvas');
      this.off.width = pw; this.off.height = rows.length;
    }
    this.off.getContext('2d').putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    // one blit per layer run (rows of a layer are contiguous; layers have a gap)
    for (let r = 0; r < rows.length;) {
      let e = r + 1;
      while (e < rows.length && rows[e].l === rows[r].l) e++;
      ctx.drawImage(this.off, 0, r, pw, e - r, PAD_L, g.y[r], pw, g.y[e - 1] + g.rh - g.y[r]);
      r = e;
    }
    // row labels: each layer's first row (folded rows and expanded layers marked)
    ctx.fillStyle = th.muted; ctx.font = '11px system-ui, sans-serif';
    ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
    let lastY = -99;
    for (let r = 0; r < rows.length; r++) {
      if (r && rows[r].l === rows[r - 1].l) continue;
      let e = r;
      while (e + 1 < rows.length && rows[e + 1].l === rows[r].l) e++;
      const mid = (g.y[r] + g.y[e] + g.rh) / 2;
      if (mid - lastY < 12) continue;
      lastY = mid;
      ctx.fillText((rows[r].folded ? '▸ ' : rows[r].open ? '▾ ' : '') + 'L' + rows[r].l, PAD_L - 4, mid);
    }
    // the step (or time) axis
    const ax = xAxis();
    ctx.textAlign = 'center'; ctx.textBaseline = 'top';
    const yb = g.y[rows.length] + 4;
    const ticks = ax.ticks(x0, x1, Math.max(2, Math.floor(pw / 110)));
    for (const st of ticks) {
      const x = PAD_L + px(st);
      if (x < PAD_L || x > PAD_L + pw) continue;
      ctx.fillRect(x, yb - 3, 1, 3);
      ctx.fillText(ax.label(st), x, yb);
    }
    // the keyboard cursor and the head followed
    ctx.lineWidth = 2;
    const box = (r, color) => {
      ctx.strokeStyle = color;
      ctx.strokeRect(PAD_L - 1, g.y[r] - 1, pw + 2, g.rh + 2);
    };
    if (this.sel) {
      const r = rows.findIndex((x) => x.l === this.sel.l && x.h === this.sel.h);
      if (r >= 0) box(r, '#e4572e');
    }
    if (this.cursor && document.activeElement === this.canvas) {
      const {row, col} = this.cursor, b = this.colBox(col);
      ctx.strokeStyle = th.ink;
      if (b) ctx.strokeRect(PAD_L + b[0] - 1, g.y[row] - 1, b[1] - b[0] + 2, g.rh + 2);
    }
    this.drawMarkers(ctx, px, g);
    this.drawLegend();
    window.__timeline = {metric: this.ans.metric, rows: rows.length, cols: n, from: x0, to: x1,
      folded: rows.filter((r) => r.folded).length, expanded: [...this.layers.keys()],
      cells: rows.map((r) => [r.l, r.h]), drawnCells, markers: this.markerGroups.map((m) => ({step: m.step, n: m.items.length})),
      drawn: (window.__timeline ? window.__timeline.drawn : 0) + 1, drawMs: performance.now() - t0, cursor: this.cursor && {...this.cursor}, url: this.url,
      // for tests: where a head's row is (canvas px), and up to 300 drawn cells
      rowBox: (l, hd) => { const r = this.rows.findIndex((x) => x.l === l && x.h === hd); return r < 0 ? null : {x: PAD_L, y: this.g.y[r] + this.g.rh / 2}; },
      sample: () => this.sample()};
  }

  /** For tests: [row, bucket, value, pixel matches] of up to 300 cells,
   * the bucket being the one whose value a screen column shows. */
  sample() {
    const out = [], g = this.g, ctx = this.canvas.getContext('2d'), dpr = window.devicePixelRatio || 1;
    for (let k = 0; k < 300; k++) {
      const r = (k * 7919) % this.rows.length, x = (k * 104729) % g.pw;
      if (this.cols.colLo[x] < 0) continue;
      const i = this.bestCol(r, x), v = this.rows[r].vals[i];
      const px = ctx.getImageData(Math.floor((PAD_L + x + 0.5) * dpr), Math.floor((g.y[r] + g.rh / 2) * dpr), 1, 1).data;
      const c = this.rgb(Number.isFinite(v) ? v : NaN);
      out.push([r, i, Number.isFinite(v) ? v : null, px[0] === c[0] && px[1] === c[1] && px[2] === c[2]]);
    }
    return out;
  }

  /** Markers along the top: a triangle per group of markers closer than
   * 12 px (its count beside it when more than one); hover lists them. */
  drawMarkers(ctx, px, g) {
    const ms = (this.o.markers ? this.o.markers() : []).filter((m) => m.step >= this.range()[0] && m.step <= this.range()[1]);
    const groups = foldMarkers(ms, (m) => PAD_L + px(m.step), 12);
    this.markerGroups = groups;
    ctx.font = '10px system-ui, sans-serif'; ctx.textAlign = 'left'; ctx.textBaseline = 'middle';
    for (const gr of groups) {
      ctx.fillStyle = gr.color;
      ctx.beginPath(); ctx.moveTo(gr.x - 5, 3); ctx.lineTo(gr.x + 5, 3); ctx.lineTo(gr.x, 12); ctx.fill();
      ctx.globalAlpha = 0.35;
      ctx.fillRect(gr.x, PAD_T, 1, g.y[this.rows.length] - PAD_T);
      ctx.globalAlpha = 1;
      if (gr.items.length > 1) ctx.fillText(String(gr.items.length), gr.x + 6, 8);
    }
  }

  drawLegend() {
    const key = JSON.stringify([this.domain, this.collapse, this.ans.metric, document.documentElement.dataset.theme]);
    if (key === this.legendKey) return;
    this.legendKey = key;
    const sc = h('canvas', {class: 'hm-scale', width: 240, height: 12});
    const c = sc.getContext('2d'), img = c.createImageData(240, 12);
    const [lo, hi] = this.domain;
    for (let x = 0; x < 240; x++) {
      const [r, g, b] = this.rgb(lo + ((hi - lo) * x) / 239);
      for (let y = 0; y < 12; y++) { const p = (y * 240 + x) * 4; img.data[p] = r; img.data[p + 1] = g; img.data[p + 2] = b; img.data[p + 3] = 255; }
    }
    c.putImageData(img, 0, 0);
    const red = `rgb(${RED0})`;
    this.legend.textContent = '';
    this.legend.append(...[h('span', {}, fmt(lo, 3)), sc, h('span', {}, fmt(hi, 3)),
      h('span', {}, `bucket minimum of ${this.ans.metric}, linear`),
      this.collapse !== null ? h('span', {class: 'tl-collapse'}, h('i', {style: `background:${red}`}), `below ${this.collapse}: collapse region`) : null,
      h('span', {}, h('i', {style: 'background:rgb(210,210,215)'}), 'NaN/∞ only'),
      this.rows.some((r) => r.folded) ? h('span', {}, '▸ a layer folded (min over its heads): click to expand') : null].filter(Boolean));
  }

  /** [x0, x1] in plot pixels of bucket column col. */
  colBox(col) {
    const {colLo, colHi} = this.cols || {};
    if (!colLo) return null;
    let a = -1, b = -1;
    for (let x = 0; x < colLo.length; x++) if (colLo[x] <= col && colHi[x] >= col && colLo[x] >= 0) { if (a < 0) a = x; b = x + 1; }
    return a < 0 ? null : [a, b];
  }

  cellAt(e) {
    const g = this.g;
    if (!g || !this.rows) return null;
    const r = this.canvas.getBoundingClientRect();
    const x = e.clientX - r.left - PAD_L, y = e.clientY - r.top;
    if (y < PAD_T - 6 && this.markerGroups) return {marker: true, x, y};
    let row = -1;
    for (let k = 0; k < this.rows.length; k++) if (y >= g.y[k] && y < g.y[k + 1]) { row = k; break; }
    if (row < 0 || x < -PAD_L || x >= g.pw) return null;
    const xi = Math.max(0, Math.floor(x));
    const col = x < 0 ? null : this.cols.colLo[xi] >= 0 ? this.bestCol(row, xi) : null;
    return {row, col, x: e.clientX - r.left, y: e.clientY - r.top};
  }

  /** The bucket of pixel column x holding its lowest value (what is drawn). */
  bestCol(row, x) {
    const v = this.rows[row].vals;
    let best = this.cols.colLo[x];
    for (let i = this.cols.colLo[x]; i <= this.cols.colHi[x]; i++) if (v[i] < v[best] || !(v[best] === v[best])) best = i;
    return best;
  }

  /** Words for cell (row, col): layer, head, step range, value. */
  describeCell(row, col) {
    const r = this.rows[row];
    const who = r.folded ? `layer ${r.l} (min over its heads; click to expand)` : r.h === null ? `layer ${r.l}` : `layer ${r.l}, head ${r.h}`;
    if (col === null || col === undefined) return who;
    const v = r.vals[col];
    return `${who} · steps ${fmtStep(this.steps[col])}–${fmtStep(this.ends[col])} · min ${this.ans.metric} ${Number.isFinite(v) ? fmt(v, 3) : 'NaN/∞ only'}`;
  }

  hover(e) {
    const c = this.cellAt(e);
    if (!c) { this.tip.hidden = true; return; }
    let text;
    if (c.marker) {
      const gr = this.markerGroups.find((m) => Math.abs(m.x - (c.x + PAD_L)) <= 8);
      if (!gr) { this.tip.hidden = true; return; }
      text = gr.items.map((m) => `${m.label || 'marker'} @ step ${fmtStep(m.step)}`).join('\n');
    } else text = this.describeCell(c.row, c.col);
    this.showTip(text, c.x, c.y);
  }

  showTip(text, x, y) {
    this.tip.hidden = false;
    this.tip.textContent = text;
    this.tip.style.whiteSpace = 'pre';
    this.tip.style.left = Math.max(0, Math.min(x + 12, this.root.clientWidth - 320)) + 'px';
    this.tip.style.top = y + 14 - this.scroll.scrollTop + 'px';
  }

  /** A click on a row (onLabel: on its layer's label): follows the head,
   * expands a folded layer, folds an expanded one from its label. */
  activate(row, onLabel = false) {
    const r = this.rows[row];
    if (!r) return;
    if (r.folded) { if (this.o.onExpand) this.o.onExpand(r.l, true); return; }
    if (r.open && onLabel && this.o.onExpand) { this.o.onExpand(r.l, false); return; }
    if (r.h !== null && this.o.onPick) this.o.onPick(r.l, r.h);
  }

  /** Arrow keys move the cursor (Shift: a layer / ten buckets at a time),
   * Home/End to the first/last bucket, Enter or Space follows the head
   * (expands a folded layer), Escape folds an expanded one. */
  key(e) {
    if (!this.rows || !this.rows.length) return;
    const c = this.cursor || {row: 0, col: 0};
    const big = e.shiftKey;
    let dr = 0, dc = 0;
    switch (e.key) {
      case 'ArrowUp': dr = big ? -this.layerRows(c.row) : -1; break;
      case 'ArrowDown': dr = big ? this.layerRows(c.row) : 1; break;
      case 'ArrowLeft': dc = big ? -10 : -1; break;
      case 'ArrowRight': dc = big ? 10 : 1; break;
      case 'Home': dc = -1e9; break;
      case 'End': dc = 1e9; break;
      case 'Enter': case ' ': e.preventDefault(); this.activate(c.row); return;
      case 'Escape': { const r = this.rows[c.row]; if (r && r.open && this.o.onExpand) this.o.onExpand(r.l, false); return; }
      default: return;
    }
    e.preventDefault();
    this.moveCursor(c.row + dr, c.col + dc);
  }

  layerRows(row) { const l = this.rows[row].l; return this.rows.filter((r) => r.l === l).length; }

  moveCursor(row, col) {
    row = Math.max(0, Math.min(this.rows.length - 1, row));
    col = Math.max(0, Math.min(this.steps.length - 1, col));
    this.cursor = {row, col};
    this.draw();
    const text = this.describeCell(row, col);
    this.live.textContent = text;
    this.canvas.setAttribute('aria-valuetext', text);
    const b = this.colBox(col), g = this.g;
    if (b && g) {
      this.showTip(text, PAD_L + b[0], g.y[row]);
      // keep the cursor row in the scroll box
      const top = g.y[row], sc = this.scroll;
      if (top < sc.scrollTop || top > sc.scrollTop + sc.clientHeight - 20) sc.scrollTop = Math.max(0, top - sc.clientHeight / 2);
    }
  }

  select(l, hd) { this.sel = l === null || l === undefined ? null : {l, h: hd}; this.draw(); }

  destroy() { this.ro.disconnect(); window.removeEventListener('themechange', this.onTheme); this.root.remove(); }
}

/** Whether two answers have the same buckets (then their rows line up). */
function sameBuckets(a, b) {
  return a.step.length === b.step.length && a.width === b.width && a.step.every((s, i) => s === b.step[i]);
}
