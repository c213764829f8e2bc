// compare.test.mjs: compare and the runs list with 10,000 runs stored
// against a real entropyd and Debian's chromium.
// The runs are written straight into the database by
// build/bench/bench_many_runs_seed (a second or two), then two runs are
// streamed over the protocol, one of them collapsing, for alert markers.
// - the picker asks for pages of 20 (never the unpaged list), searches and
//   filters by status, verdict and meta through the daemon, pages on;
//   picking runs writes them to the URL; at most 10;
// - every metric the runs report has a chart, each run a line; alert
//   markers in the run's colour; smoothing changes the lines, not the band;
// - grouping by a meta key: one line per group, the mean of its runs, with
//   their min-max as band;
// - every setting round-trips through the URL (a reload shows the same),
//   and Back undoes a change of runs, of a chart setting, of a runs-list
//   filter, column or page;
// - the x axis: steps, wall time (each run on its own clock) and relative
//   time (since each run's first step), alert markers at their run's
//   times, the axis kept in the URL (x=, as on the run page) through a
//   reload, undone by Back; nothing overlaps at 1280x800;
// - the runs list's meta columns and meta filters.
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {Trainer, check, launch, newPage, rendered, repo, run, screenshot, seedRun, startDaemon, stepMsg} from './harness.mjs';

const BUILD = process.env.BUILD || 'build';

run(async (ctx) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'entropyd-cmp-'));
  ctx.cleanups.push(() => fs.rmSync(dir, {recursive: true, force: true}));
  execFileSync(path.join(repo, BUILD, 'bench', 'bench_many_runs_seed'), ['--db', path.join(dir, 'entropyd.db'), '--runs', '10000']);
  const d = await startDaemon({dataDir: dir});
  ctx.cleanups.push(() => d.stop());
  // two more, streamed: a collapsing baseline and its σReparam twin, same sweep
  const base = await seedRun(d.sock, 'cmp-baseline', {L: 2, H: 4, steps: 300, meta: {reparam: 'none', sweep: 'cmpX', lr: 0.01}, collapse: true, collapseAt: 20});
  const sig = await seedRun(d.sock, 'cmp-sigma', {L: 2, H: 4, steps: 300, meta: {reparam: 'sigma', sweep: 'cmpX', lr: 0.01}});
  const alerts = await d.api(`/api/runs/${base.id}/alerts`);
  const nAlerts = (Array.isArray(alerts) ? alerts : alerts.alerts || []).length;
  const browser = await launch();
  ctx.cleanups.push(() => browser.close());
  const page = await newPage(browser, {width: 1440, height: 900});
  const urls = [];
  page.on('request', (r) => { if (r.url().includes('/api/runs')) urls.push(new URL(r.url())); });
  const q = () => new URL(page.url()).searchParams;

  /* ---- the picker ------------------------------------------------------ */
  await page.goto(`${d.base}/?view=compare`);
  await rendered(page);
  const listReq = urls.filter((u) => u.pathname === '/api/runs');
  check(listReq.length >= 1 && listReq.every((u) => u.searchParams.get('limit') === '20'),
    `the picker asks for pages of 20, never the unpaged list (${listReq.map((u) => u.search).join(' ')})`);
  const count0 = await page.textContent('#cmp-pick-count');
  check(/of 10,002/.test(count0) && await page.$$eval('#cmp-pick-list .pick', (a) => a.length) === 20,
    `the picker shows 20 of the 10,002 runs ("${count0}")`);
  await page.click('#cmp-pick-next');
  await page.waitForFunction(() => /^21–40 /.test(document.querySelector('#cmp-pick-count').textContent));
  check(true, 'the picker pages on (21–40)');
  await page.fill('#cmp-pick-q', 'cmp-');
  await page.waitForFunction(() => document.querySelectorAll('#cmp-pick-list .pick').length === 2);
  const lastQ = urls.filter((u) => u.pathname === '/api/runs').pop();
  check(lastQ.searchParams.get('q') === 'cmp-' && !lastQ.searchParams.get('cursor') && q().get('pq') === 'cmp-',
    'search goes to the daemon (q=), back to the first page, and into the URL (pq)');
  await page.check(`#cmp-pick-list .pick[data-run="${base.id}"] input`);
  await page.check(`#cmp-pick-list .pick[data-run="${sig.id}"] input`);
  await page.waitForFunction(() => document.querySelectorAll('#compare-body .chart .u-over').length >= 2);
  check(q().get('runs') === `${base.id},${sig.id}`, `the picked runs are in the URL (runs=${q().get('runs')})`);
  // filters: verdict, status and meta, each by the daemon
  await page.fill('#cmp-pick-q', '');
  await page.selectOption('#cmp-pick-verdict', 'collapsed');
  await page.fill('#cmp-pick-meta', 'reparam=sigma, sweep=sweep3');
  await page.waitForFunction(() => /of 35$/.test(document.querySelector('#cmp-pick-count').textContent), null, {timeout: 5000}).catch(() => {});
  const fq = urls.filter((u) => u.pathname === '/api/runs').pop().searchParams;
  const apiN = (await d.api('/api/runs?limit=1&verdict=collapsed&meta.reparam=sigma&meta.sweep=sweep3')).total;
  check(fq.get('verdict') === 'collapsed' && fq.get('meta.reparam') === 'sigma' && fq.get('meta.sweep') === 'sweep3' &&
    (await page.textContent('#cmp-pick-count')).endsWith(`of ${apiN}`),
    `verdict and meta filters by the daemon: ${apiN} runs (${await page.textContent('#cmp-pick-count')})`);
  await page.selectOption('#cmp-pick-status', 'failed');
  await page.waitForFunction(() => document.querySelector('#cmp-pick-list').textContent.includes('No run matches'));
  check(true, 'a filter nothing matches says so');
  await page.selectOption('#cmp-pick-status', '');
  // pick 8 more, then the 11th box is disabled
  await page.selectOption('#cmp-pick-verdict', '');
  await page.fill('#cmp-pick-meta', '');
  await page.fill('#cmp-pick-q', 'sweep9');
  await page.waitForFunction(() => /of 1,000$/.test(document.querySelector('#cmp-pick-count').textContent));
  const boxes = await page.$$('#cmp-pick-list .pick input');
  for (let i = 0; i < 8; i++) await boxes[i].check();
  const dis = await page.$$eval('#cmp-pick-list .pick input', (a) => a.map((b) => b.disabled));
  check(q().get('runs').split(',').length === 10 && dis.slice(8).every(Boolean),
    `at most 10 runs: the rest of the boxes are disabled (${q().get('runs').split(',').length} picked)`);

  /* ---- the charts ------------------------------------------------------ */
  await page.waitForFunction(() => window.__render.complete);
  const info = await page.evaluate(() => [...document.querySelectorAll('#compare-body .chart')].map((e) => e.dataset.metric));
  const m1 = await d.api(`/api/runs/${base.id}`);
  const all = [...m1.metrics.scalars, ...m1.metrics.heads, ...m1.metrics.layers];
  check(all.every((m) => info.includes(m)) && info[0] === 'loss',
    `every metric has a chart, loss first (${info.length}: ${info.join(', ')})`);
  const ent = await page.evaluate(() => {
    const c = document.querySelector('#compare-body .chart[data-metric="entropy_norm"]').__chart;
    return {lines: c.defs.length, runs: c.el.dataset.runs, markers: c.o.markers(), pts: c.data[1].filter((v) => v != null).length};
  });
  check(ent.lines === 10 && ent.pts >= 50, `entropy_norm: a line per run (${ent.lines}), ${ent.pts} points for the first`);
  check(nAlerts > 0 && ent.markers.filter((m) => m.run === base.id).length === nAlerts && ent.markers.every((m) => m.run !== sig.id),
    `the collapsing run's ${nAlerts} alert(s) marked on the chart, in its colour; none for its twin`);
  // smoothing: the line changes, the band does not; kept in the URL
  const before = await page.evaluate(() => { const u = document.querySelector('#compare-body .chart[data-metric="loss"]').__chart.u; return [u.data[1].slice(), u.data[2].slice()]; });
  await page.$eval('#cmp-smooth', (e) => { e.value = '0.9'; e.dispatchEvent(new Event('input')); e.dispatchEvent(new Event('change')); });
  const after = await page.evaluate(() => { const u = document.querySelector('#compare-body .chart[data-metric="loss"]').__chart.u; return [u.data[1].slice(), u.data[2].slice()]; });
  check(JSON.stringify(before[0]) !== JSON.stringify(after[0]) && JSON.stringify(before[1]) === JSON.stringify(after[1]) && q().get('smooth') === '0.9',
    'smoothing changes the lines, not the bands, and goes into the URL');
  await screenshot(page, 'compare-10', {fullPage: false});

  /* ---- grouping ---------------------------------------------------------- */
  const n0 = urls.length;
  await page.selectOption('#cmp-group', 'reparam');
  await page.waitForFunction(() => document.querySelector('#compare-body .chart[data-metric="loss"]').dataset.groups === '2');
  const g = await page.evaluate(() => {
    const c = document.querySelector('#compare-body .chart[data-metric="loss"]').__chart;
    return {labels: c.defs.map((x) => x.label), data: c.data};
  });
  // the group's line is the mean of its runs' lines, its band their min and max
  const picked = q().get('runs').split(',').map(Number);
  const runsMeta = await Promise.all(picked.map((id) => d.api(`/api/runs/${id}`)));
  const none = runsMeta.filter((r) => r.meta.reparam === 'none');
  const lo = Math.min(...runsMeta.map((r) => r.first_step)), hi = Math.max(...runsMeta.map((r) => r.last_step));
  const pts = await page.evaluate(() => {
    const el = document.querySelector('#compare-body .chart[data-metric="loss"]');
    return el.clientWidth;
  });
  const P = Math.round(Math.max(Math.max(50, Math.min(2000, pts)) / 3, Math.min(Math.max(50, Math.min(2000, pts)), Math.ceil((hi - lo + 1) / 64))));
  const ser = await Promise.all(none.map((r) => d.api(`/api/runs/${r.id}/series?metric=loss&from=${lo}&to=${hi}&points=${P}`)));
  const s0 = ser[0].step[0];
  const vals = ser.map((x) => x.mean[x.step.indexOf(s0)]).filter((v) => v !== null && v !== undefined);
  const gi = g.labels.findIndex((l) => l.startsWith('reparam=none'));
  const k = g.data[0].indexOf(s0);
  const mean = vals.reduce((a, b) => a + b, 0) / vals.length;
  check(g.labels.length === 2 && gi >= 0 && Math.abs(g.data[1 + 3 * gi][k] - mean) < 1e-9 &&
    g.data[2 + 3 * gi][k] === Math.max(...vals) && g.data[3 + 3 * gi][k] === Math.min(...vals),
    `grouped by reparam: ${g.labels.join(' | ')}; at step ${s0} the line is the mean of ${vals.length} runs (${mean.toFixed(4)}), the band their min–max`);
  check(q().get('group') === 'reparam' && urls.length > n0, 'grouping is in the URL');
  await screenshot(page, 'compare-grouped', {fullPage: false});

  /* ---- URL round-trip and Back ----------------------------------------- */
  await page.selectOption('#cmp-agg', 'min');
  await page.selectOption('#cmp-layer', '1');
  await page.waitForFunction(() => new URL(location.href).searchParams.get('layer') === '1');
  const url = page.url();
  const fresh = await newPage(browser, {width: 1440, height: 900});
  await fresh.goto(url);
  await rendered(fresh);
  const st = await fresh.evaluate(() => ({agg: document.querySelector('#cmp-agg').value, layer: document.querySelector('#cmp-layer').value,
    group: document.querySelector('#cmp-group').value, smooth: document.querySelector('#cmp-smooth').value,
    pq: document.querySelector('#cmp-pick-q').value, chips: document.querySelectorAll('#cmp-chips .chip').length,
    lines: document.querySelector('#compare-body .chart[data-metric="loss"]').__chart.defs.length}));
  check(st.agg === 'min' && st.layer === '1' && st.group === 'reparam' && st.smooth === '0.9' && st.pq === 'sweep9' && st.chips === 10 && st.lines === 2,
    'a reload of the URL shows the same comparison (runs, agg, layer, group, smoothing, picker search)', JSON.stringify(st));
  await fresh.close();
  await page.goBack();
  await page.waitForFunction(() => !new URL(location.href).searchParams.get('layer') && document.querySelector('#cmp-layer')?.value === '');
  await page.goBack();
  await page.waitForFunction(() => !new URL(location.href).searchParams.get('agg') && document.querySelector('#cmp-agg')?.value === 'mean');
  await page.goBack();
  await page.waitForFunction(() => !new URL(location.href).searchParams.get('group'));
  check(true, 'Back undoes the layer, then the line, then the grouping');
  check(page.errors.length === 0, 'no errors on the compare page', page.errors.join('; '));

  /* ---- the runs list: meta columns and filters ------------------------- */
  const list = await newPage(browser, {width: 1440, height: 900});
  await list.goto(`${d.base}/`);
  await rendered(list);
  await list.click('#runs-cols summary');
  await list.check('#runs-cols-list input[value="lr"]');
  await list.check('#runs-cols-list input[value="sweep"]');
  const cols = await list.$$eval('#runs-table thead th.meta-col', (a) => a.map((x) => x.dataset.key));
  const cell = await list.$eval('#runs-table tbody tr td.meta[data-key="lr"]', (e) => e.textContent);
  check(cols.join() === 'lr,sweep' && /^0\.0\d+$/.test(cell) && new URL(list.url()).searchParams.get('cols') === 'lr,sweep',
    `meta keys as columns (${cols.join(', ')}; lr "${cell}"), kept in the URL`);
  const lq = () => new URL(list.url()).searchParams;
  await list.click('#runs-table tbody tr[data-run="10000"] td.meta[data-key="sweep"] button');
  await list.waitForFunction(() => /of 1,000 runs/.test(document.querySelector('#runs-count').textContent));
  check(lq().get('meta.sweep') === 'sweep9', `a click on a meta value filters by it (meta.sweep=${lq().get('meta.sweep')}, 1,000 runs)`);
  await list.fill('#runs-meta', 'sweep=sweep9, lr=0.01');
  await list.press('#runs-meta', 'Enter');
  const want = (await d.api('/api/runs?limit=1&meta.sweep=sweep9&meta.lr=0.01')).total;
  await list.waitForFunction((n) => document.querySelector('#runs-count').textContent.endsWith(`of ${n} runs`), want, {timeout: 5000}).catch(() => {});
  check((await list.textContent('#runs-count')).endsWith(`of ${want} runs`) && lq().get('meta.lr') === '0.01',
    `two meta filters: ${want} runs, both in the URL`);
  await list.click('#runs-next');
  await list.waitForFunction(() => /^101–/.test(document.querySelector('#runs-count').textContent));
  const pageUrl = list.url();
  const rows2 = await list.$$eval('#runs-table tbody tr', (a) => a.map((x) => x.dataset.run).join());
  const l2 = await newPage(browser, {width: 1440, height: 900});
  await l2.goto(pageUrl);
  await rendered(l2);
  const same = await l2.evaluate(() => ({rows: [...document.querySelectorAll('#runs-table tbody tr')].map((x) => x.dataset.run).join(),
    count: document.querySelector('#runs-count').textContent, cols: [...document.querySelectorAll('#runs-table thead th.meta-col')].map((x) => x.dataset.key).join(),
    meta: document.querySelector('#runs-meta').value, req: window.__net.requests}));
  check(same.rows === rows2 && /^101–/.test(same.count) && same.cols === 'lr,sweep' && same.meta === 'sweep=sweep9, lr=0.01' && same.req === 1,
    `a reload of the URL shows the same page 2, filters and columns, in ${same.req} request`, JSON.stringify({...same, rows: undefined}));
  await l2.click('#runs-prev');
  await l2.waitForFunction(() => /^1–100 /.test(document.querySelector('#runs-count').textContent));
  check(true, '"newer" after a reload goes back to page 1 (the cursors are in the URL)');
  await l2.close();
  await list.goBack();
  await list.waitForFunction(() => /^1–100 of/.test(document.querySelector('#runs-count')?.textContent || ''));
  await list.goBack();
  await list.waitForFunction(() => /of 1,000 runs/.test(document.querySelector('#runs-count')?.textContent || ''));
  await list.goBack();
  await list.waitForFunction(() => /of 10,002 runs/.test(document.querySelector('#runs-count')?.textContent || ''));
  await list.goBack();
  await list.waitForFunction(() => document.querySelectorAll('#runs-table thead th.meta-col').length === 1);
  check(true, 'Back undoes the page, each filter and each column in turn');
  check(list.errors.length === 0, 'no errors on the runs list', list.errors.join('; '));
  /* ---- the x axis: step, wall time, relative time ------------------------ */
  // two runs on known clocks: A from T0 at 1 s a step (collapsing: alerts),
  // B an hour later at 2 s a step
  const T0 = Math.floor(Date.now() / 1000) - 7200;
  const clocked = async (name, t0, dt, collapse) => {
    const t = await Trainer.connect(d.sock);
    const w = await t.hello(name, 2, 4, {sweep: 'clock'});
    t.send(Array.from({length: 200}, (_, s) => ({...stepMsg(s, 2, 4, {collapse, collapseAt: 20}), time: t0 + s * dt})));
    t.send([{type: 'end', status: 'finished'}]);
    await t.synced();
    t.close();
    return w.run_id;
  };
  const ta = await clocked('clock-a', T0, 1, true), tb = await clocked('clock-b', T0 + 3600, 2, false);
  const xp = await newPage(browser, {width: 1440, height: 900});
  const LOSS = '#compare-body .chart[data-metric="loss"]';
  // the loss chart's x values per run (where its line has a point), the axis title, its markers
  const xsOf = (mode) => xp.waitForFunction(([sel, m]) => { const e = document.querySelector(sel); return e && e.dataset.x === m && e.__chart.u && e.__chart.u.data[0].length; },
    [LOSS, mode], {timeout: 10000}).then(() => xp.$eval(LOSS, (el) => {
    const u = el.__chart.u, xs = u.data[0];
    const ofCol = (c) => xs.filter((_, i) => u.data[c][i] !== undefined);
    const a = ofCol(1), b = ofCol(4);
    return {a: [a[0], a.at(-1), a.length], b: [b[0], b.at(-1), b.length], label: u.axes[0].label, markers: el.__chart.o.markers(),
            select: document.querySelector('#x-axis').value, legend: u.series[0].label};
  }));
  await xp.goto(`${d.base}/?view=compare&runs=${ta},${tb}&x=wall`);
  await rendered(xp);
  const wx = await xsOf('wall');
  const mk = wx.markers.filter((m) => m.run === ta);
  check(wx.select === 'wall' && /wall time/.test(wx.label) && Math.abs(wx.a[0] - T0) < 1e-3 && Math.abs(wx.a[1] - (T0 + 199)) < 2 &&
    Math.abs(wx.b[0] - (T0 + 3600)) < 1e-3 && Math.abs(wx.b[1] - (T0 + 3600 + 398)) < 4,
    `x=wall: each run at its own trainer times (A ${wx.a[0] - T0}..${(wx.a[1] - T0).toFixed(0)} s after T0, B ${wx.b[0] - T0}..${(wx.b[1] - T0).toFixed(0)}), axis "${wx.label}"`);
  check(mk.length > 0 && mk.every((m) => Math.abs(m.x - (T0 + m.step)) < 1e-3) && wx.markers.every((m) => m.run !== tb),
    `x=wall: run A's ${mk.length} alert marker(s) at A's time of their step (step ${mk[0] && mk[0].step} at T0 + ${mk[0] && (mk[0].x - T0).toFixed(1)} s)`);
  await xp.selectOption('#x-axis', 'rel');
  const rx = await xsOf('rel');
  check(new URL(xp.url()).searchParams.get('x') === 'rel' && rx.a[0] === 0 && rx.b[0] === 0 && Math.abs(rx.a[1] - 199) < 2 && Math.abs(rx.b[1] - 398) < 4 &&
    /since/.test(rx.label) && mk.length && rx.markers.filter((m) => m.run === ta).every((m) => Math.abs(m.x - m.step) < 1e-3),
    `x=rel: both runs from 0 s at their first step, A to ${rx.a[1].toFixed(0)} s, B (twice as slow) to ${rx.b[1].toFixed(0)} s; markers at A's seconds; x=rel in the URL`);
  await xp.reload();
  await rendered(xp);
  const rr = await xsOf('rel');
  check(rr.select === 'rel' && JSON.stringify([rr.a, rr.b]) === JSON.stringify([rx.a, rx.b]),
    `a reload of x=rel shows the same relative axis (menu "${rr.select}", the same points)`);
  await xp.selectOption('#x-axis', 'step');
  const sx = await xsOf('step');
  check(!new URL(xp.url()).searchParams.has('x') && sx.a[0] === 0 && sx.a[1] === 199 && sx.b[1] === 199 && /step/.test(sx.label) &&
    sx.markers.filter((m) => m.run === ta).every((m) => m.x === m.step),
    `x=step: both runs on steps 0..${sx.a[1]} again, x gone from the URL`);
  await xp.goBack();
  const back = await xsOf('rel');
  check(back.select === 'rel' && new URL(xp.url()).searchParams.get('x') === 'rel', 'Back undoes the change of axis (relative time again)');
  // a drag over A's first 50 s zooms every chart to the steps spent there
  const zoom = await xp.$eval(LOSS, (el) => {
    const u = el.__chart.u, l = u.valToPos(0, 'x'), rgt = u.valToPos(50, 'x');
    u.setSelect({left: l, width: rgt - l, top: 0, height: u.bbox.height / devicePixelRatio});
    return [l, rgt];
  });
  const zq = await xp.waitForFunction(() => new URL(location.href).searchParams.get('to'), null, {timeout: 5000}).then(() => new URL(xp.url()).searchParams);
  check(+zq.get('from') === 0 && Math.abs(+zq.get('to') - 50) <= 1, `a drag over 0..50 s on the relative axis zooms to steps ${zq.get('from')}..${zq.get('to')} (A's; B spent them in 0..25)`,
    JSON.stringify(zoom));
  // nothing overlaps at 1280x800 with the axis menu in the bar
  await xp.setViewportSize({width: 1280, height: 800});
  await xp.evaluate(() => new Promise((res) => requestAnimationFrame(() => requestAnimationFrame(res))));
  const ov = await xp.evaluate(() => {
    const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
    const bad = [];
    for (const ch of document.querySelectorAll('#compare-body .chart')) {
      const t = ch.querySelector('.u-title'), tools = ch.querySelector('.chart-tools');
      if (!t || !tools || !t.textContent) continue;
      const rg = document.createRange();
      rg.selectNodeContents(t);
      if (hit(rg.getBoundingClientRect(), tools.getBoundingClientRect())) bad.push(t.textContent);
    }
    const kids = [...document.querySelector('#compare-body .rangebar').children].filter((e) => e.offsetParent).map((e) => e.getBoundingClientRect());
    for (let i = 0; i < kids.length; i++) for (let j = i + 1; j < kids.length; j++) if (hit(kids[i], kids[j])) bad.push('rangebar ' + i + '/' + j);
    return {bad, scroll: document.documentElement.scrollWidth - window.innerWidth};
  });
  check(!ov.bad.length && ov.scroll <= 0, 'compare at 1280x800: no chart title under its tools, no control of the bar over another, no horizontal scroll',
    JSON.stringify(ov));
  await screenshot(xp, 'compare-x-rel', {fullPage: false});
  check(xp.errors.length === 0, 'no errors on the compare page with time axes', xp.errors.join('; '));
  await xp.close();

}, {timeoutMs: 150000});
