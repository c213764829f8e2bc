// runs.test.mjs: the runs list of a seeded entropyd — every run with its
// status and σReparam flag; live updates from the event stream (a streamed
// step within 1 s, a status change, a new run); then the compare view of
// two runs, reached by ticking them.
import {check, launch, newPage, rendered, run, screenshot, seedRun, startDaemon, stepMsg} from './harness.mjs';

await run(async (ctx) => {
  const d = await startDaemon();
  ctx.cleanups.push(() => d.stop());
  const base = await seedRun(d.sock, 'baseline-post-lr1e-2', {L: 4, H: 4, steps: 300, meta: {reparam: 'none', norm: 'post'}, collapse: true});
  const sig = await seedRun(d.sock, 'sigma-post-lr1e-2', {L: 4, H: 4, steps: 300, meta: {reparam: 'sigma', norm: 'post'}, status: 'live'});
  ctx.cleanups.push(() => sig.trainer.close());
  const bad = await seedRun(d.sock, 'diverged', {L: 4, H: 4, steps: 50, meta: {}, status: 'failed'});
  const browser = await launch();
  ctx.cleanups.push(() => browser.close());
  const page = await newPage(browser);

  await page.goto(d.base + '/');
  await rendered(page);
  // the list's first screen waits for neither the charts' modules nor uPlot,
  // and takes its runs from the one request index.html started
  const loaded = await page.evaluate(() => ({files: performance.getEntriesByType('resource').map((e) => new URL(e.name).pathname),
    requests: window.__net.requests}));
  const chartFiles = loaded.files.filter((f) => /(run|compare|charts|heatmap|uPlot\.iife\.min)\.js$/.test(f));
  check(chartFiles.length === 0 && loaded.files.filter((f) => f === '/api/runs').length === 1 && loaded.requests === 1,
    'the runs list loads no chart code and asks for its page once', JSON.stringify(loaded));
  const rows = await page.$$eval('#runs-table tbody tr', (trs) => trs.map((tr) => ({
    id: +tr.dataset.run, status: tr.dataset.status, name: tr.querySelector('.run-link').textContent,
    reparam: tr.querySelector('.reparam').dataset.reparam, step: tr.querySelector('.step').textContent})));
  const by = Object.fromEntries(rows.map((r) => [r.id, r]));
  const api = await d.api('/api/runs');
  check(rows.length === 3 && api.length === 3, `runs list shows the ${api.length} runs of the daemon`, JSON.stringify(rows));
  check(by[base.id] && by[base.id].status === 'finished' && by[sig.id].status === 'live' && by[bad.id].status === 'failed',
    'statuses: finished, live, failed');
  check(by[sig.id].reparam === 'sigma' && by[base.id].reparam === 'none' && by[bad.id].reparam === 'unknown',
    'σReparam column from the run meta (sigma / none / unknown)');
  check(by[base.id].step === '299', 'last step of a finished run');
  await page.waitForFunction((id) => document.querySelector(`tr[data-run="${id}"] .loss`).textContent !== '—', sig.id);
  // the verdict column: the daemon's verdict, coloured by it; the
  // run that ended failed is diverged
  const verdicts = await page.$$eval('#runs-table tbody tr', (trs) => trs.map((tr) => ({
    id: +tr.dataset.run, v: tr.dataset.verdict, cls: tr.querySelector('.verdict-cell .badge').className})));
  const apiV = Object.fromEntries(api.map((r) => [r.id, r.verdict.state]));
  check(verdicts.every((x) => x.v === apiV[x.id] && x.cls.includes('v-' + x.v)) &&
    verdicts.find((x) => x.id === bad.id).v === 'diverged',
    'verdict column: the daemon\'s verdict per run, coloured (the failed run diverged)', JSON.stringify(verdicts));
  // filters go to the daemon: one request for the page, no frame requests
  let n0 = await page.evaluate(() => window.__net.requests);
  await page.selectOption('#runs-verdict', 'diverged');
  await page.waitForFunction(() => [...document.querySelectorAll('#runs-table tbody tr')].length === 1);
  let n1 = await page.evaluate(() => window.__net.requests);
  const only = await page.$eval('#runs-table tbody tr', (tr) => +tr.dataset.run);
  check(only === bad.id && n1 - n0 === 1 && new URL(page.url()).searchParams.get('verdict') === 'diverged',
    `verdict filter: only the diverged run, in ${n1 - n0} request (target 1), kept in the URL`);
  await page.selectOption('#runs-verdict', '');
  // the unfiltered list first: until it arrives the table still shows the
  // one diverged run, which a wait for "one row" would take for the search's
  await page.waitForFunction(() => document.querySelectorAll('#runs-table tbody tr').length === 3);
  await page.fill('#runs-search', 'SIGMA-post');
  await page.waitForFunction((id) => {
    const trs = document.querySelectorAll('#runs-table tbody tr');
    return trs.length === 1 && +trs[0].dataset.run === id;
  }, sig.id, {timeout: 10000}).catch(() => {});
  check(await page.$eval('#runs-table tbody tr', (tr) => +tr.dataset.run) === sig.id, 'name search (case-insensitive, by the daemon)');
  await page.fill('#runs-search', '');
  await page.waitForFunction(() => document.querySelectorAll('#runs-table tbody tr').length === 3);

  // live: a step, then the end of the run, then a new run
  const t0 = Date.now();
  sig.trainer.send([stepMsg(1000, 4, 4)]);
  await page.waitForFunction((id) => document.querySelector(`tr[data-run="${id}"] .step`).textContent === '1,000', sig.id, {timeout: 3000});
  const ms = Date.now() - t0;
  check(ms <= 1000, `a streamed step shows in the runs list ${ms} ms after it was sent`, 'target <= 1000 ms');
  sig.trainer.send([{type: 'end', status: 'finished'}]);
  await page.waitForFunction((id) => document.querySelector(`tr[data-run="${id}"]`).dataset.status === 'finished', sig.id, {timeout: 3000});
  check(true, 'a run that ends turns finished without reloading');
  const fresh = await seedRun(d.sock, 'fresh', {L: 2, H: 2, steps: 5, status: 'live'});
  ctx.cleanups.push(() => fresh.trainer.close());
  await page.waitForFunction((id) => !!document.querySelector(`tr[data-run="${id}"]`), fresh.id, {timeout: 3000});
  check(true, 'a new run appears without reloading');
  await screenshot(page, 'runs-list');

  // compare: tick two runs and press the button
  await page.check(`tr[data-run="${base.id}"] input[type=checkbox]`);
  await page.check(`tr[data-run="${sig.id}"] input[type=checkbox]`);
  await page.click('text=Compare selected');
  await page.waitForFunction(() => new URL(location.href).searchParams.get('view') === 'compare');
  await rendered(page);
  await page.waitForFunction(() => document.querySelectorAll('#compare-body .chart .u-over').length >= 2);
  const charts = await page.$$eval('#compare-body .chart', (els) => els.map((e) => ({
    metric: e.dataset.metric, runs: e.dataset.runs,
    legend: [...e.querySelectorAll('.u-legend .u-series:not(.band-edge) .u-label')].map((x) => x.textContent)})));
  const ent = charts.find((c) => c.metric === 'entropy_norm'), loss = charts.find((c) => c.metric === 'loss');
  const two = (c) => c && c.runs === `${base.id},${sig.id}` && c.legend.some((x) => x.startsWith('baseline-post-lr1e-2')) &&
    c.legend.some((x) => x.startsWith('sigma-post-lr1e-2'));
  check(two(ent) && two(loss), 'compare view overlays both runs on the entropy_norm and loss charts', JSON.stringify(charts));
  // each run's line has data: columns 1 and 4 (line, max, min per run)
  const counts = await page.evaluate(() => {
    const c = document.querySelector('#compare-body .chart[data-metric="entropy_norm"]').__chart;
    return [1, 4].map((i) => c.data[i].filter((v) => v !== null && v !== undefined).length);
  });
  // both runs are asked for the same range (0 to the live run's step 1,000), so the shorter one has fewer buckets
  check(counts[0] >= 40 && counts[1] >= 40, `both runs have points on the compare chart (${counts.join(', ')})`);
  await page.selectOption('#cmp-agg', 'min');
  await page.waitForFunction(() => new URL(location.href).searchParams.get('agg') === 'min' &&
    /line: min/.test(document.querySelector('#compare-body .chart[data-metric="entropy_norm"] .u-title')?.textContent || ''));
  check(true, 'compare line can be the minimum over heads (agg=min in the URL)');
  await screenshot(page, 'compare');
  check(page.errors.length === 0, 'no errors in the page', page.errors.join('; '));

  // paging: 105 more runs; the first page shows 100, "older" the rest, each one request
  for (let i = 0; i < 105; i++) await seedRun(d.sock, `bulk-${String(i).padStart(3, '0')}`, {L: 2, H: 2, steps: 1});
  const pp = await newPage(browser);
  await pp.goto(d.base + '/?sort=name&order=asc');
  await rendered(pp);
  const first = await pp.$$eval('#runs-table tbody tr .run-link', (a) => a.map((x) => x.textContent));
  n0 = await pp.evaluate(() => window.__net.requests);
  await pp.click('#runs-next');
  await pp.waitForFunction(() => document.querySelectorAll('#runs-table tbody tr').length < 100);
  n1 = await pp.evaluate(() => window.__net.requests);
  const second = await pp.$$eval('#runs-table tbody tr .run-link', (a) => a.map((x) => x.textContent));
  const all = [...first, ...second];
  check(first.length === 100 && all.length === 109 && new Set(all).size === 109 &&
    all.every((x, i) => i === 0 || all[i - 1] <= x) && n1 - n0 === 1,
    `paged by name: ${first.length} + ${second.length} runs, sorted, no repeats, ${n1 - n0} request for the page`,
    /of 109 runs/.test(await pp.textContent('#runs-count')) ? '' : await pp.textContent('#runs-count'));
  await pp.click('#runs-prev');
  await pp.waitForFunction(() => document.querySelectorAll('#runs-table tbody tr').length === 100);
  check(true, '"newer" goes back to the first page');
  await pp.close();

  // a daemon with --token: the page works when opened with ?token=, and says
  // what is missing without it
  const dt = await startDaemon({extra: ['--token', 's3cret']});
  ctx.cleanups.push(() => dt.stop());
  await seedRun(dt.sock, 'guarded', {L: 2, H: 2, steps: 20, token: 's3cret'});
  const pt = await newPage(browser);
  await pt.goto(dt.base + '/?token=s3cret');
  await rendered(pt);
  await pt.waitForSelector('#runs-table tbody tr');
  const n = await pt.$$eval('#runs-table tbody tr', (t) => t.length);
  await pt.click('.run-link');
  await rendered(pt);
  const hm = await pt.waitForFunction(() => window.__heatmap && window.__heatmap.layers === 2).then(() => true, () => false);
  check(n === 1 && hm && new URL(pt.url()).searchParams.get('token') === 's3cret',
    'with --token, /?token=T lists the run and its page loads (the token follows the links)');
  await pt.goto(dt.base + '/');
  await pt.waitForFunction(() => /token/.test(document.querySelector('.empty')?.textContent || ''));
  check(true, 'without the token the runs list says a token is needed');
  await pt.close();
}, {timeoutMs: 60000});
