// harness.mjs: what every browser test needs — a real entropyd on a temp
// data dir with HTTP on a free port, a protocol-v1 trainer client over its
// Unix socket (schema/protocol.md), synthetic attention metrics, Debian's
// chromium through playwright-core, screenshots, and a tiny check/summary.
import {spawn} from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import {fileURLToPath} from 'node:url';
import {chromium} from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, '../..');
const BUILD = process.env.BUILD || 'build';
export const ENTROPYD = process.env.ENTROPYD || path.join(repo, BUILD, 'entropyd');
export const ARTIFACTS = path.join(repo, BUILD, 'test-artifacts');

/* ---- checks ------------------------------------------------------------ */

let passed = 0, failed = 0;
const t0 = Date.now();
export function check(cond, what, detail = '') {
  if (cond) { passed++; console.log(`ok   ${what}`); }
  else { failed++; console.log(`FAIL ${what}${detail ? ': ' + detail : ''}`); }
  return cond;
}
/** Prints the summary and exits: 0 when every check passed. */
export async function finish(cleanup) {
  try { if (cleanup) await cleanup(); } catch (e) { console.log('cleanup:', e.message); }
  console.log(`${path.basename(process.argv[1])}: ${passed} passed, ${failed} failed (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  process.exit(failed || !passed ? 1 : 0);
}
/** Runs main(ctx) with a global deadline; any exception is a failure. */
export async function run(main, {timeoutMs = 60000} = {}) {
  const ctx = {cleanups: []};
  const timer = setTimeout(() => { console.log(`FAIL timeout after ${timeoutMs} ms`); failed++; finish(() => cleanupAll(ctx)); }, timeoutMs);
  try { await main(ctx); } catch (e) { failed++; console.log('FAIL exception:', e && e.stack || e); }
  clearTimeout(timer);
  await finish(() => cleanupAll(ctx));
}
async function cleanupAll(ctx) { for (const f of ctx.cleanups.reverse()) { try { await f(); } catch { /* best effort */ } } }

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* ---- daemon ------------------------------------------------------------ */

/** Starts entropyd on dataDir (a new temp dir when left out). port 0 picks
 * a free one; the daemon prints "http port N" on stdout once serving. */
export async function startDaemon({dataDir, port = 0, extra = []} = {}) {
  dataDir = dataDir || fs.mkdtempSync(path.join(os.tmpdir(), 'entropyd-web-'));
  const args = ['--data', dataDir, '--http', `127.0.0.1:${port}`, '--drain-ms', '500', ...extra];
  const proc = spawn(ENTROPYD, args, {stdio: ['ignore', 'pipe', 'pipe']});
  let out = '', log = '';
  proc.stderr.on('data', (d) => { log += d; });
  const bound = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('entropyd did not print its http port in 10 s; log:\n' + log + out)), 10000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = /http port (\d+)/.exec(out);
      if (m) { clearTimeout(timer); resolve(+m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`entropyd exited (${code}) at start:\n${log}${out}`)); });
  });
  const d = {
    proc, dataDir, port: bound, base: `http://127.0.0.1:${bound}`, sock: path.join(dataDir, 'entropyd.sock'),
    log: () => log,
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode !== null || proc.signalCode) return;
      const done = new Promise((r) => proc.once('exit', r));
      proc.kill(signal);
      await Promise.race([done, sleep(5000)]);
      if (proc.exitCode === null && !proc.signalCode) { proc.kill('SIGKILL'); await done; }
    },
    async api(p) {
      const r = await fetch(d.base + p);
      if (!r.ok) throw new Error(`${p}: HTTP ${r.status} ${await r.text()}`);
      return r.json();
    },
  };
  return d;
}

/* ---- trainer client (protocol v1) --------------------------------------- */

export class Trainer {
  static async connect(sock) {
    const t = new Trainer();
    t.s = net.createConnection(sock);
    await new Promise((res, rej) => { t.s.once('connect', res); t.s.once('error', rej); });
    t.buf = '';
    t.acked = 0;
    t.waiters = [];
    t.errors = [];
    t.s.setEncoding('utf8');
    t.s.on('data', (d) => {
      t.buf += d;
      let i;
      while ((i = t.buf.indexOf('\n')) >= 0) {
        const line = t.buf.slice(0, i);
        t.buf = t.buf.slice(i + 1);
        let m;
        try { m = JSON.parse(line); } catch { continue; }
        if (m.type === 'welcome') { t.runId = m.run_id; t.seq = m.last_seq; t.acked = m.last_seq; }
        if (m.type === 'ack') t.acked = Math.max(t.acked, m.seq);
        if (m.type === 'error') t.errors.push(m);
        for (const w of t.waiters.slice()) w(m);
      }
    });
    return t;
  }

  wait(pred, ms = 10000) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => { this.waiters = this.waiters.filter((x) => x !== f); reject(new Error('trainer: timed out; errors: ' + JSON.stringify(this.errors.slice(-3)))); }, ms);
      const f = (m) => { if (pred(m)) { clearTimeout(timer); this.waiters = this.waiters.filter((x) => x !== f); resolve(m); } };
      this.waiters.push(f);
    });
  }

  async hello(run, layers, heads, meta = {}, seqLen = 64, token) {
    const p = this.wait((m) => m.type === 'welcome' || (m.type === 'error' && !m.seq));
    this.s.write(JSON.stringify({type: 'hello', protocol: 1, run, layers, heads, seq_len: seqLen, meta, ...(token ? {token} : {})}) + '\n');
    const m = await p;
    if (m.type !== 'welcome') throw new Error('hello refused: ' + JSON.stringify(m));
    return m;
  }

  /** Writes messages (objects without seq) and returns the last seq. */
  send(msgs) {
    let text = '';
    for (const m of msgs) text += JSON.stringify({...m, seq: ++this.seq}) + '\n';
    this.s.write(text);
    return this.seq;
  }

  async synced(ms = 15000) {
    if (this.acked >= this.seq) return;
    const target = this.seq;
    await this.wait((m) => m.type === 'ack' && m.seq >= target, ms);
  }

  close() { this.s.end(); }
}

/* ---- synthetic metrics -------------------------------------------------- */

/** A step message of a plausible run: entropy falls over time; heads of
 * layer 0 collapse when `collapse` is set (past step collapseAt), and then
 * the loss never trains (a collapse harms training: docs/science.md; a loss
 * that trains beside near-one-hot heads is `sharp`, not collapsed). Values
 * are rounded to float32-exact decimals so comparisons are exact. */
export function stepMsg(step, L, H, {collapse = false, collapseAt = 150, extraLayers = true} = {}) {
  const logT = Math.log(64);
  const f32 = (x) => Math.fround(x);
  const entropy = [], norm = [], bound = [], sqk = [], mlog = [], em = [], ev = [];
  for (let l = 0; l < L; l++) {
    const re = [], rn = [], rb = [], rs = [], rm = [], rem = [], rev = [];
    for (let k = 0; k < H; k++) {
      const base = 0.55 + 0.35 * Math.cos(0.7 * l + 1.3 * k) ** 2;
      let n = base * (1 - 0.1 * Math.min(1, step / 400)) + 0.02 * Math.sin(step / 7 + k);
      if (collapse && l === 0 && step > collapseAt) n *= Math.exp(-(step - collapseAt) / 60);
      n = Math.min(1, Math.max(0, n));
      rn.push(f32(n)); re.push(f32(n * logT * 0.9)); rb.push(f32(n * logT * 0.5));
      const s = 1 + step / 100 + l * 0.3 + (collapse && l === 0 ? step / 20 : 0);
      rs.push(f32(s)); rm.push(f32(3 * s + k)); rem.push(f32(0.1 * Math.sin(k + l))); rev.push(f32(0.05 + 0.01 * k));
    }
    entropy.push(re); norm.push(rn); bound.push(rb); sqk.push(rs); mlog.push(rm); em.push(rem); ev.push(rev);
  }
  const layers = {rank_ratio: Array.from({length: L}, (_, l) => f32(0.9 - 0.02 * l - step / 10000))};
  if (extraLayers) {
    layers.sigma_qkv = Array.from({length: L}, (_, l) => f32(1 + l * 0.1 + step / 1000));
    layers.gamma_qkv = Array.from({length: L}, (_, l) => f32(1 - l * 0.05));
  }
  return {
    type: 'step', step, time: Date.now() / 1000,
    scalars: {loss: f32((collapse ? 5.5 : 4 * Math.exp(-step / 300) + 1.5) + 0.05 * Math.sin(step)),
              lr: f32(1e-3 * Math.min(1, step / 50)),
              ...(step % 50 === 0 ? {eval_loss: f32(collapse ? 5.7 : 4 * Math.exp(-step / 300) + 1.7)} : {})},
    layers,
    heads: {entropy, entropy_norm: norm, entropy_bound: bound, sigma_qk: sqk, max_logit: mlog, eig_mean: em, eig_var: ev},
  };
}

/** Seeds one run of `steps` steps; returns the run id. status: 'live' keeps the
 * connection open (returned as .trainer), else sends end with that status. */
export async function seedRun(sock, name, {L = 4, H = 4, steps = 300, meta = {}, status = 'finished', collapse = false, collapseAt = 150, start = 0, token} = {}) {
  const t = await Trainer.connect(sock);
  const w = await t.hello(name, L, H, meta, 64, token);
  const batch = [];
  for (let s = start; s < start + steps; s++) {
    batch.push(stepMsg(s, L, H, {collapse, collapseAt}));
    if (batch.length === 200) { t.send(batch.splice(0)); }
  }
  if (batch.length) t.send(batch);
  t.send([{type: 'event', level: 'info', text: `seeded ${steps} steps`}]);
  if (status !== 'live') t.send([{type: 'end', status}]);
  await t.synced();
  if (status !== 'live') { t.close(); return {id: w.run_id}; }
  return {id: w.run_id, trainer: t};
}

/* ---- browser ------------------------------------------------------------ */

export async function launch() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  return browser;
}

/** A page that fails the test on uncaught errors and console errors. */
export async function newPage(browser, {width = 1400, height = 900} = {}) {
  const page = await browser.newPage({viewport: {width, height}});
  page.errors = [];
  page.on('pageerror', (e) => { page.errors.push(String(e)); console.log('page error:', String(e)); });
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    console.log('console error:', m.text());
    // a 404 of the not-yet-existing alerts API is expected; anything else counts
    if (!/Failed to load resource/.test(m.text())) page.errors.push(m.text());
  });
  return page;
}

export async function screenshot(page, name, {fullPage = true} = {}) {
  fs.mkdirSync(ARTIFACTS, {recursive: true});
  const file = path.join(ARTIFACTS, name + '.png');
  await page.screenshot({path: file, fullPage});
  console.log('screenshot', path.relative(repo, file));
  return file;
}

/** Waits until the view says its first render is complete. */
export async function rendered(page, ms = 15000) {
  await page.waitForFunction(() => window.__render && window.__render.complete, null, {timeout: ms});
}
