// compare.js: two or more runs overlaid on the same axes (say a baseline
// and its σReparam twin): loss, eval loss, and any metric chosen — a head or
// layer metric folded over every layer and head (line: mean, band: the
// exact min–max over all heads in each bucket), or one layer of it.
import {api, reparamOf} from './api.js';
import {TimeChart, logByDefault, pointsFor, tableOf} from './charts.js';
import {subscribe} from './live.js';
import {color, fmtStep, h, unitOf, urlState} from './util.js';

const int = (v) => (v === undefined || v === null || v === '' || Number.isNaN(+v) ? null : Math.max(0, Math.round(+v)));

export class CompareView {
  constructor(root, s) {
    this.root = root;
    this.ids = (s.runs || '').split(',').map((x) => +x).filter((x) => x > 0);
    this.st = {metric: s.metric || 'entropy_norm', layer: int(s.layer), from: int(s.from), to: int(s.to),
               agg: ['mean', 'min', 'max'].includes(s.agg) ? s.agg : 'mean'};
    this.charts = [];
    this.pending = 0;
    this.unsub = subscribe((t, d) => this.onLive(t, d));
    this.init();
  }

  async init() {
    let all;
    try { all = await api.runs(); } catch (e) { this.root.append(h('p', {class: 'error'}, 'Cannot list runs: ' + e.message)); return; }
    if (this.dead) return;
    this.all = all;
    const picker = h('div', {class: 'picker'}, ...all.map((r) => h('label', {class: 'pick'},
      h('input', {type: 'checkbox', value: r.id, checked: this.ids.includes(r.id), onchange: () => this.pickChanged(picker)}),
      ' ', r.name, ' ', h('span', {class: 'muted'}, `#${r.id} · ${r.status}` + (reparamOf(r.meta) === 'sigma' ? ' · σReparam' : '')))));
    this.root.append(h('section', {class: 'card'},
      h('div', {class: 'card-head'}, h('h1', {}, 'Compare runs'),
        h('span', {class: 'muted'}, 'tick two or more runs; the same step axis for all')),
      all.length ? picker : h('p', {class: 'muted'}, 'No runs stored yet.')));
    this.body = h('div', {id: 'compare-body'});
    this.root.append(this.body);
    this.runs = [];
    for (const id of this.ids) {
      try { this.runs.push(await api.run(id)); } catch { /* a deleted run: leave it out */ }
    }
    this.build();
  }

  pickChanged(picker) {
    this.ids = [...picker.querySelectorAll('input:checked')].map((x) => +x.value);
    urlState.set({runs: this.ids.join(',')});
    this.rebuild();
  }

  async rebuild() {
    this.runs = [];
    for (const id of this.ids) { try { this.runs.push(await api.run(id)); } catch { /* gone */ } }
    this.build();
  }

  build() {
    for (const c of this.charts) c.chart.destroy();
    this.charts = [];
    this.body.textContent = '';
    window.__render.complete = false;
    if (this.runs.length < 1) {
      this.body.append(h('p', {class: 'muted card'}, 'Pick runs above.'));
      this.done();
      return;
    }
    const names = (k) => [...new Set(this.runs.flatMap((r) => (r.metrics && r.metrics[k]) || []))].sort();
    this.kinds = {};
    for (const k of ['scalars', 'layers', 'heads']) for (const m of names(k)) this.kinds[m] = k;
    const metrics = Object.keys(this.kinds);
    if (!this.kinds[this.st.metric]) this.st.metric = ['entropy_norm', 'entropy', 'loss'].find((m) => this.kinds[m]) || metrics[0];
    const maxL = Math.max(...this.runs.map((r) => r.layers));
    const mSel = h('select', {id: 'cmp-metric', 'aria-label': 'metric', onchange: (e) => { this.st.metric = e.target.value; urlState.set({metric: this.st.metric}); this.build(); }},
      ...metrics.map((m) => h('option', {value: m, selected: m === this.st.metric}, `${m} (${this.kinds[m].slice(0, -1)})`)));
    const lSel = h('select', {id: 'cmp-layer', 'aria-label': 'layer', onchange: (e) => { this.st.layer = int(e.target.value); urlState.set({layer: this.st.layer ?? undefined}); this.build(); }},
      h('option', {value: ''}, 'all layers'), ...Array.from({length: maxL}, (_, l) => h('option', {value: l, selected: l === this.st.layer}, 'layer ' + l)));
    const aSel = h('select', {id: 'cmp-agg', 'aria-label': 'line', onchange: (e) => { this.st.agg = e.target.value; urlState.set({agg: this.st.agg === 'mean' ? undefined : this.st.agg}); this.build(); }},
      ...['mean', 'min', 'max'].map((a) => h('option', {value: a, selected: a === this.st.agg}, `line: ${a} over heads/layers`)));
    this.rangeEl = h('span', {class: 'range-txt'});
    const reset = h('button', {class: 'btn light', onclick: () => this.setRange(null, null)}, 'Zoom out');
    this.body.append(h('div', {class: 'rangebar'}, h('span', {class: 'muted'}, 'metric '), mSel, lSel, aSel,
      h('span', {class: 'spacer'}), this.rangeEl, reset));
    this.showRange();
    const grid = h('div', {class: 'grid2 card'});
    this.body.append(grid);
    const list = ['loss', 'eval_loss'].filter((m) => this.kinds[m] && m !== this.st.metric);
    list.unshift(this.st.metric);
    for (const m of list) this.addChart(grid, m);
  }

  addChart(grid, metric) {
    const kind = this.kinds[metric];
    const layer = kind === 'scalars' ? null : this.st.layer;
    const fold = kind === 'heads' ? (layer === null ? 'all layers and heads' : `layer ${layer}, all heads`)
      : kind === 'layers' ? (layer === null ? 'all layers' : `layer ${layer}`) : '';
    const line = fold ? this.st.agg : 'mean';
    const title = fold ? `${metric} — ${fold} (line: ${line}, band: min–max)` : `${metric} (line: mean, band: min–max)`;
    const cell = h('div', {class: 'cell'});
    grid.append(cell);
    const chart = new TimeChart(cell, {title, unit: unitOf(metric), height: 260, sync: 'compare', file: `compare-${metric}`,
      log: logByDefault(metric), autoLog: true,
      onZoom: (a, b) => this.setRange(a, b), onReset: () => this.setRange(null, null)});
    chart.el.dataset.metric = metric;
    const c = {chart};
    c.load = async () => {
      this.pending++;
      try {
        const pts = pointsFor(chart.el);
        const res = await Promise.all(this.runs.map((r) => {
          const q = {metric, points: pts, from: this.st.from ?? undefined, to: this.st.to ?? undefined};
          if (kind !== 'scalars') { q.agg = this.st.agg; if (layer !== null && layer < r.layers) q.layer = layer; }
          return api.series(r.id, q).catch(() => null);
        }));
        const defs = this.runs.map((r, i) => ({label: `${r.name}` + (reparamOf(r.meta) === 'sigma' ? ' (σReparam)' : ''),
                                               color: color(i), band: true, width: 1.8}));
        await chart.setData(defs, tableOf(res.map((x) => ({res: x, y: x && x.value ? 'value' : 'mean', band: true}))));
        chart.el.dataset.runs = this.runs.map((r) => r.id).join(',');
      } finally {
        this.pending--;
        this.done();
      }
    };
    this.charts.push(c);
    c.load();
  }

  setRange(from, to) {
    this.st.from = from; this.st.to = to;
    urlState.set({from: from ?? undefined, to: to ?? undefined});
    this.showRange();
    for (const c of this.charts) c.load();
  }

  showRange() {
    const z = this.st.from !== null || this.st.to !== null;
    this.rangeEl.textContent = z ? `steps ${fmtStep(this.st.from ?? 0)} – ${this.st.to === null ? 'end' : fmtStep(this.st.to)}` : 'whole runs';
  }

  onLive(type, d) {
    if (!this.runs || this.dead) return;
    if (type === 'reset') { this.rebuild(); return; }
    if (type !== 'step' || !d || !this.ids.includes(d.run) || this.st.to !== null) return;
    if (this.liveTimer) return;
    this.liveTimer = setTimeout(() => { this.liveTimer = null; if (!this.dead) for (const c of this.charts) c.load(); }, 2000);
  }

  done() {
    const r = window.__render;
    if (r && !r.complete && this.pending === 0) { r.complete = true; r.completeAt = performance.now(); }
  }

  destroy() { this.dead = true; clearTimeout(this.liveTimer); this.unsub(); for (const c of this.charts) c.chart.destroy(); }
}
