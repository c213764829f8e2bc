// screenshot.test.mjs: the README's picture, from a real demo run.
// Runs scripts/demo.sh (real entropyd, two real sigmatrain runs, 200 steps),
// serves its database, opens the baseline's run page at 1440x900 and checks
// that its first screen shows the collapse: the heatmap is at the newest
// step and some head's entropy_norm there is below the alert's 0.01, and
// the verdict banner says "Collapsed at step N", N the entropy_collapse
// alert's start step (the σReparam run's says "Healthy").  The
// first screen is saved as build/test-artifacts/screenshot-run.png; with
// UPDATE_SCREENSHOT=1 it also replaces docs/screenshot-run.png (the README's).
import {spawnSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {check, ENTROPYD, launch, newPage, rendered, repo, run, screenshot, startDaemon} from './harness.mjs';

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
}, {timeoutMs: 300000});
