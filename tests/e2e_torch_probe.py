#!/usr/bin/env python3
"""End-to-end tests of entropyd.torch's budgeted probe, against
the real entropyd:

- the budgeted probe (certified power iterations, the default) and the
  exact path (exact=True: QR + SVD in float64) watch the same forwards of
  an nn.MultiheadAttention with a query bias: the stored entropy,
  entropy_norm and max_logit are equal, sigma_qk and logit_scale never
  below the exact ones, and entropy_bound never above Theorem 3.1 at each
  row's real (centred) logit norm, computed here in float64 from the
  weights and inputs, on every step; both on the host's path (eigvalsh)
  and the GPU's sync-free one (squaring + Cholesky), forced on the host;
- the budget: with a fake clock (100 ms steps, probes of 10 ms, unprobed
  logs of 0.1 ms) the watch probes every 6th step for a 2% budget, halves
  `examples` when a probe is too dear, and every=K overrides it;
- the examples examples/torch_*.py run to the end against the daemon, few
  steps each, and store what they say.

Needs /usr/bin/python3 with numpy and torch (re-executes itself with it);
skipped under SANITIZE (ctypes cannot load the instrumented library)."""
import os
import sys

try:
    import numpy as np
    import torch
except ImportError:
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    np = torch = None

import math  # noqa: E402
import subprocess  # noqa: E402
import unittest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from daemon_harness import Daemon, ROOT, floats, use_python_client  # noqa: E402

SANITIZE = os.environ.get("SANITIZE", "")
use_python_client()
SKIP = SANITIZE or torch is None
if not SKIP:
    import entropyd
    import entropyd.torch as et


def frames(d, run, metric):
    rows = d.query("SELECT f.step, f.data FROM frames f JOIN metrics m ON m.id = f.metric_id JOIN runs r "
                   "ON r.id = m.run_id WHERE r.name = ? AND m.name = ? ORDER BY f.step", (run, metric))
    return {s: np.array(floats(b)) for s, b in rows}


def theorem(T, s):
    """Theorem 3.1 (science.md §2) in float64, scalar."""
    if T <= 1:
        return 0.0
    if s <= 0:
        return math.log(T)
    r = s * math.sqrt(T / (T - 1))
    if r > 700:
        return 0.0
    beta = math.exp(-r)
    den = 1 + (T - 1) * beta
    return math.log(den) + s * math.sqrt(T * (T - 1)) * beta / den


def real_bound(mha, x, n):
    """Per head, the mean over the first n examples' rows of the theorem at
    the row's real centred logit norm (causal), float64."""
    E, H = mha.embed_dim, mha.num_heads
    d = E // H
    w = mha.in_proj_weight.detach().double()
    b = mha.in_proj_bias.detach().double()
    X = x[:n].detach().double()
    q = (X @ w[:E].T + b[:E]).view(n, -1, H, d).transpose(1, 2)
    k = (X @ w[E:2 * E].T + b[E:2 * E]).view(n, -1, H, d).transpose(1, 2)
    a = (q @ k.transpose(-1, -2) / math.sqrt(d)).numpy()          # (n, H, T, T)
    T = a.shape[-1]
    out = np.zeros(H)
    for h in range(H):
        tot = 0.0
        for e in range(n):
            for i in range(T):
                row = a[e, h, i, :i + 1]
                tot += theorem(i + 1, float(np.linalg.norm(row - row.mean())))
        out[h] = tot / (n * T)
    return out


@unittest.skipIf(SKIP, "needs torch, and ctypes cannot load a sanitizer-instrumented library")
class BudgetedProbe(unittest.TestCase):
    def setUp(self):
        self.d = Daemon().start()
        self.addr = "unix:" + self.d.sock

    def tearDown(self):
        et._SYNC_FREE_ON_CPU = False
        self.d.cleanup()

    def watch_both(self, tag, steps=12, E=24, H=3, T=10, B=5, n=3):
        torch.manual_seed(7)
        mha = torch.nn.MultiheadAttention(E, H, batch_first=True)
        with torch.no_grad():
            mha.in_proj_bias.normal_(0, 0.3)      # a query bias: the bound's [W_Q | b_Q] case
        mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
        shared = torch.randn(E)
        runs = {}
        watches = {}
        for kind in ("exact", "budget"):
            runs[kind] = entropyd.init("probe-%s-%s" % (tag, kind), layers=1, heads=H, seq_len=T, daemon=self.addr)
            watches[kind] = et.watch(mha, runs[kind], every=1, examples=n, exact=(kind == "exact"))
        want = {}
        for step in range(steps):
            x = torch.randn(B, T, E) + shared              # tokens share a direction, as residual streams do
            want[step] = real_bound(mha, x, n)
            mha(x, x, x, attn_mask=mask, need_weights=False)
            with torch.no_grad():                                 # logits growing: bounds from ~log T to ~0
                mha.in_proj_weight.mul_(1.2)
                mha.in_proj_weight.add_(0.05 * torch.randn_like(mha.in_proj_weight))
            for kind in watches:
                watches[kind].log(step, loss=float(step))
        for r in runs.values():
            self.assertTrue(r.finish("finished"))
        got = {kind: {m: frames(self.d, runs[kind].name, m) for m in et.HEAD_METRICS} for kind in runs}
        ex, bu = got["exact"], got["budget"]
        self.assertEqual(sorted(bu["entropy"]), list(range(steps)))
        for step in range(steps):
            for m in ("entropy", "entropy_norm", "max_logit"):
                np.testing.assert_allclose(bu[m][step], ex[m][step], rtol=1e-6, atol=1e-7, err_msg="%s %d" % (m, step))
            for m in ("sigma_qk", "logit_scale"):
                self.assertTrue((bu[m][step] >= ex[m][step] * (1 - 1e-7)).all(), (m, step, bu[m][step], ex[m][step]))
                np.testing.assert_allclose(bu[m][step], ex[m][step], rtol=2e-2, err_msg="%s %d" % (m, step))
            # the bound is a bound: never above the theorem at the real logit norms (float32 storage: 1e-6)
            for kind in ("budget", "exact"):
                b = got[kind]["entropy_bound"][step]
                self.assertTrue((b <= want[step] * (1 + 1e-6) + 1e-7).all(), (kind, step, b, want[step]))
        return bu, ex

    def test_budgeted_equals_exact_and_the_bound_holds(self):
        self.watch_both("host")

    def test_the_sync_free_path_too(self):
        et._SYNC_FREE_ON_CPU = True
        self.watch_both("syncfree")


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def perf_counter(self):
        return self.t


@unittest.skipIf(SKIP, "needs torch, and ctypes cannot load a sanitizer-instrumented library")
class Budget(unittest.TestCase):
    def loop(self, steps, probe_s, every=None, examples=4, budget=0.02):
        """A loop of 100 ms steps whose probes cost probe_s (x examples / 4)."""
        clock = FakeClock()
        real_time, real_metrics = et.time, et._metrics
        mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        run = entropyd.init("budget", layers=1, heads=2, seq_len=4, daemon="")
        seen = []
        self.cost_at = {}

        def metrics(q, *a, **kw):
            clock.t += probe_s * q.shape[0] / 4
            return real_metrics(q, *a, **kw)
        try:
            et.time = clock
            et._metrics = metrics
            w = et.watch(mha, run, budget=budget, every=every, examples=examples)
            x = torch.randn(4, 4, 8)
            for step in range(steps):
                clock.t += 0.1
                before = w.probes
                mha(x, x, x, need_weights=False)
                w.log(step, loss=1.0)
                clock.t += 0.0001
                if w.probes > before:
                    seen.append((step, w.examples))
                self.cost_at[step] = w.cost
        finally:
            et.time, et._metrics = real_time, real_metrics
            run.finish(None)
        return w, seen

    def test_interval_follows_the_budget(self):
        # a probe of 10 ms against a 100.1 ms step and 2%: ceil(10 / 2.002) = 5
        w, seen = self.loop(60, 0.010)
        self.assertEqual(seen[:2], [(0, 4), (4, 4)])        # the first probe is warm-up; the second 4 steps on
        steps = [s for s, _ in seen]
        self.assertEqual(steps[2:], list(range(9, 60, 5)), steps)
        self.assertEqual(w.interval, 5)
        w, seen = self.loop(60, 0.010, budget=0.05)         # 5%: every 2nd step
        self.assertEqual([s for s, _ in seen][2:], list(range(6, 60, 2)), seen)

    def test_examples_halve_when_probes_are_dear(self):
        # 120 ms a probe at 4 examples: interval 60 > 16, so 2 examples (30 > 16), then 1 (15)
        w, seen = self.loop(200, 0.120)
        self.assertEqual([e for _, e in seen[:4]], [4, 2, 1, 1], seen)
        self.assertEqual(w.interval, 15, seen)
        # and, settled, the watch's own cost stays within the budget
        self.assertLessEqual(self.cost_at[199] - self.cost_at[49], 0.02 * 150 * 0.1 + 1e-9, seen)

    def test_probe_runs_on_one_thread_and_restores_the_count(self):
        # torch on every core: the probe's small ops run serially (thread-pool handoffs cost more than
        # the work on a busy machine), and the loop's thread count is back after each probe and log
        one = et._serial(torch.device("cpu"))
        if one._omp_set is None:
            self.skipTest("no OpenMP runtime found in the process")
        inside = []
        real_metrics, before = et._metrics, torch.get_num_threads()

        def metrics(*a, **kw):
            inside.append(torch.get_num_threads())
            return real_metrics(*a, **kw)
        mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        run = entropyd.init("threads", layers=1, heads=2, seq_len=4, daemon="")
        try:
            torch.set_num_threads(2)
            et._metrics = metrics
            w = et.watch(mha, run, every=1)
            x = torch.randn(4, 4, 8)
            for step in range(3):
                mha(x, x, x, need_weights=False)
                w.log(step, loss=1.0)
                self.assertEqual(torch.get_num_threads(), 2)
        finally:
            et._metrics = real_metrics
            torch.set_num_threads(before)
            run.finish(None)
        self.assertEqual(inside, [1, 1, 1])

    def test_every_forces_the_cadence(self):
        w, seen = self.loop(20, 0.050, every=3)
        self.assertEqual([s for s, _ in seen], list(range(0, 20, 3)))
        self.assertEqual({e for _, e in seen}, {4})


@unittest.skipIf(SKIP, "needs torch, and ctypes cannot load a sanitizer-instrumented library")
class Examples(unittest.TestCase):
    """examples/torch_custom_attention.py and torch_encoder.py, a few steps
    each, so they cannot rot (torch_ddp.py: e2e_torchrun.py; pytorch_lm.py:
    e2e_python.py)."""

    def setUp(self):
        self.d = Daemon().start()

    def tearDown(self):
        self.d.cleanup()

    def test_examples_run_and_store_their_metrics(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
        procs = {}
        for run, ex, extra in (("ex-custom", "torch_custom_attention.py", []),
                               ("ex-encoder", "torch_encoder.py", ["--batch", "8"])):
            procs[run] = subprocess.Popen([sys.executable, os.path.join(ROOT, "examples", ex), "--daemon",
                                           "unix:" + self.d.sock, "--run", run, "--steps", "12"] + extra,
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for run, p in procs.items():
            out, _ = p.communicate(timeout=300)
            self.assertEqual(p.returncode, 0, out)
            self.assertIn("run %s, 12 steps" % run, out)
            steps = [s for (s,) in self.d.query("SELECT s.step FROM steps s JOIN runs r ON r.id = s.run_id "
                                                "WHERE r.name = ? ORDER BY s.step", (run,))]
            self.assertEqual(steps, list(range(12)), out)
            ent = frames(self.d, run, "entropy_norm")
            self.assertEqual(sorted(ent)[:2], [0, 4], out)          # the budget's first two probes
            for m in ("entropy_norm", "sigma_qk", "entropy_bound"):
                v = frames(self.d, run, m)[0]
                self.assertEqual(v.shape, (8,), (m, out))           # 2 layers x 4 heads, all reported
                self.assertTrue(np.isfinite(v).all(), (m, v, out))
            e = ent[0]
            self.assertTrue(((e > 0) & (e <= 1)).all(), e)
            b, h = frames(self.d, run, "entropy_bound")[0], frames(self.d, run, "entropy")[0]
            self.assertTrue((b <= h + 1e-5).all(), (b, h))


if __name__ == "__main__":
    unittest.main(verbosity=2)
