// api.js: the dashboard's access to entropyd's HTTP API (README "HTTP API").
// Every request goes through one small queue so that many charts loading at
// once never take all of the browser's six connections per host (the live
// stream holds one). Not a cache: callers keep what they fetched.

const params = new URLSearchParams(location.search);
// A daemon started with --token wants it on every /api request; the page
// carries it in its own URL (?token=...) and passes it on.
const TOKEN = params.get('token') || '';

const MAX_INFLIGHT = 5;
let inflight = 0;
const waiting = [];   // [{run, prio}] high prio first
export const netStats = {requests: 0, bytes: 0, pending: 0};
window.__net = netStats;   // for tests and the benchmark

function pump() {
  while (inflight < MAX_INFLIGHT && waiting.length) {
    waiting.sort((a, b) => b.prio - a.prio);
    const job = waiting.shift();
    inflight++;
    job.run().finally(() => { inflight--; pump(); });
  }
}

/** Adds the token (when the page has one) to an /api path. */
export function withToken(path) {
  if (!TOKEN) return path;
  return path + (path.includes('?') ? '&' : '?') + 'token=' + encodeURIComponent(TOKEN);
}

/** An error from the API: status 0 for a network failure. */
export class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

/** GET path as JSON, queued. prio 1..3 goes first (the run, the heatmap,
 * the curves at the top); the rest newest first, so the charts just
 * scrolled to load before the ones scrolled past. */
export function getJSON(path, {prio = 0, signal} = {}) {
  prio = prio > 0 ? prio * 1e12 : performance.now();
  netStats.pending++;
  return new Promise((resolve, reject) => {
    waiting.push({prio, run: async () => {
      try {
        if (signal && signal.aborted) throw new DOMException('aborted', 'AbortError');
        netStats.requests++;
        const r = await fetch(withToken(path), {signal, cache: 'no-store'});
        const text = await r.text();
        netStats.bytes += text.length;
        let body = null;
        try { body = text ? JSON.parse(text) : null; } catch { body = null; }
        if (!r.ok) {
          const e = body && body.error ? body.error : {code: 'http_' + r.status, message: text.slice(0, 200)};
          throw new ApiError(r.status, e.code, e.message);
        }
        resolve(body);
      } catch (e) {
        reject(e instanceof ApiError || e.name === 'AbortError' ? e : new ApiError(0, 'network', String(e.message || e)));
      } finally {
        netStats.pending--;
      }
    }});
    pump();
  });
}

/** The query string of a runs page request (runsPage's p; empty fields
 * left out, the others in p's order). */
export function runsQuery(p) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(p)) if (v !== undefined && v !== null && v !== '') u.set(k, v);
  return u.toString();
}

/** The first runs page index.html started fetching before the modules
 * loaded, if it asked for query (else null, and that fetch is cancelled);
 * taken once; cancelled when signal aborts. Counted as a request like any
 * other. Resolves to the page, or null if it failed. */
export function takePrefetchedRuns(query, signal) {
  const pre = window.__prefetch;
  if (!pre || pre.runs === undefined) return null;
  window.__prefetch = null;
  if (pre.runs !== query) {
    if (pre.ctl) pre.ctl.abort();
    return null;
  }
  netStats.requests++;
  if (pre.ctl) signal.addEventListener('abort', () => pre.ctl.abort());
  return pre.page;
}

export const api = {
  runs: () => getJSON('/api/runs', {prio: 2}),
  /** One page of the runs list: p holds limit, cursor, sort, order, status,
   * verdict, q, created_from, created_to, meta.KEY (empty ones left out);
   * the answer is {runs, next, sort, order, total}. */
  runsPage: (p, opts) => getJSON(`/api/runs?${runsQuery(p)}`, {prio: 2, ...opts}),
  run: (id) => getJSON(`/api/runs/${id}`, {prio: 2}),
  /** q: {metric, layer, head, from, to, points, agg, split} (undefined fields
   * left out); with split ('head' | 'layer') the answer lists one series per
   * head or layer in `series` (see splitOf in charts.js) */
  series: (id, q, opts) => {
    const u = new URLSearchParams();
    for (const k of ['metric', 'layer', 'head', 'from', 'to', 'points', 'agg', 'split'])
      if (q[k] !== undefined && q[k] !== null && q[k] !== '') u.set(k, q[k]);
    return getJSON(`/api/runs/${id}/series?${u}`, opts);
  },
  frame: (id, metric, step, opts) => {
    const u = new URLSearchParams({metric});
    if (step !== undefined && step !== null) u.set('step', step);
    return getJSON(`/api/runs/${id}/frame?${u}`, opts);
  },
  events: (id) => getJSON(`/api/runs/${id}/events?limit=1000`),
  /** Events newest first: {run, events, more}; pass before = the id of the
   * oldest event shown to load older ones (more: there are). */
  eventsNewest: (id, before, limit = 300, opts) =>
    getJSON(`/api/runs/${id}/events?order=desc&limit=${limit}${before ? '&before=' + before : ''}`, opts),
  // The alerts API arrives with the alerts issue; until then a 404 means "none".
  alerts: async (id) => {
    try {
      const a = await getJSON(`/api/runs/${id}/alerts`);
      return Array.isArray(a) ? a : (a && Array.isArray(a.alerts) ? a.alerts : []);
    } catch (e) {
      if (e.status === 404 || e.status === 400) return null;
      throw e;
    }
  },
};

/** What a run's meta says about reparametrization: 'sigma' (σReparam),
 * 'spectral' (spectral norm, no gamma), 'none', or null when the meta does
 * not say. sigmatrain puts its config in the hello meta (meta.reparam is
 * "none" | "sigma" | "spectral"); other trainers may use a boolean or
 * nest it, so this looks in a few places and never throws. */
export function reparamOf(meta) {
  if (!meta || typeof meta !== 'object') return null;
  const cands = [meta.reparam, meta.sreparam, meta.sigma_reparam, meta.config && meta.config.reparam,
                 meta.model && meta.model.reparam];
  for (const v of cands) {
    if (v === undefined || v === null) continue;
    if (typeof v === 'boolean') return v ? 'sigma' : 'none';
    if (typeof v === 'number') return v ? 'sigma' : 'none';
    if (typeof v === 'string') {
      const s = v.toLowerCase();
      if (['none', 'off', 'no', 'false', '0', 'baseline', ''].includes(s)) return 'none';
      if (s.startsWith('spectral')) return 'spectral';
      return 'sigma';
    }
    if (typeof v === 'object') return 'sigma';
  }
  return null;
}
