// many_runs.mjs: the runs page's first render (run by bench/many_runs.py).
// Cold loads of the runs list in Debian's chromium: navigation start to the
// page's first complete render (window.__render.completeAt), and the API
// requests the page made. Prints {median, p90, loads, requests} as JSON.
// usage: node bench/many_runs.mjs URL [LOADS]
import {launch} from '../tests/browser/harness.mjs';

const [url, loadsArg] = process.argv.slice(2);
const LOADS = +(loadsArg || 5);
const browser = await launch();
try {
  const times = [];
  let requests = 0;
  for (let i = 0; i < LOADS; i++) {
    const ctx = await browser.newContext({viewport: {width: 1400, height: 900}});
    const page = await ctx.newPage();
    await page.goto(url);
    await page.waitForFunction(() => window.__render && window.__render.complete, null, {timeout: 60000});
    const r = await page.evaluate(() => ({t: window.__render.completeAt, n: window.__net.requests,
      rows: document.querySelectorAll('#runs-table tbody tr').length}));
    if (!r.rows) throw new Error('the runs page rendered no rows');
    times.push(r.t);
    requests = r.n;
    await ctx.close();
  }
  times.sort((a, b) => a - b);
  console.log(JSON.stringify({median: times[Math.floor(times.length / 2)], p90: times[Math.min(times.length - 1, Math.floor(0.9 * times.length))],
    loads: times, requests}));
} finally {
  await browser.close();
}
