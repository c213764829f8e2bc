// events.test.mjs: the run page's events on a run with 1,500 of them.
// - the table shows the newest first (the page once fetched the oldest
//   1,000 and showed the last 300 of those: the newest never appeared);
// - "Older events" pages back towards the oldest;
// - every rollback in the run's history is marked on the charts, the one
//   among the oldest events too (window.__rollbacks lists their steps).
import {check, launch, newPage, rendered, run, startDaemon, stepMsg, Trainer} from './harness.mjs';

const L = 2, H = 2, N = 1500;
const ROLLBACKS = {3: 40, 700: 120, 1490: 180};   // event index -> "rollback to step S"

await run(async (ctx) => {
  const d = await startDaemon();
  ctx.cleanups.push(() => d.stop());
  const t = await Trainer.connect(d.sock);
  const w = await t.hello('many-events', L, H, {});
  const msgs = [];
  for (let s = 0; s < 200; s++) msgs.push(stepMsg(s, L, H));
  for (let i = 0; i < N; i++)
    msgs.push({type: 'event', level: 'info', text: i in ROLLBACKS ? `rollback to step ${ROLLBACKS[i]}` : `event number ${i}`});
  for (let i = 0; i < msgs.length; i += 200) t.send(msgs.slice(i, i + 200));
  t.send([{type: 'end', status: 'finished'}]);
  await t.synced();
  t.close();

  const browser = await launch();
  ctx.cleanups.push(() => browser.close());
  const page = await newPage(browser);
  await page.goto(`${d.base}/?run=${w.run_id}`);
  await rendered(page, 30000);
  await page.locator('#events').scrollIntoViewIfNeeded();
  await page.waitForFunction(() => document.querySelectorAll('#events tbody tr').length > 0, null, {timeout: 15000});
  const first = await page.$$eval('#events tbody tr', (rows) => rows.slice(0, 2).map((r) => r.textContent));
  check(/event number 1499/.test(first[0]), 'the newest event is the first row', first[0]);
  const shown = await page.$$eval('#events tbody tr', (rows) => rows.length);
  check(shown === 300, `one page of events shown (${shown})`);
  await page.click('#events-older');
  await page.waitForFunction(() => document.querySelectorAll('#events tbody tr').length === 600, null, {timeout: 10000}).catch(() => {});
  const last = await page.$$eval('#events tbody tr', (rows) => [rows.length, rows[rows.length - 1].textContent]);
  check(last[0] === 600 && /event number 900/.test(last[1]), `"Older events" adds the next 300 (${last[0]}: ${last[1]})`);
  await page.waitForFunction(() => Array.isArray(window.__rollbacks), null, {timeout: 15000});
  const marks = await page.evaluate(() => window.__rollbacks.slice().sort((a, b) => a - b));
  check(JSON.stringify(marks) === JSON.stringify([40, 120, 180]), `every rollback is marked (${marks})`);
  check(page.errors.length === 0, 'no page errors', page.errors.join('; '));
}, {timeoutMs: 120000});
