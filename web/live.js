// live.js: one Server-Sent Events connection to /api/stream for the whole
// page, shared by the views through subscribe(). The view shown says what
// it wants on it (want()): the run page asks for its run's summaries
// (ticks=1&layers=1&cells=...: a tick a second, per-layer figures and the
// cells of the metrics it draws, a second apart; docs/http-api.md), the
// runs list for every run's ticks; a change of wish reopens the stream from
// the last event id, so nothing is lost.
//
// The browser's EventSource reconnects by itself and sends Last-Event-ID,
// so a daemon restart or a network blip resumes with no gap (entropyd
// replays from its ring). When the daemon cannot replay (restarted: new
// event ids; or we were away longer than its ring), it sends `reset` and
// the views reload from the REST API. When the browser gives up
// (EventSource CLOSED, e.g. after a non-200 answer during a restart) we
// open a new one ourselves, with backoff, and pass the last id as
// ?last_event_id=.
//
// Connection state is told honestly: the header's dot says "live" only
// while the stream is open; a banner says so when the daemon cannot be
// reached (1 s after the stream went down, so a reconnect that succeeds at
// once does not flash it); subscribers get ('open', {after}) each time the
// stream comes back (after: ms it was down) to clear their error overlays
// and refetch what failed meanwhile.
//
// A tab hidden for HIDE_MS gives its connection back (state 'paused', no
// banner) and reopens the stream from the last event id when shown again:
// the daemon replays what it missed, or sends reset. A browser holds at
// most 6 HTTP/1.1 connections to a host and every open page's stream keeps
// one, so with five dashboard tabs of one daemon streaming, a sixth never
// finished loading; now only the tabs on screen hold one.
import {withToken} from './api.js';

const subs = new Set();
let es = null, lastId = '', retryMs = 500, timer = null, state = 'connecting', wish = '', openedWish = null;
let downSince = null, bannerTimer = null, hideTimer = null, paused = false;
// ticks: the last 100 ticks' {run, from, step}, for tests
export const liveStats = {events: 0, resets: 0, reconnects: 0, opens: 0, lastStep: {}, bytes: 0, query: '', ticks: []};

const BANNER_MS = 1000;
let HIDE_MS = 5000;

function banner(show) {
  let el = document.getElementById('conn-banner');
  if (!show) { if (el) el.hidden = true; return; }
  if (!el) {
    el = document.createElement('div');
    el.id = 'conn-banner';
    el.className = 'conn-banner';
    el.setAttribute('role', 'alert');
    const main = document.getElementById('app');
    main.parentNode.insertBefore(el, main);
  }
  el.textContent = 'The daemon cannot be reached: what is shown is not live. Reconnecting…';
  el.hidden = false;
}

function setState(s) {
  const was = state;
  state = s;
  const el = document.getElementById('live-state');
  if (el) {
    el.dataset.state = s;
    el.title = {open: 'live: connected to the event stream', connecting: 'connecting to the event stream…',
                down: 'event stream lost: reconnecting…', paused: 'tab hidden: the stream resumes when it is shown'}[s] || s;
    el.querySelector('.txt').textContent = {open: 'live', connecting: 'connecting', down: 'reconnecting', paused: 'paused'}[s] || s;
  }
  document.documentElement.dataset.stream = s;
  if (s === 'down' && downSince === null) {
    downSince = performance.now();
    clearTimeout(bannerTimer);
    bannerTimer = setTimeout(() => { if (state === 'down' || state === 'connecting') banner(true); }, BANNER_MS);
  }
  if (s === 'open') {
    clearTimeout(bannerTimer);
    banner(false);
    const after = downSince === null ? 0 : performance.now() - downSince;
    downSince = null;
    if (was !== 'open') { liveStats.opens++; dispatch('open', {after}); }
  }
  if (s !== was) dispatch('state', {state: s});
}

function dispatch(type, data) {
  if (type !== 'open' && type !== 'state') liveStats.events++;
  for (const f of subs) {
    try { f(type, data); } catch (e) { console.error('live subscriber', e); }
  }
}

function open() {
  clearTimeout(timer);
  if (es) es.close();
  paused = false;
  if (state === 'open' || state === 'paused') setState('connecting');
  const q = new URLSearchParams(wish);
  if (lastId) q.set('last_event_id', lastId);
  openedWish = wish;
  liveStats.query = wish;
  const qs = q.toString();
  es = new EventSource(withToken('/api/stream' + (qs ? '?' + qs : '')));
  es.onopen = () => { retryMs = 500; setState('open'); };
  es.onerror = () => {
    setState('down');
    if (es.readyState === EventSource.CLOSED) {
      liveStats.reconnects++;
      timer = setTimeout(open, retryMs);
      retryMs = Math.min(retryMs * 2, 5000);
    }
  };
  const on = (type) => es.addEventListener(type, (ev) => {
    if (ev.lastEventId) lastId = ev.lastEventId;
    liveStats.bytes += ev.data.length;
    let data = null;
    try { data = JSON.parse(ev.data); } catch { return; }
    // alert events carry the run as run_id (in the event or in its alert object)
    if (data && typeof data === 'object' && data.run === undefined) {
      const rid = data.run_id ?? (data.alert && data.alert.run_id);
      if (rid !== undefined) data.run = rid;
    }
    if ((type === 'step' || type === 'tick') && data && data.run !== undefined) liveStats.lastStep[data.run] = data.step;
    if (type === 'tick' && data) {
      liveStats.ticks.push({run: data.run, from: data.from, step: data.step});
      if (liveStats.ticks.length > 100) liveStats.ticks.shift();
    }
    if (type === 'reset') liveStats.resets++;
    if (state !== 'open') setState('open');
    dispatch(type, data);
  });
  ['step', 'tick', 'layers', 'cells', 'run', 'alert', 'reset'].forEach(on);
}

/** f(type, data) for every event: step, tick, layers, cells, run, alert,
 * reset; and open ({after}) when the stream (re)connects, state ({state})
 * when its state changes. Returns an unsubscribe function. */
export function subscribe(f) {
  subs.add(f);
  if (!es) open();
  return () => subs.delete(f);
}

/** What the stream should carry (query parameters of /api/stream, e.g.
 * {run: 3, ticks: 1, layers: 1, cells: 'entropy_norm,entropy'}; {} for
 * every run's step events). Call before subscribe(); a change reopens the
 * stream where it left off. */
export function want(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  wish = q.toString();
  // a view switch sets {} and then its own wish: one reopen, not two
  queueMicrotask(() => { if (es && wish !== openedWish) open(); });
}

/** Closes the stream of a hidden tab (see above); shown again, open() resumes it. */
function pause() {
  if (!es || document.visibilityState !== 'hidden') return;
  clearTimeout(timer);
  clearTimeout(bannerTimer);
  es.close();
  es = null;
  paused = true;
  downSince = null;
  banner(false);
  setState('paused');
}
document.addEventListener('visibilitychange', () => {
  clearTimeout(hideTimer);
  if (document.visibilityState === 'hidden') hideTimer = setTimeout(pause, HIDE_MS);
  else if (paused) open();
});

/** 'open', 'connecting', 'down' or 'paused' (a hidden tab's). */
export function streamState() { return state; }

/** For tests: drops the connection as a daemon restart would. */
window.__live = {stats: liveStats, reconnect: () => open(), get state() { return state; }, set hideMs(ms) { HIDE_MS = ms; }};
