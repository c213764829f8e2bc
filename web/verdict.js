// verdict.js: what a run's state is, in one word — healthy, collapsing,
// collapsed, diverged, stalled or sharp (heads low while the loss trains) — for the run page's banner and the runs
// list. The daemon says it in GET /api/runs/{id} ("verdict": {state,
// since_step, heads: [[layer, head], ...], rule}); a daemon that does not
// yet gets it derived here from the run's alerts, by the same reading: an
// entropy_collapse alert that fired means collapsed since its start step,
// still firing on a live run collapsing; a loss_nonfinite alert diverged.
// Also the one reading of an alert's JSON (normAlert) the pages share.

const STATES = new Set(['healthy', 'collapsing', 'collapsed', 'diverged', 'stalled', 'sharp']);

/** run: the run API answer; alerts: the alerts API rows and live alert
 * events (any shape normAlert reads), or null when unknown. Returns
 * {state, since_step, heads, rule, source: 'daemon' | 'alerts'}. */
export function verdictOf(run, alerts) {
  const v = run && run.verdict;
  if (v && typeof v === 'object' && STATES.has(v.state))
    return {state: v.state, since_step: Number.isFinite(v.since_step) ? v.since_step : null,
            heads: Array.isArray(v.heads) ? v.heads.filter((x) => Array.isArray(x) && x.length >= 2) : [],
            rule: v.rule || null, source: 'daemon'};
  const as = (alerts || []).map(normAlert);
  const live = run && run.status === 'live';
  const first = (xs) => xs.reduce((m, a) => (a.step !== null && (m === null || a.step < m) ? a.step : m), null);
  const cellsOf = (xs) => {
    const seen = new Map();
    for (const a of xs) for (const c of a.cells) seen.set(c.join(','), c);
    return [...seen.values()].sort((x, y) => x[0] - y[0] || x[1] - y[1]);
  };
  const nonfinite = as.filter((a) => a.rule === 'loss_nonfinite');
  if (nonfinite.length) return {state: 'diverged', since_step: first(nonfinite), heads: [], rule: 'loss_nonfinite', source: 'alerts'};
  const col = as.filter((a) => a.rule === 'entropy_collapse');
  if (col.length) {
    const firing = col.filter((a) => a.state === 'firing');
    const now = live && firing.length > 0;
    const xs = now ? firing : col;
    return {state: now ? 'collapsing' : 'collapsed', since_step: first(xs), heads: cellsOf(xs), rule: 'entropy_collapse', source: 'alerts'};
  }
  return {state: 'healthy', since_step: null, heads: [], rule: null, source: 'alerts'};
}

/** An alert in whatever shape the alerts API settles on (Alertmanager-like
 * labels/annotations, or flat fields): state, rule, where, step, summary. */
export function normAlert(x) {
  // The SSE event wraps the alert's JSON: {type, transition, rule, start_step, step, alert: {...}};
  // an API row holds it too: {id, rule, state, start_step, last_step, cells, alert: {...}, transitions}.
  // The outer fields win.
  if (x && x.alert && typeof x.alert === 'object') {
    const {alert, ...outer} = x;
    x = {...alert, ...Object.fromEntries(Object.entries(outer).filter(([, v]) => v !== undefined && v !== null))};
  }
  const lb = x.labels || {}, an = x.annotations || {};
  const state = String(x.state || x.status || (x.endsAt && !/^0001/.test(x.endsAt) ? 'resolved' : 'firing')).toLowerCase();
  const rule = x.rule || x.name || lb.alertname || lb.rule || 'alert';
  const cells = Array.isArray(x.cells) ? x.cells : null;
  const cell = (c) => (c.layer !== undefined ? `L${c.layer}` : '') + (c.head !== undefined ? ` h${c.head}` : '');
  let where;
  // the daemon lists at most 256 cells; ncells counts them all
  const ncells = Number.isFinite(x.ncells) ? x.ncells : cells ? cells.length : 0;
  if (cells && cells.length) where = ncells === 1 ? cell(cells[0]) || 'run'
    : `${ncells} cells: ` + cells.slice(0, 4).map(cell).join(', ') + (ncells > 4 ? '…' : '');
  else {
    const layer = x.layer ?? lb.layer, head = x.head ?? lb.head;
    where = layer !== undefined ? `L${layer}` + (head !== undefined ? ` h${head}` : '') : (lb.metric || 'run');
  }
  const stepRaw = x.start_step ?? x.started_step ?? x.step ?? x.firing_step ?? lb.step ?? an.step ?? null;
  const step = stepRaw === null || stepRaw === undefined || Number.isNaN(+stepRaw) ? null : +stepRaw;
  const summary = an.summary || an.description || x.summary || x.message || x.text || '';
  const key = x.fingerprint || x.id || `${rule}@${step}`;
  const pairs = (cells || []).filter((c) => c && c.layer !== undefined && c.head !== undefined).map((c) => [+c.layer, +c.head]);
  return {state, rule, where, step, summary, key, severity: x.severity || lb.severity || '', cells: pairs};
}
