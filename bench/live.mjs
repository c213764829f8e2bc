// live.mjs: the browser bench of the live pages (run by bench/live.sh), against
// real entropyd daemons and Debian's chromium:
// 1. one run page left open on a live 12x12x9 run (12 layers, 12 heads, 9
//    head metrics) logging 10 steps/s: HTTP requests beside its event
//    stream and every byte received (CDP), per minute;
// 2. the runs list while that run collapses: requests (page loads, row
//    re-reads) and bytes per minute;
// 3. the daemon's CPU with 20 such run pages open, beside the same minute
//    with none open (the ingest alone);
// 4. the cold first complete render of a 100k-step 12x12x9 run at
//    1440x900, median of LOADS fresh browser contexts;
// 5. the compare view's first complete render of 10 runs with 10,000 runs
//    stored, median of LOADS fresh contexts.
// usage: node bench/live.mjs BIG_DB MANY_DB   (the databases bench/live.sh
// seeds and caches; copied before use). LIVE_WINDOW_MS (60000; at least
// 10000) sets the measuring windows (the CPU window is at most 30 s). The
// bar's counts are fixed: 20 pages open for 3, the median of 5 fresh
// contexts for 4 and 5 (LOADS may ask for more, never fewer).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {launch, seedRun, sleep, startDaemon, stepMsg} from '../tests/browser/harness.mjs';

const [bigDb, manyDb] = process.argv.slice(2);
const WINDOW = Math.max(10000, +(process.env.LIVE_WINDOW_MS || 60000));
const TABS = 20;
const LOADS = Math.max(5, Math.round(+(process.env.LOADS || 5)) || 5);
const L = 12, H = 12;
const median = (a) => { const s = [...a].sort((x, y) => x - y), n = s.length; return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2; };
const out = (s) => console.log('live: ' + s);

/** stepMsg's 7 head metrics plus logit_scale and attn_sink: 9, as a
 * sigmatrain-like trainer logging every head metric sends. */
function step9(s, opts) {
  const m = stepMsg(s, L, H, opts);
  m.heads.logit_scale = m.heads.max_logit.map((r) => r.map((v) => Math.fround(v * 1.3)));
  m.heads.attn_sink = m.heads.entropy_norm.map((r) => r.map((v) => Math.fround(1 - v)));
  return m;
}

/** A step every 100 ms from `from` on, until stop(). */
function pace(trainer, from, opts = {}) {
  let step = from;
  const timer = setInterval(() => trainer.send([step9(step++, opts)]), 100);
  return {stop: () => clearInterval(timer), get step() { return step; }};
}

/** "path x count, ..." of a list of URLs (their query strings dropped). */
function summarize(urls) {
  const n = new Map();
  for (const u of urls) { const k = new URL(u).pathname; n.set(k, (n.get(k) || 0) + 1); }
  return [...n].map(([k, c]) => `${k} x${c}`).join(', ') || 'none';
}

/** Counts a page's requests (its event stream aside) and every byte it
 * receives, encoded, headers and the stream included (CDP). */
async function meter(page) {
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Network.enable');
  const m = {requests: [], bytes: 0, on: false};
  cdp.on('Network.requestWillBeSent', (e) => { if (m.on && !/\/api\/stream/.test(e.request.url)) m.requests.push(e.request.url); });
  cdp.on('Network.dataReceived', (e) => { if (m.on) m.bytes += e.encodedDataLength || e.dataLength; });
  cdp.on('Network.responseReceived', (e) => { if (m.on) m.bytes += (e.response.encodedDataLength || 0); });
  return m;
}

/** CPU seconds (user + system) the process has used. */
function cpuOf(pid) {
  const st = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
  return (+f[11] + +f[12]) / 100;
}

/** A copy of a seeded database in a new data dir (the daemon may migrate or
 * checkpoint it; the cache stays as seeded). */
function copyDb(db) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'entropyd-live-'));
  fs.copyFileSync(db, path.join(dir, 'entropyd.db'));
  return dir;
}

/** Median first complete render of url over LOADS fresh contexts at 1440x900. */
async function coldLoads(browser, url) {
  const ms = [];
  let first = null;
  for (let i = 0; i < LOADS; i++) {
    const ctx = await browser.newContext({viewport: {width: 1440, height: 900}});
    const page = await ctx.newPage();
    let bytes = 0, requests = 0;
    page.on('requestfinished', async (r) => {
      requests++;
      try { const s = await r.sizes(); bytes += s.responseBodySize + s.responseHeadersSize; } catch { /* gone */ }
    });
    await page.goto(url);
    await page.waitForFunction(() => window.__render && window.__render.complete, null, {timeout: 60000});
    const r = await page.evaluate(() => ({t: window.__render.completeAt, charts: window.__render.charts, api: window.__net.requests}));
    ms.push(r.t);
    if (!first) first = {...r, requests, bytes};
    await ctx.close();
  }
  return {median: median(ms), min: Math.min(...ms), max: Math.max(...ms), first};
}

const browser = await launch();
const dirs = [];
const daemons = [];
try {
  /* ---- 1-3: a live 12x12x9 run ------------------------------------------ */
  const d = await startDaemon();
  daemons.push(d);
  const {id, trainer} = await seedRun(d.sock, 'live-12x12x9', {L, H, steps: 300, status: 'live'});
  const tab = await browser.newPage({viewport: {width: 1440, height: 900}});
  const m = await meter(tab);
  await tab.goto(`${d.base}/?run=${id}`);
  await tab.waitForFunction(() => window.__render && window.__render.complete, null, {timeout: 30000});
  let p = pace(trainer, 300);
  await tab.waitForFunction(() => window.__live.state === 'open' && window.__heatmap && window.__heatmap.step >= 320, null, {timeout: 20000});
  // the first loads are done: the steady state, with no more waiting than
  // until no request is pending
  await tab.waitForFunction(() => window.__net.pending === 0, null, {timeout: 20000});
  m.on = true;
  let t0 = Date.now();
  await sleep(WINDOW);
  m.on = false;
  let secs = (Date.now() - t0) / 1000;
  out(`one live run page (12x12x9, 10 steps/s) over ${secs.toFixed(0)} s: ${(m.requests.length * 60 / secs).toFixed(1)} requests/min ` +
      `beside its stream (target <= 6), ${(m.requests.length * 10 / secs).toFixed(1)} per 10 s (target <= 1), ` +
      `${(m.bytes * 60 / secs / 1024).toFixed(1)} KB/min received in all (target <= 200)`);
  out(`  its requests: ${summarize(m.requests)}`);
  await tab.close();

  const list = await browser.newPage({viewport: {width: 1440, height: 900}});
  const lm = await meter(list);
  await list.goto(`${d.base}/`);
  await list.waitForFunction(() => window.__render && window.__render.complete && window.__live.state === 'open', null, {timeout: 30000});
  p.stop();
  lm.on = true;
  t0 = Date.now();
  p = pace(trainer, p.step, {collapse: true, collapseAt: p.step});
  await sleep(WINDOW);
  lm.on = false;
  secs = (Date.now() - t0) / 1000;
  const row = await list.evaluate((id) => { const tr = document.querySelector(`tr[data-run="${id}"]`); return tr && {verdict: tr.dataset.verdict, alerts: tr.querySelector('.alerts').textContent}; }, id);
  const alerts = await d.api(`/api/runs/${id}/alerts`);
  const pages = lm.requests.filter((u) => /\/api\/runs\?/.test(u)).length, rows = lm.requests.filter((u) => /\/api\/runs\/\d+$/.test(u)).length;
  out(`runs list while the run collapses (${alerts.length} alert episodes, row now ${row && row.verdict}, ${row && row.alerts} firing) over ${secs.toFixed(0)} s: ` +
      `${(lm.requests.length * 60 / secs).toFixed(1)} requests/min (${pages} page loads, ${rows} row re-reads), ${(lm.bytes * 60 / secs / 1024).toFixed(1)} KB/min`);
  await list.close();
  p.stop();

  // the daemon's CPU over a window: with no page open, then with TABS
  const CPU_WINDOW = Math.min(WINDOW, 30000);
  const cpuWindow = async () => {
    const c0 = cpuOf(d.proc.pid), w0 = Date.now();
    await sleep(CPU_WINDOW);
    return (cpuOf(d.proc.pid) - c0) / ((Date.now() - w0) / 1000);
  };
  p = pace(trainer, p.step);
  await sleep(2000);
  const idle = await cpuWindow();
  // a browser context per page, as 20 people each with their own browser:
  // one browser holds at most 6 connections to a host, and each page's
  // event stream keeps one, so a 7th tab of one browser never loads
  const ctxs = [], tabs = [];
  for (let i = 0; i < TABS; i++) {
    const c = await browser.newContext({viewport: {width: 1440, height: 900}});
    ctxs.push(c);
    const t = await c.newPage();
    await t.goto(`${d.base}/?run=${id}`, {timeout: 60000});
    tabs.push(t);
  }
  for (const t of tabs) await t.waitForFunction(() => window.__render && window.__render.complete, null, {timeout: 60000});
  await sleep(3000);
  const busy = await cpuWindow();
  const open = await Promise.all(tabs.map((t) => t.evaluate(() => window.__live.state)));
  out(`daemon CPU, live 12x12x9 run at 10 steps/s, over ${(CPU_WINDOW / 1000).toFixed(0)} s: ${(100 * busy).toFixed(1)}% of a core with ` +
      `${TABS} run pages open (${open.filter((s) => s === 'open').length} streams open) vs ${(100 * idle).toFixed(1)}% with none ` +
      `(${(100 * (busy - idle) / TABS).toFixed(2)}% a page)`);
  for (const c of ctxs) await c.close();
  p.stop();
  trainer.close();
  await d.stop();

  /* ---- 4: cold first render of a 100k-step 12x12x9 run --------------------- */
  const bigDir = copyDb(bigDb);
  dirs.push(bigDir);
  const db = await startDaemon({dataDir: bigDir});
  daemons.push(db);
  const big = (await db.api('/api/runs'))[0];
  const c = await coldLoads(browser, `${db.base}/?run=${big.id}`);
  out(`cold first render, ${big.name} (${big.layers}x${big.heads}, ${big.last_step + 1} steps, 9 head metrics) at 1440x900: ` +
      `median ${c.median.toFixed(0)} ms of ${LOADS} fresh contexts (min ${c.min.toFixed(0)}, max ${c.max.toFixed(0)}; target <= 1000); ` +
      `first load ${c.first.requests} requests, ${(c.first.bytes / 1024).toFixed(0)} KB, ${c.first.charts} charts`);
  await db.stop();

  /* ---- 5: compare with 10,000 runs stored ----------------------------- */
  const manyDir = copyDb(manyDb);
  dirs.push(manyDir);
  const dm = await startDaemon({dataDir: manyDir});
  daemons.push(dm);
  const total = (await dm.api('/api/runs?limit=1')).total;
  // the seeder's long runs (every 100th) and a few short ones
  const ids = [1, 101, 201, 301, 401, 5001, 5002, 9998, 9999, 10000].filter((x) => x <= total);
  const cm = await coldLoads(browser, `${dm.base}/?view=compare&runs=${ids.join(',')}`);
  out(`compare first render, ${ids.length} runs with ${total.toLocaleString('en-US')} stored, at 1440x900: median ${cm.median.toFixed(0)} ms ` +
      `of ${LOADS} fresh contexts (min ${cm.min.toFixed(0)}, max ${cm.max.toFixed(0)}; target < 1000); first load ${cm.first.api} API requests, ` +
      `${(cm.first.bytes / 1024).toFixed(0)} KB, ${cm.first.charts} charts drawn`);
  const pk = await coldLoads(browser, `${dm.base}/?view=compare`);
  out(`compare picker alone (no runs picked), ${total.toLocaleString('en-US')} stored: median ${pk.median.toFixed(0)} ms, ` +
      `${(pk.first.bytes / 1024).toFixed(0)} KB (the unpaged list would be ${((await (await fetch(dm.base + '/api/runs')).text()).length / 1048576).toFixed(1)} MB)`);
} finally {
  await browser.close();
  for (const x of daemons) await x.stop();
  for (const dir of dirs) fs.rmSync(dir, {recursive: true, force: true});
}
