// runs.js: the runs list — status, last step, latest loss, lowest head
// entropy, firing alerts and σReparam per run, updated live from the event
// stream; tick runs to compare them.
import {api, reparamOf} from './api.js';
import {subscribe} from './live.js';
import {fmt, fmtAgo, fmtStep, h, urlState} from './util.js';
import {verdictOf} from './verdict.js';

const REPARAM_TEXT = {sigma: 'σReparam', spectral: 'spectral norm', none: 'none'};

export class RunsView {
  constructor(root, state) {
    this.root = root;
    this.rows = new Map();   // id -> {run, tr, cells, loss, minEnt}
    this.selected = new Set();
    const filter = state.status || '';
    this.filter = filter;
    this.tbody = h('tbody');
    this.empty = h('p', {class: 'muted empty', hidden: true},
      'No runs yet. Start a trainer against this daemon (sigmatrain --daemon unix:DATA/entropyd.sock) and it appears here at once.');
    this.cmpBtn = h('button', {class: 'btn', disabled: true, onclick: () => this.compare()}, 'Compare selected');
    const statusSel = h('select', {'aria-label': 'status filter', onchange: (e) => {
      this.filter = e.target.value; urlState.set({status: this.filter}); this.load();
    }}, ...['', 'live', 'stale', 'finished', 'failed', 'aborted'].map((s) =>
      h('option', {value: s, selected: s === filter}, s || 'all statuses')));
    root.append(
      h('section', {class: 'card'},
        h('div', {class: 'card-head'},
          h('h1', {}, 'Runs'),
          h('span', {class: 'muted'}, 'updated live from the event stream; stale = the trainer disconnected without ending the run'),
          h('span', {class: 'spacer'}), statusSel, this.cmpBtn),
        h('table', {class: 'runs', id: 'runs-table'},
          h('thead', {}, h('tr', {},
            h('th', {class: 'sel'}, ''), h('th', {}, 'run'), h('th', {}, 'status'), h('th', {}, 'σReparam'),
            h('th', {class: 'num'}, 'layers × heads'), h('th', {class: 'num'}, 'last step'),
            h('th', {class: 'num', title: 'latest training loss, nats/token'}, 'loss (nats)'),
            h('th', {class: 'num', title: 'lowest per-head attention entropy at the latest step, nats; coloured by the run’s verdict (red: collapsed or diverged, amber: collapsing or stalled)'}, 'min head entropy (nats)'),
            h('th', {class: 'num'}, 'alerts firing'), h('th', {}, 'updated'))),
          this.tbody),
        this.empty));
    this.unsub = subscribe((t, d) => this.onLive(t, d));
    this.tick = setInterval(() => this.refreshAges(), 5000);
    this.load();
  }

  async load() {
    let runs;
    try { runs = await api.runs(); } catch (e) { this.showError(e); return; }
    if (this.dead) return;
    if (this.filter) runs = runs.filter((r) => r.status === this.filter);
    this.tbody.textContent = '';
    this.rows.clear();
    runs.sort((a, b) => (b.updated || 0) - (a.updated || 0));
    for (const r of runs) this.addRow(r);
    this.empty.hidden = runs.length > 0;
    window.__render.complete = true;
    window.__render.completeAt = performance.now();
    // the latest loss and entropy per run: one small frame request each
    await Promise.all(runs.map(async (r) => {
      const row = this.rows.get(r.id);
      // the verdict: the daemon's (run.verdict), else derived from the run's alerts
      const [loss, ent, alerts] = await Promise.all([
        api.frame(r.id, 'loss').catch(() => null), api.frame(r.id, 'entropy').catch(() => null),
        r.verdict ? null : api.alerts(r.id).catch(() => null)]);
      if (!row || this.dead) return;
      if (r.verdict || alerts) this.setVerdict(row, verdictOf(r, alerts));
      if (loss && row.lossStep === undefined) this.setLoss(row, loss.values[0], loss.step);
      if (ent && row.entStep === undefined) {
        let m = Infinity;
        for (const rowv of ent.values) for (const v of (Array.isArray(rowv) ? rowv : [rowv])) if (v !== null && v < m) m = v;
        this.setEnt(row, m === Infinity ? null : m, ent.step);
      }
    }));
  }

  addRow(r) {
    const rp = reparamOf(r.meta);
    const cells = {
      sel: h('input', {type: 'checkbox', 'aria-label': 'select ' + r.name, checked: this.selected.has(r.id), onchange: (e) => {
        if (e.target.checked) this.selected.add(r.id); else this.selected.delete(r.id);
        this.cmpBtn.disabled = this.selected.size < 2;
        this.cmpBtn.textContent = `Compare selected (${this.selected.size})`;
      }}),
      status: h('span', {class: 'badge st-' + r.status, text: r.status}),
      step: h('td', {class: 'num step', text: fmtStep(r.last_step)}),
      loss: h('td', {class: 'num loss', text: '—'}),
      ent: h('td', {class: 'num ent', text: '—'}),
      alerts: h('td', {class: 'num alerts'}),
      updated: h('td', {class: 'muted updated', text: fmtAgo(r.updated)}),
    };
    const tr = h('tr', {dataset: {run: r.id, status: r.status}},
      h('td', {class: 'sel'}, cells.sel),
      h('td', {}, h('a', {href: `./?run=${r.id}`, class: 'run-link'}, r.name)),
      h('td', {}, cells.status),
      h('td', {class: 'reparam', dataset: {reparam: rp || 'unknown'}},
        rp ? h('span', {class: 'badge rp-' + rp}, REPARAM_TEXT[rp]) : h('span', {class: 'muted', title: 'the run’s meta does not say'}, '?')),
      h('td', {class: 'num', text: `${r.layers} × ${r.heads}`}),
      cells.step, cells.loss, cells.ent, cells.alerts, cells.updated);
    const row = {run: r, tr, cells};
    this.setAlerts(row, r.alerts_firing || 0);
    this.rows.set(r.id, row);
    this.tbody.append(tr);
  }

  setLoss(row, v, step) { row.lossStep = step; row.cells.loss.textContent = fmt(v); }
  setEnt(row, v, step) {
    row.entStep = step; row.cells.ent.textContent = fmt(v);
  }
  /** Colours the entropy cell by the run's verdict, not by a threshold in
   * nats (a healthy σReparam run sits at 0.2 nats, a collapsed one at 4e-5). */
  setVerdict(row, v) {
    row.tr.dataset.verdict = v.state;
    const c = row.cells.ent;
    for (const k of [...c.classList]) if (k.startsWith('v-')) c.classList.remove(k);
    c.classList.add('v-' + v.state);
    c.title = `verdict: ${v.state}` + (v.since_step !== null ? ` (step ${fmtStep(v.since_step)})` : '');
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
      if (type !== 'alert') this.reloadSoon();
      return;
    }
    if (type === 'step') {
      row.run.last_step = d.step;
      row.cells.step.textContent = fmtStep(d.step);
      row.cells.step.dataset.step = d.step;
      if (d.scalars && 'loss' in d.scalars) this.setLoss(row, d.scalars.loss, d.step);
      if (d.entropy && d.entropy.min) {
        const m = Math.min(...d.entropy.min.filter((v) => v !== null));
        this.setEnt(row, Number.isFinite(m) ? m : null, d.step);
      }
      row.run.updated = d.ct || Date.now() / 1000;
      row.cells.updated.textContent = fmtAgo(row.run.updated);
      if (row.run.status !== 'live') this.setStatus(row, 'live');
    } else if (type === 'run') {
      if (d.status === 'deleted') { row.tr.remove(); this.rows.delete(d.run); return; }
      this.setStatus(row, d.status);
    } else if (type === 'alert') {
      this.reloadSoon();
    }
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

  destroy() { this.dead = true; this.unsub(); clearInterval(this.tick); clearTimeout(this.reloadTimer); }
}
