// dashboard.mjs: the dashboard benchmark (run by bench/dashboard.sh).
// Opens the run page of a seeded run in Debian's chromium and measures:
// - time to the first complete render (navigation start -> header, curves,
//   heatmap and every chart in the first screen drawn), several cold loads;
// - the same with every chart of the page loaded at once (?lazy=0);
// - the page's JS heap after load (CDP, after a GC);
// - the longest main-thread task during load (a frozen tab shows here);
// - scrubbing: the time from moving the step slider to the heatmap drawn;
// - the CPU time chromium and entropyd spend on a first render (/proc).
// usage: node bench/dashboard.mjs DATA_DIR RUN_ID LABEL [LOADS]
import fs from 'node:fs';
import {launch, startDaemon, sleep} from '../tests/browser/harness.mjs';

const [dataDir, runId, label, loadsArg] = process.argv.slice(2);
const LOADS = +(loadsArg || 5);
const pct = (a, p) => { const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };

/** CPU time (ms, user + system) per process descended from this one:
 * chromium's browser, renderer, GPU and network processes and entropyd.
 * Unlike wall time, it hardly grows when other work shares the CPUs. */
function cpuSnap() {
  const procs = new Map();
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const st = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      const cmd = fs.readFileSync(`/proc/${d}/cmdline`, 'utf8');
      const type = (/--type=([a-z-]+)/.exec(cmd) || [])[1] || (/chrom/.test(cmd) ? 'browser' : 'other');
      procs.set(+d, {ppid: +f[1], cpu: (+f[11] + +f[12]) * 10, type});   // clock ticks of 10 ms
    } catch { /* gone */ }
  }
  const mine = new Map(), seen = new Set([process.pid]);
  let grew = true;
  while (grew) {
    grew = false;
    for (const [pid, p] of procs) if (!seen.has(pid) && seen.has(p.ppid)) { seen.add(pid); mine.set(pid, p); grew = true; }
  }
  return mine;
}
/** CPU used between two snapshots: {total, daemon} in ms (processes that
 * exited in between are left out; new ones count from zero). */
function cpuDelta(a, b, daemonPid) {
  const out = {total: 0, daemon: 0, by: {}};
  for (const [pid, p] of b) {
    const d = p.cpu - (a.has(pid) ? a.get(pid).cpu : 0);
    out.total += d;
    const k = pid === daemonPid ? 'entropyd' : p.type;
    out.by[k] = (out.by[k] || 0) + d;
    if (pid === daemonPid) out.daemon += d;
  }
  return out;
}

const d = await startDaemon({dataDir});
const browser = await launch();
try {
  async function load(query) {
    const ctx = await browser.newContext({viewport: {width: 1400, height: 900}});
    const page = await ctx.newPage();
    let requests = 0;
    page.on('request', (r) => { if (r.url().includes('/api/')) requests++; });
    await page.addInitScript(() => {
      window.__longest = 0;
      try {
        new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__longest = Math.max(window.__longest, e.duration); })
          .observe({type: 'longtask', buffered: true});
      } catch { /* no longtask support */ }
    });
    const c0 = cpuSnap();
    await page.goto(`${d.base}/?run=${runId}${query}`);
    await page.waitForFunction(() => window.__render && window.__render.complete, null, {timeout: 60000});
    const cpu = cpuDelta(c0, cpuSnap(), d.proc.pid);
    const r = await page.evaluate(() => ({ms: window.__render.completeAt, charts: window.__render.charts, marks: window.__render.marks,
                                          longest: window.__longest, cells: window.__heatmap && window.__heatmap.values.flat().length}));
    r.requests = requests;
    r.cpu = cpu;
    r.page = page; r.ctx = ctx;
    return r;
  }

  // baseline: the CPU a new tab costs chromium for a trivial page (process
  // start-up, compositing), to tell the dashboard's own share
  const base = [];
  for (let i = 0; i < 3; i++) {
    const ctx = await browser.newContext({viewport: {width: 1400, height: 900}});
    const page = await ctx.newPage();
    const c0 = cpuSnap();
    await page.goto(`${d.base}/healthz`);
    await page.waitForLoadState('load');
    await sleep(50);
    base.push(cpuDelta(c0, cpuSnap(), d.proc.pid).total);
    await ctx.close();
  }
  const cold = [], inits = [], cpus = [], dcpus = [];
  let first;
  for (let i = 0; i < LOADS; i++) {
    const r = await load('');
    cold.push(r.ms);
    cpus.push(r.cpu.total);
    dcpus.push(r.cpu.daemon);
    const init = r.marks && r.marks.find((m) => m[0] === 'init');
    if (init) inits.push(init[1]);
    if (i === 0) first = r; else await r.ctx.close();
  }
  console.log(`dashboard ${label}: first complete render (header, curves, heatmap, first screen of charts): ` +
              `median ${pct(cold, 0.5).toFixed(0)} ms (min ${Math.min(...cold).toFixed(0)}, max ${Math.max(...cold).toFixed(0)}) over ${LOADS} cold loads ` +
              `(target <= 1000 ms); ${first.charts} charts, ${first.cells} heatmap cells, ${first.requests} API requests`);
  console.log(`dashboard ${label}: longest main-thread task during the first load: ${first.longest.toFixed(0)} ms`);
  console.log(`dashboard ${label}: CPU time to the first complete render (a figure the machine's load hardly ` +
              `inflates; 10 ms ticks): median ${pct(cpus, 0.5).toFixed(0)} ms for chromium + entropyd ` +
              `(min ${Math.min(...cpus)}, max ${Math.max(...cpus)}), of which entropyd ${pct(dcpus, 0.5).toFixed(0)} ms; ` +
              `first load by process: ${Object.entries(first.cpu.by).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(', ')}; ` +
              `a new tab showing a trivial page (/healthz) costs ${pct(base, 0.5)} ms`);
  if (inits.length) console.log(`dashboard ${label}: page and modules loaded (view starts), median ${pct(inits, 0.5).toFixed(0)} ms`);
  if (first.marks) console.log(`dashboard ${label}: first load timeline (ms since navigation): ` +
                               first.marks.map(([w, t]) => `${w} ${t}`).join(', '));

  // heap after load, after a GC, through the DevTools protocol
  const cdp = await first.ctx.newCDPSession(first.page);
  await cdp.send('HeapProfiler.enable');
  await cdp.send('HeapProfiler.collectGarbage');
  await cdp.send('Performance.enable');
  const mets = Object.fromEntries((await cdp.send('Performance.getMetrics')).metrics.map((m) => [m.name, m.value]));
  console.log(`dashboard ${label}: JS heap after load: ${(mets.JSHeapUsedSize / 1048576).toFixed(1)} MB used ` +
              `(${(mets.JSHeapTotalSize / 1048576).toFixed(1)} MB allocated), ${mets.Nodes} DOM nodes`);

  // scrubbing: slider to a step, until the heatmap shows that step
  const page = first.page;
  const [lo, hi] = await page.$eval('#hm-scrub', (e) => [+e.min, +e.max]);
  const lat = [];
  for (let i = 0; i < 40; i++) {
    const s = Math.round(lo + ((hi - lo) * (i * 37 % 40)) / 40);
    const t = await page.evaluate(async (s) => {
      const t0 = performance.now();
      const e = document.querySelector('#hm-scrub');
      e.value = s; e.dispatchEvent(new Event('input', {bubbles: true}));
      while (!(window.__heatmap && window.__heatmap.step === s)) await new Promise((r) => requestAnimationFrame(r));
      return performance.now() - t0;
    }, s);
    lat.push(t);
  }
  console.log(`dashboard ${label}: scrub to a step -> heatmap drawn: p50 ${pct(lat, 0.5).toFixed(1)} ms, ` +
              `p99 ${pct(lat, 0.99).toFixed(1)} ms (${lat.length} moves, includes the frame request)`);

  // zoom: refetch of every loaded chart for a narrow range
  const tz = await page.evaluate(async (mid) => {
    const t0 = performance.now();
    window.__render.complete = false;
    const v = document.querySelector('.chart').__chart;
    v.o.onZoom(mid - 500, mid + 500);
    while (window.__render && document.querySelector('.range-txt').dataset.zoomed !== '1') await new Promise((r) => setTimeout(r, 5));
    // wait for the reloads to settle: no API request pending for 3 frames
    let quiet = 0;
    while (quiet < 3) { await new Promise((r) => requestAnimationFrame(r)); quiet = window.__net.pending === 0 ? quiet + 1 : 0; }
    return performance.now() - t0;
  }, Math.round((lo + hi) / 2));
  console.log(`dashboard ${label}: zoom to 1,000 steps -> every loaded chart refetched and drawn: ${tz.toFixed(0)} ms`);
  await first.ctx.close();

  // every chart of the page at once
  const all = await load('&lazy=0');
  console.log(`dashboard ${label}: whole page with every chart loaded at once (?lazy=0): ${all.ms.toFixed(0)} ms, ` +
              `${all.charts} charts, ${all.requests} API requests, longest task ${all.longest.toFixed(0)} ms`);
  await all.ctx.close();
} finally {
  await browser.close();
  await d.stop();
}
await sleep(10);
