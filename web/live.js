// live.js: one Server-Sent Events connection to /api/stream for the whole
// page, shared by the views through subscribe(). The browser's EventSource
// reconnects by itself and sends Last-Event-ID, so a daemon restart or a
// network blip resumes with no gap (entropyd replays from its ring). When
// the daemon cannot replay (restarted: new event ids; or we were away
// longer than its ring), it sends `reset` and the views reload from the REST
// API. When the browser gives up (EventSource CLOSED, e.g. after a non-200
// answer during a restart) we open a new one ourselves, with backoff, and
// pass the last id as ?last_event_id=.
import {withToken} from './api.js';

const subs = new Set();
let es = null, lastId = '', retryMs = 500, timer = null, state = 'connecting';
export const liveStats = {events: 0, resets: 0, reconnects: 0, lastStep: {}};

function setState(s) {
  state = s;
  const el = document.getElementById('live-state');
  if (el) {
    el.dataset.state = s;
    el.title = {open: 'live: connected to the event stream', connecting: 'connecting to the event stream…',
                down: 'event stream lost: reconnecting…'}[s] || s;
    el.querySelector('.txt').textContent = {open: 'live', connecting: 'connecting', down: 'reconnecting'}[s] || s;
  }
}

function dispatch(type, data) {
  liveStats.events++;
  for (const f of subs) {
    try { f(type, data); } catch (e) { console.error('live subscriber', e); }
  }
}

function open() {
  clearTimeout(timer);
  if (es) es.close();
  setState(state === 'open' ? 'connecting' : state);
  const path = '/api/stream' + (lastId ? '?last_event_id=' + encodeURIComponent(lastId) : '');
  es = new EventSource(withToken(path));
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
    let data = null;
    try { data = JSON.parse(ev.data); } catch { return; }
    // alert events carry the run as run_id (in the event or in its alert object)
    if (data && typeof data === 'object' && data.run === undefined) {
      const rid = data.run_id ?? (data.alert && data.alert.run_id);
      if (rid !== undefined) data.run = rid;
    }
    if (type === 'step' && data && data.run !== undefined) liveStats.lastStep[data.run] = data.step;
    if (type === 'reset') liveStats.resets++;
    if (state !== 'open') setState('open');
    dispatch(type, data);
  });
  ['step', 'run', 'alert', 'reset'].forEach(on);
}

/** f(type, data) for every event: step, run, alert, reset. Returns an
 * unsubscribe function. */
export function subscribe(f) {
  subs.add(f);
  if (!es) open();
  return () => subs.delete(f);
}

/** For tests: drops the connection as a daemon restart would. */
window.__live = {stats: liveStats, reconnect: () => open(), get state() { return state; }};
