// budget.js: the page's budget for background requests. A live run page
// refetches on its own now and then — the verdict (after alerts, and a
// poll), the head chart when the worst heads change, the collapse timeline
// when its live columns outnumber its buckets, a chart once its appended
// points outnumber its buckets. Each alone was limited, together they made
// 9 requests a minute; they now all go through ask(), which lets at most
// one of them start per SLOT_MS (10 s), whatever their kinds.
//
// - An ask is keyed ('run3:verdict', 'run3:chart:5'): asking again for a
//   key that waits merges into it (the latest function runs, once), so a
//   burst of alerts or of cells events is one request.
// - The oldest ask goes first, but an urgent one (a verdict check an alert
//   event asked for) goes before the others.
// - Nothing is dropped: an ask waits for a later slot. served(key) takes
//   one off when the same thing was fetched at once meanwhile (the user
//   zoomed, a reload), forget(prefix) the asks of a view that went away.
// - What the user asks for (a click, a zoom, a metric) does not go through
//   here: it goes at once, and does not use up a slot.
//
// A budgeted function should start one request (the head chart's worst
// heads are the exception: one series per head, in parallel).
const SLOT_MS = 10000;
const asks = new Map();   // key -> {fn, at, urgent}, in the order asked
let lastStart = -Infinity, timer = null;
// for tests: what started when (performance.now()), and how many asks were merged
export const budgetStats = {starts: [], merged: 0};

function next() {
  let pick = null;
  for (const [k, a] of asks) {
    if (a.urgent) { pick = k; break; }
    if (pick === null) pick = k;
  }
  return pick;
}

function schedule() {
  if (timer !== null || !asks.size) return;
  timer = setTimeout(run, Math.max(0, lastStart + SLOT_MS - performance.now()));
}

function run() {
  timer = null;
  const k = next();
  if (k === null) return;
  const a = asks.get(k);
  asks.delete(k);
  lastStart = performance.now();
  budgetStats.starts.push({key: k, at: lastStart, waited: lastStart - a.at});
  if (budgetStats.starts.length > 200) budgetStats.starts.shift();
  try { a.fn(); } catch (e) { console.error('budgeted request', e); }
  schedule();
}

/** Asks for fn() to run in a free slot; {urgent: true} puts it before the
 * others. A key already waiting is merged (the new fn replaces the old). */
export function ask(key, fn, {urgent = false} = {}) {
  const a = asks.get(key);
  if (a) { a.fn = fn; a.urgent ||= urgent; budgetStats.merged++; }
  else asks.set(key, {fn, at: performance.now(), urgent});
  schedule();
}

/** The thing asked for under key was fetched outside the budget: no need to wait for it. */
export function served(key) { asks.delete(key); }

/** Whether an ask is waiting under key. */
export function waiting(key) { return asks.has(key); }

/** Takes off every ask whose key starts with prefix (a view destroyed). */
export function forget(prefix) {
  for (const k of [...asks.keys()]) if (k.startsWith(prefix)) asks.delete(k);
}

window.__budget = {stats: budgetStats, get waiting() { return [...asks.keys()]; }, SLOT_MS};
