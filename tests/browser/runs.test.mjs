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
  check(counts[0] >= 100 && counts[1] >= 100, `both runs have points on the compare chart (${counts.join(', ')})`);
  await page.selectOption('#cmp-agg', 'min');
  await page.waitForFunction(() => new URL(location.href).searchParams.get('agg') === 'min' &&
    /line: min/.test(document.querySelector('#compare-body .chart[data-metric="entropy_norm"] .u-title')?.textContent || ''));
  check(true, 'compare line can be the minimum over heads (agg=min in the URL)');
  await screenshot(page, 'compare');
  check(page.errors.length === 0, 'no errors in the page', page.errors.join('; '));

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
