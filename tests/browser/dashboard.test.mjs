// dashboard.test.mjs: the run page's tools against a real entropyd.
// - the verdict banner: collapsing while an entropy_collapse alert fires on
//   a live run, collapsed (at the alert's start step) once it ended,
//   healthy on a run without alerts, and the daemon's own verdict field
//   when the run API has one (answered here by the test);
// - the first screen at 1440x900 holds the verdict, the heatmap and the
//   worst heads' chart, the training charts below; no horizontal scroll at
//   1280 and 800 px;
// - live append: steps streamed to the open page (loss every step,
//   eval_loss every 10th, a constant lr) give the charts the same data as
//   a reload: no NaN/Inf ticks, the lr axis the same, one lr tick label, on
//   the plot;
// - log toggle changes the y axis; entropy_norm starts on a log axis; the
//   heatmap's log colour scale separates 0.005 from 0.1;
// - smoothing changes a chart's line and not its band;
// - the crosshair moves on every chart; the legend shows eval_loss only at
//   steps that have one;
// - the CSV download holds the series API's answer, the PNG is the chart;
// - dark mode follows prefers-color-scheme and the header's toggle.
import fs from 'node:fs';
import {check, launch, newPage, rendered, run, screenshot, seedRun, sleep, startDaemon, stepMsg, Trainer} from './harness.mjs';

const L = 2, H = 4;
const rel = (a, b) => Math.abs(a - b) <= 1e-6 * Math.max(1e-30, Math.abs(a), Math.abs(b));
/** A step whose eval_loss comes every 10th step and whose lr is constant. */
function liveStep(s, collapse = true) {
  const m = stepMsg(s, L, H);
  // layer 0's heads fall below the alert's 0.05 from about step 45, and the
  // loss stops training (a collapse needs harmed training)
  if (collapse && s > 20) m.heads.entropy_norm[0] = m.heads.entropy_norm[0].map((v) => Math.fround(v * Math.exp(-(s - 20) / 10)));
  if (collapse) m.scalars.loss = Math.fround(5.5 + 0.05 * Math.sin(s));
  m.scalars.lr = 0.1;
  delete m.scalars.eval_loss;
  if (s % 10 === 0) m.scalars.eval_loss = Math.fround(2 + 1 / (1 + s));
  return m;
}
const chartData = (page, sel) => page.$eval(sel, (el) => {
  const c = el.__chart, u = c.u;
  return {data: c.data, nonfinite: c.nonfinite || [], scale: el.dataset.scale, y: [u.scales.y.min, u.scales.y.max],
          labels: u.axes[1]._values, splits: u.axes[1]._splits, plotH: u.bbox.height / devicePixelRatio,
          pos: (u.axes[1]._splits || []).map((v) => u.valToPos(v, 'y'))};
});
const LOSS = '.chart[data-metrics="loss,eval_loss"]', LR = '.chart[data-metrics="lr"]';

await run(async (ctx) => {
  const d = await startDaemon();
  ctx.cleanups.push(() => d.stop());
  const browser = await launch();
  ctx.cleanups.push(() => browser.close());

  /* ---- 1. live: verdict collapsing, then live append vs reload ---------- */
  const t = await Trainer.connect(d.sock);
  ctx.cleanups.push(() => t.close());
  const w = await t.hello('live-collapse', L, H, {reparam: 'none'});
  const id = w.run_id;
  const first = [];
  for (let s = 1; s <= 60; s++) first.push(liveStep(s));
  t.send(first);
  await t.synced();
  const page = await newPage(browser, {width: 1440, height: 900});
  await page.goto(`${d.base}/?run=${id}`);
  await rendered(page);
  await page.waitForFunction((sel) => document.querySelector(sel).__chart.u, LR);
  // stream 100 more steps into the open page, a few at a time
  for (let s = 61; s <= 160; s += 5) {
    const b = [];
    for (let k = s; k < s + 5; k++) b.push(liveStep(k));
    t.send(b);
    await sleep(40);
  }
  await t.synced();
  await page.waitForFunction((sel) => { const x = document.querySelector(sel).__chart.data[0]; return x[x.length - 1] === 160; }, LOSS, {timeout: 5000});
  await page.waitForFunction((sel) => { const x = document.querySelector(sel).__chart.data[0]; return x[x.length - 1] === 160; }, LR, {timeout: 5000});
  const alerts = await d.api(`/api/runs/${id}/alerts`);
  const col = alerts.filter((a) => a.rule === 'entropy_collapse');
  check(col.length > 0 && col[0].state === 'firing', `the live run's entropy_collapse alert fires (start step ${col[0] && col[0].start_step})`);
  await page.waitForFunction(() => document.querySelector('#verdict').dataset.state === 'collapsing', null, {timeout: 12000}).catch(() => {});
  const v1 = await page.$eval('#verdict', (e) => ({state: e.dataset.state, since: e.dataset.since, text: e.textContent}));
  check(v1.state === 'collapsing' && col[0] && v1.since === String(col[0].start_step) && v1.text.includes(`Collapsing since step ${col[0].start_step}`),
    `verdict on the live run: "${v1.text.slice(0, 60)}"`);
  check(/firing now:.*entropy_collapse/.test(v1.text), 'the banner lists entropy_collapse as firing now');
  const liveLoss = await chartData(page, LOSS), liveLr = await chartData(page, LR);
  const ticks = await page.evaluate((id) => window.__live.stats.ticks.filter((t) => t.run === id), id);
  await screenshot(page, 'dash-live', {fullPage: false});

  const again = await newPage(browser, {width: 1440, height: 900});
  await again.goto(`${d.base}/?run=${id}`);
  await rendered(again);
  await again.waitForFunction((sel) => document.querySelector(sel).__chart.u, LR);
  const reLoss = await chartData(again, LOSS), reLr = await chartData(again, LR);
  check(liveLoss.nonfinite.length === 0 && reLoss.nonfinite.length === 0,
    `no NaN/Inf ticks under the loss chart, live (${liveLoss.nonfinite.length}) or reloaded (${reLoss.nonfinite.length})`);
  // the reloaded chart is at full resolution here (160 steps < its points).
  // Live points come from the stream's ticks (docs/http-api.md): each one,
  // at its tick's last step, holds the mean of the steps since the previous
  // point (or since the tick's first step) as its line and their min and
  // max as its band (4 significant digits): compare each with the reloaded
  // steps it covers.
  const rel4 = (a, b) => Math.abs(a - b) <= 6e-4 * Math.max(1e-30, Math.abs(a), Math.abs(b));
  const cmp = (a, b, what) => {
    let steps = 0, points = 0;
    const bad = [];
    const xs = a.data[0];
    for (let j = 0; j < xs.length; j++) {
      if (xs[j] <= 60) continue;
      // a tick may begin before the previous point (steps the page had fetched)
      const st = xs[j], tk = ticks.find((t) => t.step === st), prev = tk ? tk.from - 1 : xs[j - 1];
      points++;
      for (let c = 1; c < a.data.length; c++) {
        const role = (c - 1) % 3;   // every line here has a band: mean, max, min
        const line = c - role;
        const ys = [];
        for (let i = 0; i < b.data[0].length; i++) {
          const bs = b.data[0][i];
          if (bs > prev && bs <= st && typeof b.data[line][i] === 'number') ys.push(b.data[line][i]);
        }
        if (c === 1) steps += ys.filter((_, k) => k >= ys.length - (st - Math.max(prev, 60))).length;
        const want = !ys.length ? null : role === 0 ? ys.reduce((x, y) => x + y, 0) / ys.length : role === 1 ? Math.max(...ys) : Math.min(...ys);
        const x = a.data[c][j];
        const same = want === null ? (x === undefined || x === null) : typeof x === 'number' && rel4(x, want);
        if (!same && bad.length < 5) bad.push(`point at step ${st} col ${c}: live ${x} from the reloaded steps ${want}`);
      }
    }
    // (a step or two may be in the fetched part: the page's fetch can see a step its stream sends too)
    check(steps >= 95 && points >= 1 && points < steps && bad.length === 0,
      `${what}: ${points} live points (ticks) cover the ${steps} live steps and equal the reloaded steps' mean, min and max`, bad.join('; '));
  };
  cmp(liveLoss, reLoss, 'loss and eval_loss');
  cmp(liveLr, reLr, 'lr');
  check(rel(liveLr.y[0], reLr.y[0]) && rel(liveLr.y[1], reLr.y[1]) && rel(reLr.y[1] - reLr.y[0], 0.02),
    `the lr axis is the same live and reloaded (${liveLr.y.map((x) => x.toPrecision(6))} vs ${reLr.y.map((x) => x.toPrecision(6))}): no phantom drop`);
  for (const [what, c] of [['live', liveLr], ['reloaded', reLr]]) {
    const shown = c.labels.filter((x) => x !== '');
    check(shown.length === 1 && shown[0] === '0.1' && c.pos.every((p) => p >= 0 && p <= c.plotH),
      `constant lr (${what}): tick labels [${c.labels}] at ${c.pos.map(Math.round)} px of ${Math.round(c.plotH)}`);
  }
  // the legend shows eval_loss only where it exists (step 75: none; 80: one)
  const legendAt = async (pg, step) => {
    await (await pg.$(`${LOSS} .u-over`)).scrollIntoViewIfNeeded();   // below the collapse timeline
    const box = await (await pg.$(`${LOSS} .u-over`)).boundingBox();
    const x = await pg.$eval(LOSS, (el, st) => el.__chart.u.valToPos(st, 'x'), step);
    await pg.mouse.move(box.x + x, box.y + 20);
    return pg.$eval(LOSS, (el) => {
    const vals = [...el.querySelectorAll('.u-legend .u-series')].map((s) => s.querySelector('.u-value')?.textContent);
    return {step: vals[0], loss: vals[1], eval: vals.find((v, i) => i > 1 && el.__chart.u.series[i].label === 'eval_loss')};
  });
  };
  const at75 = await legendAt(again, 75), at80 = await legendAt(again, 80);
  check(at75.step === '75' && at75.eval === '—' && at80.step === '80' && at80.eval !== '—',
    `legend: eval_loss "${at75.eval}" at step ${at75.step} (no eval), "${at80.eval}" at step ${at80.step}`);
  // the crosshair follows on the other charts (the same step)
  const synced = await again.$eval(LR, (el) => ({left: el.__chart.u.cursor.left, idx: el.__chart.u.cursor.idx, step: el.querySelector('.u-legend .u-series .u-value').textContent}));
  check(synced.left > 0 && synced.step === '80', `the lr chart's crosshair follows the loss chart's (step ${synced.step})`);

  // the run ends: collapsed at the alert's start step (the verdict is asked again in the page's
  // next background request slot: within 10 s of the previous, web/budget.js)
  t.send([{type: 'end', status: 'finished'}]);
  await t.synced();
  await page.waitForFunction(() => document.querySelector('#verdict').dataset.state === 'collapsed', null, {timeout: 12000}).catch(() => {});
  const v2 = await page.$eval('#verdict', (e) => ({state: e.dataset.state, text: e.querySelector('#verdict-state').textContent}));
  check(v2.state === 'collapsed' && col[0] && v2.text === `Collapsed at step ${col[0].start_step}`, `verdict once the run ended: "${v2.text}"`);

  /* ---- 2. log axes and the heatmap's log colours ------------------------ */
  const hc = await again.$eval('#head-chart', (el) => ({scale: el.dataset.scale, title: el.__chart.o.title}));
  check(hc.scale === 'log' && /entropy_norm/.test(hc.title), `the worst heads' entropy_norm chart starts on a log axis (${hc.title})`);
  const lin = await chartData(again, LOSS);
  await again.click(`${LOSS} [data-tool="log"]`);
  const lg = await chartData(again, LOSS);
  const distr = await again.$eval(LOSS, (el) => el.__chart.u.scales.y.distr);
  check(lin.scale === 'linear' && lg.scale === 'log' && distr === 3 && String(lin.labels) !== String(lg.labels),
    `log toggle: the loss axis goes from [${lin.labels}] to [${lg.labels}]`);
  await again.click(`${LOSS} [data-tool="log"]`);

  // a frame with heads at 0.005, 0.1 and 1
  const t2 = await Trainer.connect(d.sock);
  const w2 = await t2.hello('three-heads', 1, 3, {});
  const base = stepMsg(1, 1, 3);
  base.heads.entropy_norm = [[0.005, 0.1, 1]];
  t2.send([base, {type: 'end', status: 'finished'}]);
  await t2.synced();
  t2.close();
  const hp = await newPage(browser);
  await hp.goto(`${d.base}/?run=${w2.run_id}&metric=entropy_norm`);
  await rendered(hp);
  const pix = () => hp.evaluate(() => {
    const cv = document.querySelector('.hm-canvas'), dpr = devicePixelRatio;
    const g = {padL: 34, padT: 18, cw: cv.width / dpr - 34, ch: cv.height / dpr - 18};
    const cw = g.cw / 3, ctx = cv.getContext('2d');
    return [0, 1, 2].map((k) => Array.from(ctx.getImageData(Math.round((g.padL + cw * k + cw / 2) * dpr), Math.round((g.padT + g.ch / 2) * dpr), 1, 1).data.slice(0, 3)));
  });
  const dist = (a, b) => Math.hypot(a[0] - b[0], a[1] - b[1], a[2] - b[2]);
  const logPix = await pix();
  const logScale = await hp.evaluate(() => window.__heatmap.scale);
  await hp.click('#hm-log');
  await hp.waitForFunction(() => window.__heatmap.scale === 'linear');
  const linPix = await pix();
  check(logScale === 'log' && dist(logPix[0], logPix[1]) > 70 && dist(logPix[0], logPix[1]) > 1.8 * dist(linPix[0], linPix[1]),
    `heatmap colours of 0.005 and 0.1: ${Math.round(dist(logPix[0], logPix[1]))} apart on the log scale (default), ${Math.round(dist(linPix[0], linPix[1]))} linear`);
  await hp.close();

  // the heatmap follows the zoomed window: a zoomed link opens it inside,
  // and zooming elsewhere moves it (and the scrubber) there
  const zp = await newPage(browser);
  await zp.goto(`${d.base}/?run=${id}&from=100&to=130`);
  await rendered(zp);
  await zp.waitForFunction(() => window.__heatmap && window.__heatmap.step === 130, null, {timeout: 5000}).catch(() => {});
  const z1 = await zp.evaluate(() => [window.__heatmap.step, +document.querySelector('#hm-scrub').min, +document.querySelector('#hm-scrub').max]);
  await zp.evaluate(() => document.querySelector('.chart[data-metrics="loss,eval_loss"]').__chart.o.onZoom(20, 40));
  await zp.waitForFunction(() => window.__heatmap.step === 40, null, {timeout: 5000}).catch(() => {});
  const z2 = await zp.evaluate(() => [window.__heatmap.step, +document.querySelector('#hm-scrub').min, +document.querySelector('#hm-scrub').max]);
  check(String(z1) === '130,100,130' && String(z2) === '40,20,40',
    `the heatmap follows the zoom: steps 100..130 -> step ${z1[0]}, scrubber ${z1[1]}..${z1[2]}; 20..40 -> ${z2[0]}, ${z2[1]}..${z2[2]}`);
  await zp.close();

  /* ---- 3. smoothing, downloads ------------------------------------------ */
  const sm0 = await again.$eval(LOSS, (el) => el.__chart.u.data.map((c) => c.slice()));
  await again.$eval('#smooth', (e) => { e.value = 0.9; e.dispatchEvent(new Event('input', {bubbles: true})); });
  const sm1 = await again.$eval(LOSS, (el) => el.__chart.u.data.map((c) => c.slice()));
  const diff = sm1[1].filter((v, i) => v !== sm0[1][i]).length;
  check(diff > 50 && String(sm1[2]) === String(sm0[2]) && String(sm1[3]) === String(sm0[3]) && new URL(again.url()).searchParams.get('smooth') === '0.9',
    `smoothing 0.9: ${diff} points of the loss line change, its min–max band does not`);
  await again.$eval('#smooth', (e) => { e.value = 0; e.dispatchEvent(new Event('input', {bubbles: true})); });

  const reqs = [];
  again.on('request', (r) => { if (r.url().includes('/series?') && r.url().includes('metric=loss&')) reqs.push(r.url()); });
  await again.reload();
  await rendered(again);
  await again.waitForFunction((sel) => document.querySelector(sel).__chart.u, LOSS);
  const [dl] = await Promise.all([again.waitForEvent('download'), again.click(`${LOSS} [data-tool="csv"]`)]);
  const csv = fs.readFileSync(await dl.path(), 'utf8').trim().split('\n').map((l) => l.split(','));
  const u = new URL(reqs[reqs.length - 1]);
  const ans = await d.api(u.pathname + u.search);
  let bad = 0;
  const hdr = csv[0];
  ans.step.forEach((st, i) => {
    const row = csv.find((r) => +r[0] === st);
    if (!row || +row[hdr.indexOf('loss')] !== ans.mean[i] || +row[hdr.indexOf('loss_max')] !== ans.max[i] || +row[hdr.indexOf('loss_min')] !== ans.min[i]) bad++;
  });
  check(dl.suggestedFilename().endsWith('.csv') && hdr.join() === 'step,loss,loss_max,loss_min,eval_loss,eval_loss_max,eval_loss_min' && bad === 0 && ans.step.length > 100,
    `CSV download ${dl.suggestedFilename()}: ${ans.step.length - bad}/${ans.step.length} rows equal GET ${u.pathname}?${u.searchParams}`);
  const [dp] = await Promise.all([again.waitForEvent('download'), again.click(`${LOSS} [data-tool="png"]`)]);
  const png = fs.readFileSync(await dp.path());
  const cvs = await again.$eval(LOSS, (el) => [el.__chart.u.ctx.canvas.width, el.__chart.u.ctx.canvas.height]);
  const pw = png.readUInt32BE(16), ph = png.readUInt32BE(20);
  check(png.slice(1, 4).toString() === 'PNG' && pw === cvs[0] && ph > cvs[1], `PNG download ${dp.suggestedFilename()}: ${pw}x${ph} (the chart's canvas ${cvs} and its title)`);

  /* ---- 4. first screen, healthy run, the daemon's verdict, widths -------- */
  const ok = await seedRun(d.sock, 'healthy', {L, H, steps: 120, meta: {reparam: 'sigma'}});
  const p1 = await newPage(browser, {width: 1440, height: 900});
  await p1.goto(`${d.base}/?run=${ok.id}`);
  await rendered(p1);
  await p1.waitForFunction(() => document.querySelector('#verdict').dataset.state !== 'unknown');
  const fs1 = await p1.evaluate((LOSS) => {
    const r = (s) => { const e = document.querySelector(s); const b = e && e.getBoundingClientRect(); return b && {top: b.top, bottom: b.bottom}; };
    return {verdict: document.querySelector('#verdict-state').textContent, v: r('#verdict'), hm: r('.hm-canvas'),
            head: r('#head-chart .u-over'), train: r(LOSS)};
  }, LOSS);
  check(fs1.verdict === 'Healthy', `verdict on a run without alerts: "${fs1.verdict}"`);
  check(fs1.v.bottom <= 900 && fs1.hm.bottom <= 900 && fs1.head.bottom <= 900 && fs1.train.top > fs1.hm.bottom,
    `1440x900: verdict, heatmap and worst heads on the first screen, training below (${JSON.stringify(fs1)})`);
  const started = await p1.$eval('#started-ago', (e) => e.textContent);
  const ticked = await p1.waitForFunction((s) => document.querySelector('#started-ago').textContent !== s, started, {timeout: 12000}).then(() => true, () => false);
  check(ticked, `"started ${started}" stays current (now "${await p1.$eval('#started-ago', (e) => e.textContent)}")`);
  await screenshot(p1, 'dash-healthy', {fullPage: false});
  await p1.close();

  // the daemon's verdict field, in the shape of GET /api/runs/{id}
  const p2 = await newPage(browser);
  await p2.route(`**/api/runs/${ok.id}`, async (route) => {
    const r = await route.fetch();
    const j = await r.json();
    j.verdict = {state: 'diverged', since_step: 77, heads: [[1, 2]], rule: 'loss_nonfinite'};
    await route.fulfill({response: r, json: j});
  });
  await p2.goto(`${d.base}/?run=${ok.id}`);
  await rendered(p2);
  const v3 = await p2.$eval('#verdict', (e) => ({state: e.dataset.state, source: e.dataset.source, text: e.textContent}));
  check(v3.state === 'diverged' && v3.source === 'daemon' && v3.text.startsWith('Diverged at step 77') && v3.text.includes('L1 h2'),
    `the daemon's verdict wins over the alerts: "${v3.text.slice(0, 70)}"`);
  await p2.close();

  for (const width of [1280, 800]) {
    const pw2 = await newPage(browser, {width, height: 900});
    await pw2.goto(`${d.base}/?run=${id}`);
    await rendered(pw2);
    await pw2.waitForFunction((sel) => document.querySelector(sel).__chart.u, LOSS);
    const over = await pw2.evaluate(() => ({sw: document.documentElement.scrollWidth,
      charts: [...document.querySelectorAll('.chart .uplot')].map((e) => e.getBoundingClientRect().right)}));
    check(over.sw <= width && over.charts.every((r) => r <= width), `${width} px wide: no horizontal scroll (${over.sw}), every chart inside`);
    await screenshot(pw2, `dash-${width}`, {fullPage: false});
    await pw2.close();
  }

  /* ---- 5. dark mode ----------------------------------------------------- */
  const dk = await browser.newPage({viewport: {width: 1440, height: 900}, colorScheme: 'dark'});
  await dk.goto(`${d.base}/?run=${id}`);
  await rendered(dk);
  await dk.waitForFunction((sel) => document.querySelector(sel).__chart.u, LOSS);
  const lum = () => dk.evaluate(([sel]) => {
    const [r, g, b] = getComputedStyle(document.body).backgroundColor.match(/\d+/g).map(Number);
    return {theme: document.documentElement.dataset.theme, bg: (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255,
            axis: ((u) => { const st = u.axes[0].stroke; return typeof st === 'function' ? st(u, 0) : st; })(document.querySelector(sel).__chart.u)};
  }, [LOSS]);
  const dark = await lum();
  await screenshot(dk, 'dash-dark', {fullPage: false});
  await dk.click('#theme-toggle');
  // the page's background and the charts' axes follow the theme (no fixed
  // wait: until both changed, or 5 s, after which the check below says what is left)
  await dk.waitForFunction(([sel, axis]) => {
    const [r, g, b] = getComputedStyle(document.body).backgroundColor.match(/\d+/g).map(Number);
    const u = document.querySelector(sel).__chart.u, st = u && u.axes[0].stroke;
    return document.documentElement.dataset.theme === 'light' && (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255 > 0.85 &&
      String(typeof st === 'function' ? st(u, 0) : st) !== String(axis);
  }, [LOSS, dark.axis], {timeout: 5000}).catch(() => {});
  const light = await lum();
  check(dark.theme === 'dark' && dark.bg < 0.15 && light.theme === 'light' && light.bg > 0.85 && String(dark.axis) !== String(light.axis),
    `dark mode from prefers-color-scheme (background ${dark.bg.toFixed(2)}), the toggle makes it light (${light.bg.toFixed(2)}) and the charts follow (axis ${dark.axis} -> ${light.axis})`);
  await dk.close();

  check(page.errors.length === 0 && again.errors.length === 0, 'no page errors', [...page.errors, ...again.errors].join('; '));
}, {timeoutMs: 120000});
