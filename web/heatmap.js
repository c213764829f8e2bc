// heatmap.js: the layer x head heatmap of one head metric at one step, on a
// canvas (one putImageData of L x H pixels scaled up, so 32 x 32 or 64 x 64
// heads cost the same as 12 x 12). Rows are layers (0 at the top), columns
// heads. Non-finite values are drawn as hatched grey, never as a colour.
// The colours are viridis re-lit for the theme's card (util.js scaleFor):
// viridis' own ends vanish into one card each (yellow on white 1.3:1, the
// collapsed purple on the dark card 1.1:1), so the scale's lightness is
// moved until both ends are at least 3.3:1 against the card the cells sit
// on, in either theme; the lines between cells are the card's colour. Arrow keys
// move a cell cursor, Enter follows its head. The values drawn are exposed
// as window.__heatmap for tests.
import {cssRGB, fmt, fmtStep, h, scaleFor, themeColors} from './util.js';

let lutOf = {theme: null, lut: null};
/** 256 colours (r, g, b) of the colour scale in the theme shown (its ends
 * at least 3.3:1 against the card; docs/dashboard.md "The heatmap's colours"). */
export function scaleLUT() {
  const theme = document.documentElement.dataset.theme || '';
  if (lutOf.theme !== theme || !lutOf.lut) lutOf = {theme, lut: scaleFor(cssRGB(themeColors().bg))};
  return lutOf.lut;
}

// On a log colour scale, values at or below this fraction of the top of the
// scale take the darkest colour (entropy_norm: 1e-4, so 0.005 and 0.1 are
// 0.42 and 0.75 of the scale, apart; linear they are 0.005 and 0.1).
const LOG_SPAN = 1e4;

export class Heatmap {
  /** o: {unit, onPick(layer, head), layers} */
  constructor(parent, o = {}) {
    this.o = o;
    this.root = h('div', {class: 'heatmap'});
    this.canvas = h('canvas', {class: 'hm-canvas', tabindex: 0, role: 'application', 'aria-roledescription': 'heatmap',
      'aria-label': 'layer by head heatmap: arrow keys move between cells, Enter follows the head'});
    this.live = h('div', {class: 'sr-only', 'aria-live': 'polite'});
    this.tip = h('div', {class: 'hm-tip', hidden: true});
    this.scale = h('canvas', {class: 'hm-scale', width: 240, height: 12});
    this.scaleLo = h('span', {class: 'hm-lo'});
    this.scaleHi = h('span', {class: 'hm-hi'});
    this.scaleUnit = h('span', {class: 'hm-unit'});
    this.plot = h('div', {class: 'hm-plot'}, this.canvas, this.tip);
    this.root.append(this.plot,
      h('div', {class: 'hm-legend'}, this.scaleLo, this.scale, this.scaleHi, this.scaleUnit));
    this.root.append(this.live);
    parent.append(this.root);
    // reserve the height the cells will take, so the page does not jump
    // (and lazy charts below are not mistaken for visible) before data comes
    if (o.layers) this.plot.style.minHeight = 26 + o.layers * Math.max(6, Math.min(40, Math.floor(560 / o.layers))) + 'px';
    this.frame = null;
    this.domain = [0, 1];
    this.fixed = null;
    this.canvas.addEventListener('mousemove', (e) => this.hover(e));
    this.canvas.addEventListener('mouseleave', () => { this.tip.hidden = true; });
    this.canvas.addEventListener('click', (e) => {
      const c = this.cellAt(e);
      if (c && this.o.onPick) this.o.onPick(c.l, c.h);
    });
    this.canvas.addEventListener('keydown', (e) => this.key(e));
    this.canvas.addEventListener('focus', () => { if (!this.cursor && this.frame) this.moveCursor(this.sel ? this.sel.l : 0, this.sel ? this.sel.h : 0); else this.draw(); });
    this.canvas.addEventListener('blur', () => { this.tip.hidden = true; this.draw(); });
    this.onTheme = () => this.draw();
    window.addEventListener('themechange', this.onTheme);
    this.ro = new ResizeObserver(() => this.draw());
    this.ro.observe(this.plot);
  }

  /** frame: the frame API answer {metric, step, layers, heads, values}.
   * fixedDomain: [lo, hi] for metrics with a known range (entropy_norm);
   * otherwise the colour range is the frame's own min..max. */
  set(frame, unit, fixedDomain, log = this.log) {
    this.frame = frame;
    this.unit = unit;
    this.fixedDomain = fixedDomain;
    this.log = !!log;
    const L = frame.layers, H = frame.heads;
    const flat = new Float64Array(L * H);
    let lo = Infinity, hi = -Infinity;
    for (let l = 0; l < L; l++) {
      const row = Array.isArray(frame.values[l]) ? frame.values[l] : [frame.values[l]];
      for (let k = 0; k < H; k++) {
        const v = row[k] === null || row[k] === undefined ? NaN : row[k];
        flat[l * H + k] = v;
        if (Number.isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
      }
    }
    this.flat = flat;
    if (this.log) {
      // whole decades from the top of the scale down LOG_SPAN (or to the
      // smallest positive value, when that is nearer)
      let minPos = Infinity;
      for (const v of flat) if (v > 0 && v < minPos) minPos = v;
      const top = fixedDomain ? fixedDomain[1] : hi;
      // a metric with a known top keeps one scale at every step
      if (fixedDomain && top > 0) this.domain = [top / LOG_SPAN, top];
      else if (top > 0) {
        const t = 10 ** Math.ceil(Math.log10(top));
        const b = Math.max(t / LOG_SPAN, 10 ** Math.floor(Math.log10(Math.min(minPos, top))));
        this.domain = [b < t ? b : t / 10, t];
      } else this.log = false;
    }
    if (!this.log) {
      if (fixedDomain) this.domain = fixedDomain;
      else if (lo <= hi) this.domain = lo === hi ? [lo - 0.5, hi + 0.5] : [lo, hi];
    }
    window.__heatmap = {metric: frame.metric, step: frame.step, layers: L, heads: H,
                        values: Array.from({length: L}, (_, l) => Array.from(flat.subarray(l * H, (l + 1) * H),
                                                                             (v) => (Number.isFinite(v) ? v : null))),
                        domain: this.domain.slice(), scale: this.log ? 'log' : 'linear', drawn: (window.__heatmap ? window.__heatmap.drawn : 0)};
    this.canvas.dataset.step = frame.step;
    this.canvas.dataset.metric = frame.metric;
    this.draw();
  }

  draw() {
    const f = this.frame;
    if (!f) return;
    const L = f.layers, H = f.heads;
    const box = this.plot.getBoundingClientRect();
    const availW = Math.max(120, box.width - 40);
    // cells stay square-ish, at most 40 px, at least 6 px high
    const cell = Math.max(6, Math.min(40, Math.floor(availW / H), Math.floor(560 / L)));
    const cw = Math.max(4, Math.floor(availW / H) > cell * 2 ? cell : Math.floor(availW / H));
    const ch = cell;
    const padL = 34, padT = 18;
    const W = padL + cw * H, Ht = padT + ch * L;
    const dpr = window.devicePixelRatio || 1;
    const cv = this.canvas;
    if (cv.width !== Math.round(W * dpr) || cv.height !== Math.round(Ht * dpr)) {
      cv.width = Math.round(W * dpr); cv.height = Math.round(Ht * dpr);
      cv.style.width = W + 'px'; cv.style.height = Ht + 'px';
    }
    this.geom = {padL, padT, cw, ch, L, H};
    const ctx = cv.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, W, Ht);
    // the cells: one pixel per head, scaled without smoothing
    const img = new ImageData(H, L), lut = scaleLUT();
    for (let i = 0; i < L * H; i++) {
      const v = this.flat[i];
      const p = i * 4;
      if (!Number.isFinite(v)) { img.data[p] = 200; img.data[p + 1] = 200; img.data[p + 2] = 205; img.data[p + 3] = 255; continue; }
      const t = Math.round(255 * this.position(v));
      img.data[p] = lut[t * 3]; img.data[p + 1] = lut[t * 3 + 1]; img.data[p + 2] = lut[t * 3 + 2];
      img.data[p + 3] = 255;
    }
    if (!this.off || this.off.width !== H || this.off.height !== L) {
      this.off = document.createElement('canvas');
      this.off.width = H; this.off.height = L;
    }
    this.off.getContext('2d').putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.off, padL, padT, cw * H, ch * L);
    // hatching over non-finite cells
    ctx.strokeStyle = '#8a8f98'; ctx.lineWidth = 1;
    for (let i = 0; i < L * H; i++) {
      if (Number.isFinite(this.flat[i])) continue;
      const x = padL + (i % H) * cw, y = padT + Math.floor(i / H) * ch;
      ctx.beginPath(); ctx.moveTo(x, y + ch); ctx.lineTo(x + cw, y); ctx.stroke();
    }
    // grid lines when cells are big enough to separate
    if (cw >= 10 && ch >= 10) {
      ctx.strokeStyle = themeColors().bg; ctx.lineWidth = 1;
      ctx.beginPath();
      for (let k = 1; k < H; k++) { ctx.moveTo(padL + k * cw + 0.5, padT); ctx.lineTo(padL + k * cw + 0.5, padT + ch * L); }
      for (let l = 1; l < L; l++) { ctx.moveTo(padL, padT + l * ch + 0.5); ctx.lineTo(padL + cw * H, padT + l * ch + 0.5); }
      ctx.stroke();
    }
    if (this.sel && this.sel.l < L && this.sel.h < H) {
      ctx.strokeStyle = '#e4572e'; ctx.lineWidth = 2;
      ctx.strokeRect(padL + this.sel.h * cw + 1, padT + this.sel.l * ch + 1, cw - 2, ch - 2);
    }
    if (this.cursor && document.activeElement === this.canvas && this.cursor.l < L && this.cursor.h < H) {
      ctx.strokeStyle = themeColors().ink; ctx.lineWidth = 2; ctx.setLineDash([3, 2]);
      ctx.strokeRect(padL + this.cursor.h * cw - 1, padT + this.cursor.l * ch - 1, cw + 2, ch + 2);
      ctx.setLineDash([]);
    }
    // axes: layer numbers on the left, head numbers on top (thinned)
    ctx.fillStyle = themeColors().muted; ctx.font = '11px system-ui, sans-serif';
    ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
    const lstep = Math.ceil(14 / ch);
    for (let l = 0; l < L; l += lstep) ctx.fillText('L' + l, padL - 4, padT + l * ch + ch / 2);
    ctx.textAlign = 'center'; ctx.textBaseline = 'bottom';
    const hstep = Math.ceil(22 / cw);
    for (let k = 0; k < H; k += hstep) ctx.fillText('h' + k, padL + k * cw + cw / 2, padT - 3);
    this.drawScale();
    if (window.__heatmap) window.__heatmap.drawn = (window.__heatmap.drawn || 0) + 1;
  }

  /** Where v sits on the colour scale, 0..1 (clamped). */
  position(v) {
    const [lo, hi] = this.domain;
    const t = this.log ? (v > 0 ? Math.log10(v / lo) / Math.log10(hi / lo) : 0) : (v - lo) / (hi - lo || 1);
    return Math.min(1, Math.max(0, t));
  }

  /** Colour of value v as [r, g, b] (for tests: what the cell shows). */
  colorOf(v) {
    const t = Math.round(255 * this.position(v)), lut = scaleLUT();
    return [lut[t * 3], lut[t * 3 + 1], lut[t * 3 + 2]];
  }

  drawScale() {
    const c = this.scale.getContext('2d');
    const w = this.scale.width, hh = this.scale.height;
    const img = c.createImageData(w, hh), lut = scaleLUT();
    for (let x = 0; x < w; x++) {
      const t = Math.round((255 * x) / (w - 1));
      for (let y = 0; y < hh; y++) {
        const p = (y * w + x) * 4;
        img.data[p] = lut[t * 3]; img.data[p + 1] = lut[t * 3 + 1];
        img.data[p + 2] = lut[t * 3 + 2]; img.data[p + 3] = 255;
      }
    }
    c.putImageData(img, 0, 0);
    this.scaleLo.textContent = (this.log ? '≤ ' : '') + fmt(this.domain[0], 3);
    this.scaleHi.textContent = fmt(this.domain[1], 3);
    this.scaleUnit.textContent = (this.log ? 'log scale; ' : '') + (this.unit ? `${this.unit}; ` : '') + 'grey hatched = NaN/∞';
  }

  cellAt(e) {
    const g = this.geom;
    if (!g) return null;
    const r = this.canvas.getBoundingClientRect();
    const x = e.clientX - r.left - g.padL, y = e.clientY - r.top - g.padT;
    const k = Math.floor(x / g.cw), l = Math.floor(y / g.ch);
    if (k < 0 || l < 0 || k >= g.H || l >= g.L) return null;
    return {l, h: k, x: e.clientX - r.left, y: e.clientY - r.top};
  }

  hover(e) {
    const c = this.cellAt(e);
    if (!c || !this.frame) { this.tip.hidden = true; return; }
    const v = this.flat[c.l * this.geom.H + c.h];
    this.tip.hidden = false;
    this.tip.textContent = `layer ${c.l}, head ${c.h}: ${fmt(v)} ${this.unit || ''} @ step ${fmtStep(this.frame.step)}`;
    this.tip.style.left = Math.min(c.x + 12, this.plot.clientWidth - 220) + 'px';
    this.tip.style.top = c.y + 12 + 'px';
  }

  /** Arrow keys move the cell cursor (Shift: four cells), Home/End to a
   * row's ends, Enter or Space follows the head under it. */
  key(e) {
    if (!this.frame) return;
    const c = this.cursor || {l: 0, h: 0}, k = e.shiftKey ? 4 : 1;
    const moves = {ArrowUp: [-k, 0], ArrowDown: [k, 0], ArrowLeft: [0, -k], ArrowRight: [0, k], Home: [0, -1e9], End: [0, 1e9]};
    if (e.key === 'Enter' || e.key === ' ') {
      e.preventDefault();
      if (this.o.onPick) this.o.onPick(c.l, c.h);
      return;
    }
    const m = moves[e.key];
    if (!m) return;
    e.preventDefault();
    this.moveCursor(c.l + m[0], c.h + m[1]);
  }

  moveCursor(l, hd) {
    const f = this.frame;
    l = Math.max(0, Math.min(f.layers - 1, l));
    hd = Math.max(0, Math.min(f.heads - 1, hd));
    this.cursor = {l, h: hd};
    this.draw();
    const text = `layer ${l}, head ${hd}: ${fmt(this.flat[l * f.heads + hd])} ${this.unit || ''} at step ${fmtStep(f.step)}`;
    this.live.textContent = text;
    const g = this.geom;
    if (g) {
      this.tip.hidden = false;
      this.tip.textContent = text;
      this.tip.style.left = Math.min(g.padL + (hd + 1) * g.cw + 4, this.plot.clientWidth - 220) + 'px';
      this.tip.style.top = g.padT + (l + 1) * g.ch + 4 + 'px';
    }
    if (window.__heatmap) window.__heatmap.cursor = {l, h: hd};
  }

  select(l, hd) { this.sel = l === null || l === undefined ? null : {l, h: hd}; this.draw(); }

  destroy() { this.ro.disconnect(); window.removeEventListener('themechange', this.onTheme); this.root.remove(); }
}
