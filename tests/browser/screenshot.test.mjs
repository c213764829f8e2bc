// screenshot.test.mjs: the README's picture, from a real demo run.
// Runs scripts/demo.sh (real entropyd, two real sigmatrain runs, 200 steps),
// serves its database, opens the baseline's run page at 1440x900 and checks
// that its first screen shows the collapse: the heatmap is at the newest
// step and some head's entropy_norm there is below the alert's 0.01, and
// the verdict banner says "Collapsed at step N", N the entropy_collapse
// alert's start step (the σReparam run's says "Healthy").  The
// first screen is saved as build/test-artifacts/screenshot-run.png; with
// UPDATE_SCREENSHOT=1 it also replaces docs/screenshot-run.png (the README's).
//
// Also the gallery of docs/dashboard.md: the run page's
// first screen (1440x900, JPEG) of the collapsed 2x4 demo baseline, a
// healthy 12x12 and a 32x32 run, each light and dark, into
// build/test-artifacts/gallery-*.jpg (and .png) and, with UPDATE_SCREENSHOT=1,
// docs/screenshots/. Each is checked before it is saved: the timeline drew
// every row, the heatmap its cells. And the baseline's overlapping alert
// markers fold into one with a count, listed on hover.
import {spawnSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {ARTIFACTS, check, ENTROPYD, launch, newPage, rendered, repo, run, screenshot, seedRun, startDaemon} from './harness.mjs';

const GALLERY = path.join(repo, 'docs/screenshots');

/** The first screen of run id at 1440x900 in theme, checked (every
 * timeline row drawn, the heatmap's cells shown) and saved as
 * gallery-NAME-THEME.jpg (and into docs/screenshots/ when asked). */
async function galleryShot(browser, d, id, name, theme, rows) {
  const page = await browser.newPage({viewport: {width: 1440, height: 900}, colorScheme: theme});
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`${d.base}/?run=${id}`);
  await rendered(page, 30000);
  const tl = await page.waitForFunction((n) => window.__timeline && window.__timeline.rows === n && window.__heatmap && window.__timeline,
    rows, {timeout: 15000}).then((x) => x.jsonValue(), () => null);
  const th = await page.evaluate(() => document.documentElement.dataset.theme);
  check(tl && th === theme && errors.length === 0, `${name} (${theme}): ${tl && tl.rows} timeline rows x ${tl && tl.cols} buckets and the heatmap drawn`,
    errors.join('; '));
  fs.mkdirSync(ARTIFACTS, {recursive: true});
  const file = path.join(ARTIFACTS, `gallery-${name}-${theme}.jpg`);
  await page.screenshot({path: file, type: 'jpeg', quality: 82});
  await page.screenshot({path: file.replace(/\.jpg$/, '.png')});   // to look at without a JPEG viewer
  if (process.env.UPDATE_SCREENSHOT === '1') {
    fs.mkdirSync(GALLERY, {recursive: true});
    fs.copyFileSync(file, path.join(GALLERY, `run-${name}-${theme}.jpg`));
  }
  await page.close();
}

const STEPS = 200;

await run(async (ctx) => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'entropyd-shot-'));
  ctx.cleanups.push(() => fs.rmSync(tmp, {recursive: true, force: true}));
  const demo = spawnSync('bash', [path.join(repo, 'scripts/demo.sh')], {
    env: {...process.env, ENTROPYD, DEMO_DATA: path.join(tmp, 'demo'), DEMO_STEPS: String(STEPS),
          DEMO_PORT: '0', DEMO_HOLD: '0'},
    stdio: ['ignore', 'pipe', 'pipe'], encoding: 'utf8', timeout: 240000});
  if (!check(demo.status === 0, 'the demo ran', demo.stdout.slice(-1500) + demo.stderr.slice(-1500))) return;

  const d = await startDaemon({dataDir: path.join(tmp, 'demo')});
  ctx.cleanups.push(() => d.stop());
  const runs = await d.api('/api/runs');
  const base = runs.find((r) => r.name === 'demo-baseline');
  check(base && base.last_step === STEPS, `the demo's baseline is stored to step ${STEPS}`, JSON.stringify(runs));

  const browser = await launch();
  ctx.cleanups.push(() => browser.close());
  const page = await newPage(browser, {width: 1440, height: 900});
  await page.goto(`${d.base}/?run=${base.id}`);
  await rendered(page, 30000);
  await page.waitForFunction(() => window.__heatmap && window.__heatmap.values, null, {timeout: 10000});
  const hm = await page.evaluate(() => window.__heatmap);
  const min = Math.min(...hm.values.flat());
  check(hm.step === STEPS, `the heatmap shows the newest step (${hm.step})`);
  check(min < 0.01, `a collapsed head shows on the heatmap (lowest ${hm.metric} ${min.toExponential(2)})`);
  const box = await page.evaluate(() => {
    const el = document.querySelector('.heatmap .hm-canvas');
    const r = el && el.getBoundingClientRect();
    return r && {top: r.top, bottom: r.bottom, height: r.height};
  });
  check(box && box.height > 0 && box.top >= 0 && box.bottom <= 900, 'the heatmap is whole on the first screen', JSON.stringify(box));
  // the verdict banner: collapsed, at the step the entropy_collapse alert began
  const alerts = await d.api(`/api/runs/${base.id}/alerts`);
  const col = alerts.filter((a) => a.rule === 'entropy_collapse').sort((a, b) => a.start_step - b.start_step)[0];
  const v = await page.$eval('#verdict', (e) => {
    const r = e.getBoundingClientRect();
    return {state: e.dataset.state, text: e.querySelector('#verdict-state').textContent, bottom: r.bottom};
  });
  check(col && v.state === 'collapsed' && v.text === `Collapsed at step ${col.start_step}` && v.bottom <= 900,
    `the first screen's verdict: "${v.text}" (entropy_collapse from step ${col && col.start_step})`);
  const sig = runs.find((r) => r.name === 'demo-sigmareparam');
  const ps = await newPage(browser, {width: 1440, height: 900});
  await ps.goto(`${d.base}/?run=${sig.id}`);
  await rendered(ps, 30000);
  await ps.waitForFunction(() => document.querySelector('#verdict').dataset.state !== 'unknown', null, {timeout: 10000});
  const vs = await ps.$eval('#verdict', (e) => ({state: e.dataset.state, text: e.querySelector('#verdict-state').textContent, bottom: e.getBoundingClientRect().bottom}));
  check(vs.state === 'healthy' && vs.text === 'Healthy' && vs.bottom <= 900, `the σReparam run's first screen says "${vs.text}"`);
  await screenshot(ps, 'screenshot-run-sigma', {fullPage: false});
  check(page.errors.length === 0 && ps.errors.length === 0, 'no page errors', [...page.errors, ...ps.errors].join('; '));
  const file = await screenshot(page, 'screenshot-run', {fullPage: false});
  if (process.env.UPDATE_SCREENSHOT === '1') {
    fs.copyFileSync(file, path.join(repo, 'docs/screenshot-run.png'));
    console.log('updated docs/screenshot-run.png');
  }

  // item 7: the baseline's alerts crowd the loss chart's top; close ones fold
  const mk = await page.$eval('.chart[data-metrics="loss,eval_loss"]', (el) => {
    const c = el.__chart;
    return {n: c.o.markers().length, groups: (c.markerGroups || []).map((g) => ({x: g.x, n: g.items.length})), left: c.u.bbox.left / devicePixelRatio};
  });
  const big = mk.groups.slice().sort((a, b) => b.n - a.n)[0];
  check(big && big.n > 1 && mk.groups.length < mk.n, `${mk.n} markers on the loss chart fold into ${mk.groups.length} (the largest holds ${big && big.n})`);
  if (big) {
    const over = await page.$('.chart[data-metrics="loss,eval_loss"] .u-over');
    await over.scrollIntoViewIfNeeded();
    const ob = await over.boundingBox();
    await page.mouse.move(ob.x + big.x - mk.left, ob.y + 6);
    const tip = await page.waitForFunction(() => { const t = document.querySelector('.chart[data-metrics="loss,eval_loss"] .marker-tip'); return t && !t.hidden && t.textContent; },
      null, {timeout: 3000}).then((x) => x.jsonValue(), () => '');
    check(tip.split('\n').length === big.n && /step \d+/.test(tip), `hovering the folded marker lists its ${big.n} markers`, tip.slice(0, 200));
  }

  // the gallery: the baseline, a healthy 12x12 and a 32x32, light and dark
  const {id: healthy} = await seedRun(d.sock, 'healthy-12x12', {L: 12, H: 12, steps: 1500, meta: {reparam: 'sigma'}});
  const {id: wide} = await seedRun(d.sock, 'collapsing-32x32', {L: 32, H: 32, steps: 300, meta: {reparam: 'none'}, collapse: true, collapseAt: 120});
  for (const theme of ['light', 'dark']) {
    await galleryShot(browser, d, base.id, 'demo-baseline', theme, base.layers * base.heads);
    await galleryShot(browser, d, healthy, 'healthy-12x12', theme, 144);
    await galleryShot(browser, d, wide, 'wide-32x32', theme, 1024);
  }
}, {timeoutMs: 300000});
