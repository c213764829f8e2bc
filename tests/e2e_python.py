#!/usr/bin/env python3
"""End-to-end tests of the Python package python/entropyd (a ctypes binding
over build/libentropyd_telemetry.so) and entropyd.torch, against the real
entropyd:

- NaN / Inf values (scalars, layer and head arrays, meta) are stored as
  non-finite and the run goes on (a stdlib json.dumps client sends NaN
  literals: the daemon rejects the line and the run stalls);
- the daemon SIGKILLed and restarted mid-run: every step stored exactly once;
- `python3 -m entropyd upload DIR` uploads a spool left behind;
- entropyd.torch.attention_metrics equals an independent numpy computation;
- sigma_reparam's forward and gradients equal trainer/sreparam.c's on the same
  weights (a small C program linked with build/libtrainer.a);
- examples/pytorch_lm.py: the high-lr baseline fires entropy_collapse, its
  --sigma-reparam twin does not (through the HTTP API), and the alert reaches
  the training loop.

Needs numpy (and python3-torch for the torch parts): when the python3 on
PATH has no numpy, the test re-runs itself with /usr/bin/python3 (Debian's,
where scripts/deps.sh installs python3-numpy and python3-torch).
Under SANITIZE the library is instrumented and cannot be loaded by ctypes
without preloading the sanitizer runtime: skipped."""
import os
import sys

try:
    import numpy as np
except ImportError:
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

import glob  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import unittest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from daemon_harness import BUILD, Daemon, ROOT, floats, COLLAPSE_ONLY_RULES, use_python_client  # noqa: E402,F401

SANITIZE = os.environ.get("SANITIZE", "")
use_python_client()

try:
    import torch
except ImportError:
    torch = None

if not SANITIZE:
    import entropyd


def frame(d, run, metric, step):
    rows = d.query("SELECT f.data FROM frames f JOIN metrics m ON m.id = f.metric_id JOIN runs r ON r.id = m.run_id "
                   "WHERE r.name = ? AND m.name = ? AND f.step = ?", (run, metric, step))
    return floats(rows[0][0]) if rows else None


def steps_of(d, run):
    return [r[0] for r in d.query("SELECT s.step FROM steps s JOIN runs r ON r.id = s.run_id WHERE r.name = ? "
                                  "ORDER BY s.step", (run,))]


@unittest.skipIf(SANITIZE, "ctypes cannot load a sanitizer-instrumented library")
class PythonClientTest(unittest.TestCase):
    def setUp(self):
        self.d = Daemon().start()
        self.addr = "unix:" + self.d.sock

    def tearDown(self):
        self.d.cleanup()

    def test_non_finite_values_are_stored_and_the_run_goes_on(self):
        run = entropyd.init("py-nan", layers=2, heads=3, seq_len=8, daemon=self.addr,
                            config={"lr": float("nan"), "note": "meta with a NaN"})
        for s in range(10):
            bad = s in (3, 4)
            heads = np.arange(6, dtype=np.float32).reshape(2, 3) + s
            if bad:
                heads[1, 2] = np.inf
            run.log(s, scalars={"loss": float("nan") if bad else 1.0 / (s + 1)},
                    layers={"rank_ratio": [float("-inf") if bad else 0.5, 0.25]}, heads={"entropy": heads})
        run.event("a warning", level="warn")
        self.assertTrue(run.finish("finished"))
        self.assertEqual(steps_of(self.d, "py-nan"), list(range(10)))
        self.assertTrue(math.isnan(frame(self.d, "py-nan", "loss", 3)[0]))
        self.assertAlmostEqual(frame(self.d, "py-nan", "loss", 5)[0], 1 / 6, places=6)
        self.assertTrue(math.isnan(frame(self.d, "py-nan", "rank_ratio", 4)[0]))
        e = frame(self.d, "py-nan", "entropy", 4)
        self.assertTrue(math.isnan(e[5]) and e[0] == 4.0, e)
        st, meta = self.d.query("SELECT status, meta FROM runs WHERE name = 'py-nan'")[0]
        self.assertEqual(st, "finished")
        self.assertIsNone(json.loads(meta)["lr"])
        self.assertEqual(self.d.query("SELECT level, text FROM events WHERE text = 'a warning'"), [("warn", "a warning")])

    def test_values_of_every_kind(self):
        run = entropyd.init("py-kinds", layers=2, heads=2, seq_len=4, daemon=self.addr)
        run.log(0, scalars={"a": 1, "b": np.float32(2.5)}, heads={"h": [[1, 2], [3, 4]]}, layers={"l": (5, 6)})
        if torch is not None:
            run.log(1, scalars={"a": torch.tensor(3.0)}, heads={"h": torch.arange(4.0).view(2, 2).requires_grad_()})
        with self.assertRaises(ValueError):
            run.log(2, heads={"h": [1, 2, 3]})       # wrong size
        with self.assertRaises(ValueError):
            run.log(2, scalars={"bad name!": 1.0})   # not [A-Za-z0-9._:-]
        self.assertTrue(run.finish())
        self.assertEqual(frame(self.d, "py-kinds", "h", 0), [1, 2, 3, 4])
        self.assertEqual(frame(self.d, "py-kinds", "b", 0), [2.5])
        if torch is not None:
            self.assertEqual(frame(self.d, "py-kinds", "h", 1), [0, 1, 2, 3])
        self.assertNotIn(2, steps_of(self.d, "py-kinds"))

    def test_daemon_killed_and_restarted_mid_run(self):
        spool = tempfile.mkdtemp(prefix="py-spool-")
        try:
            run = entropyd.init("py-kill", layers=2, heads=2, seq_len=4, daemon=self.addr, spool_dir=spool,
                                queue_slots=1024)
            heads = np.ones((2, 2), np.float32)
            for s in range(300):
                run.log(s, scalars={"loss": float("nan") if 200 <= s < 210 else 1.0 + s}, heads={"h": heads * s})
                if s == 100:
                    run.flush(10)
                    self.d.kill9()
                if s == 150:
                    self.d.start()
                time.sleep(0.002)  # not a wait: paces the run, so the daemon is down for some of its steps
            self.assertTrue(run.finish("finished", grace=60))
            st = run.stats()
            self.assertGreaterEqual(st["reconnects"], 1)
            got = steps_of(self.d, "py-kill")
            self.assertEqual(got, list(range(300)))  # once each (steps is keyed by (run, step))
            n = self.d.query("SELECT count(*) FROM frames f JOIN metrics m ON m.id = f.metric_id "
                             "JOIN runs r ON r.id = m.run_id WHERE r.name = 'py-kill' AND m.name = 'loss'")[0][0]
            self.assertEqual(n, 300)
            self.assertTrue(math.isnan(frame(self.d, "py-kill", "loss", 205)[0]))
            self.assertEqual(frame(self.d, "py-kill", "loss", 250), [251.0])
            self.assertEqual(self.d.query("SELECT status, last_seq FROM runs WHERE name = 'py-kill'"),
                             [("finished", 301)])
        finally:
            shutil.rmtree(spool, ignore_errors=True)

    def test_upload_command(self):
        spool = tempfile.mkdtemp(prefix="py-spool-")
        try:
            nobody = "unix:" + os.path.join(spool, "nobody.sock")
            run = entropyd.init("py-left", layers=1, heads=1, seq_len=4, daemon=nobody, spool_dir=spool)
            for s in range(7):
                run.log(s, scalars={"loss": s})
            self.assertFalse(run.finish("finished", grace=0, quiet=True))
            r = subprocess.run([sys.executable, "-m", "entropyd", "upload", spool, "--daemon", self.addr],
                               cwd=os.path.join(ROOT, "python"), capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("every run acknowledged", r.stdout)
            self.assertEqual(steps_of(self.d, "py-left"), list(range(7)))
            self.assertEqual(self.d.query("SELECT status FROM runs WHERE name = 'py-left'"), [("finished",)])
        finally:
            shutil.rmtree(spool, ignore_errors=True)

    def test_reused_name_with_another_shape_raises_at_init(self):
        """init raises with the daemon's message; the first run, still
        streaming, is neither superseded nor touched; stats() after finish
        are the final counters."""
        first = entropyd.init("py-shape", layers=2, heads=2, seq_len=8, daemon=self.addr)
        for s in range(10):
            first.log(s, scalars={"loss": s}, heads={"entropy": [[0.5, 0.5], [0.5, 0.5]]})
        self.assertTrue(first.flush(20))
        with self.assertRaises(entropyd.RunRefused) as cm:
            entropyd.init("py-shape", layers=3, heads=2, seq_len=8, daemon=self.addr)
        self.assertIn("shape_mismatch", str(cm.exception))
        self.assertIn("has 2 layers x 2 heads, not 3 x 2", str(cm.exception))
        for s in range(10, 150):
            first.log(s, scalars={"loss": s})
        self.assertTrue(first.finish("finished"))
        st = first.stats()
        self.assertEqual((st["acked"], st["next_seq"], st["enqueued"]), (151, 152, 151), st)
        self.assertEqual(steps_of(self.d, "py-shape"), list(range(150)))
        self.assertEqual(self.d.query("SELECT status, layers FROM runs WHERE name = 'py-shape'"), [("finished", 2)])

    def test_private_spool_is_kept_when_nothing_was_acknowledged(self):
        """No daemon for the whole grace period and no spool_dir: finish says
        where the steps are, they are there, and the upload command sends
        them."""
        tmp = tempfile.mkdtemp(prefix="py-private-")
        try:
            nobody = "unix:" + os.path.join(tmp, "nobody.sock")
            code = ("import entropyd\n"
                    "r = entropyd.init('py-private', layers=1, heads=1, seq_len=4, daemon=%r)\n"
                    "for s in range(5): r.log(s, scalars={'loss': s})\n"
                    "assert not r.finish('finished', grace=0)\n" % nobody)
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, TMPDIR=tmp, PYTHONPATH=os.path.join(ROOT, "python")))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            kept = glob.glob(os.path.join(tmp, "telemetry-*"))
            self.assertEqual(len(kept), 1, r.stderr)
            self.assertIn("the other 6 are in the spool " + os.path.join(kept[0], "py-private"), r.stderr)
            self.assertTrue(os.path.exists(os.path.join(kept[0], "py-private", "hello.json")))
            u = subprocess.run([sys.executable, "-m", "entropyd", "upload", kept[0], "--daemon", self.addr],
                               capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
            self.assertEqual(u.returncode, 0, u.stdout + u.stderr)
            self.assertEqual(steps_of(self.d, "py-private"), list(range(5)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- torch

def np_metrics(q, k, x, wq, wk, bq, bk):
    """The probe's definitions (science.md, trainer/probe.h), in float64 numpy,
    written independently of entropyd.torch."""
    B, H, T, d = q.shape
    C = x.shape[2]
    out = {n: np.zeros(H) for n in ("entropy", "entropy_norm", "max_logit", "sigma_qk", "entropy_bound",
                                    "logit_scale", "eig_mean", "eig_var")}
    for h in range(H):
        Wq, Wk = wq[h * d:(h + 1) * d].astype(np.float64), wk[h * d:(h + 1) * d].astype(np.float64)
        P = Wq.T @ Wk                                                 # (C, C): a_ij = x_i^T P x_j / sqrt(d) + ...
        out["sigma_qk"][h] = np.linalg.norm(P, 2) / math.sqrt(d)
        ev = np.linalg.eigvals(Wk @ Wq.T / math.sqrt(d))             # the non-zero eigenvalues of P / sqrt(d)
        out["eig_mean"][h] = ev.mean().real
        out["eig_var"][h] = np.mean(np.abs(ev - ev.mean()) ** 2)
        Pa = np.concatenate([Wq, bq[h * d:(h + 1) * d, None]], 1).T @ Wk   # the key bias is constant along a row
        sig_b = np.linalg.norm(Pa, 2) / math.sqrt(d)
        es, ens, bs, ml, sc = 0.0, 0.0, 0.0, 0.0, 0.0
        for b in range(B):
            xt = np.concatenate([x[b].astype(np.float64), np.ones((T, 1))], 1)
            xs = np.linalg.norm(x[b].astype(np.float64), 2)
            for i in range(T):
                a = np.array([q[b, h, i].astype(np.float64) @ k[b, h, j] / math.sqrt(d) for j in range(i + 1)])
                ml = max(ml, np.abs(a).max())
                p = np.exp(a - a.max())
                p /= p.sum()
                e = -sum(pj * math.log(pj) for pj in p if pj > 0)
                es += e
                if i >= 1:
                    ens += e / math.log(i + 1)
                Ti, s = i + 1, sig_b * xs * np.linalg.norm(xt[i])
                sc = max(sc, s)
                if Ti > 1:
                    beta = math.exp(-s * math.sqrt(Ti / (Ti - 1)))
                    den = 1 + (Ti - 1) * beta
                    bs += math.log(den) + s * math.sqrt(Ti * (Ti - 1)) * beta / den
        out["entropy"][h] = es / (B * T)
        out["entropy_norm"][h] = ens / (B * (T - 1))
        out["entropy_bound"][h] = bs / (B * T)
        out["max_logit"][h] = ml
        out["logit_scale"][h] = sc
    rr, cs = 0.0, 0.0
    for b in range(B):
        X = x[b].astype(np.float64)
        rr += np.linalg.norm(X - X.mean(0)) / np.linalg.norm(X)
        U = X / np.linalg.norm(X, axis=1, keepdims=True)
        G = U @ U.T
        cs += (G.sum() - T) / (T * (T - 1))
    return out, {"rank_ratio": rr / B, "cos_sim": cs / B}


SREPARAM_REF = r"""
#include "sreparam.h"
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    int out, in; float gamma;
    if (scanf("%d %d %f", &out, &in, &gamma) != 3) return 1;
    long n = (long)out * in;
    float *w = malloc(4 * n), *g = malloc(4 * n), *dw = calloc(n, 4), *weff = malloc(4 * n);
    float *u = malloc(4 * in), *v = calloc(out, 4), *work = malloc(4 * in), dgamma = 0;
    for (long i = 0; i < n; i++) if (scanf("%f", &w[i]) != 1) return 1;
    for (int i = 0; i < in; i++) if (scanf("%f", &u[i]) != 1) return 1;
    for (long i = 0; i < n; i++) if (scanf("%f", &g[i]) != 1) return 1;
    sreparam_linear l = {.out = out, .in = in, .w = w, .dw = dw, .gamma = &gamma,
                         .dgamma = &dgamma, .weff = weff, .u = u, .v = v};
    sreparam_power_step(&l, work);
    sreparam_forward(&l);
    sreparam_backward(&l, g, 1);
    printf("%.9g\n", l.sigma);
    for (long i = 0; i < n; i++) printf("%.9g ", weff[i]);
    printf("\n");
    for (long i = 0; i < n; i++) printf("%.9g ", dw[i]);
    printf("\n%.9g\n", dgamma);
    return 0;
}
"""


@unittest.skipIf(SANITIZE, "ctypes cannot load a sanitizer-instrumented library")
@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TorchTest(unittest.TestCase):
    def test_metrics_equal_numpy(self):
        import entropyd.torch as et
        g = torch.Generator().manual_seed(3)
        B, H, T, d, C = 2, 3, 9, 4, 12
        x = torch.randn(B, T, C, generator=g)
        wq, wk = torch.randn(H * d, C, generator=g) * 0.5, torch.randn(H * d, C, generator=g) * 0.5
        bq, bk = torch.randn(H * d, generator=g) * 0.1, torch.randn(H * d, generator=g) * 0.1
        q = (x @ wq.T + bq).view(B, T, H, d).transpose(1, 2)
        k = (x @ wk.T + bk).view(B, T, H, d).transpose(1, 2)
        heads, layer = et.attention_metrics(q, k, x, None, wq, wk, bq, bk)
        ref, lref = np_metrics(q.numpy(), k.numpy(), x.numpy(), wq.numpy(), wk.numpy(), bq.numpy(), bk.numpy())
        for i, name in enumerate(et.HEAD_METRICS):
            np.testing.assert_allclose(heads[i].numpy(), ref[name], rtol=2e-4, atol=2e-5, err_msg=name)
        for i, name in enumerate(et.LAYER_METRICS):
            np.testing.assert_allclose(layer[i].item(), lref[name], rtol=2e-4, atol=2e-5, err_msg=name)
        # the bound is a bound
        self.assertTrue(bool((heads[4] <= heads[0] + 1e-5).all()), (heads[4], heads[0]))

    def test_mha_hook_sees_what_the_layer_computes(self):
        import entropyd.torch as et
        torch.manual_seed(0)
        E, H, T, B = 16, 4, 8, 3
        mha = torch.nn.MultiheadAttention(E, H, batch_first=True)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
        run = entropyd.init("py-hook", layers=1, heads=H, seq_len=T, daemon="")
        w = et.watch(mha, run, examples=2)
        x = torch.randn(B, T, E)
        _, attn = mha(x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False)
        h, _ = w._out[0]
        A = attn[:2].detach().double()
        ent = -(torch.special.xlogy(A, A)).sum(-1)                 # (2, H, T)
        np.testing.assert_allclose(h[0].numpy(), ent.mean(dim=(0, 2)).numpy(), rtol=1e-4, atol=1e-5)
        run.finish(None)

    def test_sigma_reparam_equals_the_c_implementation(self):
        import entropyd.torch as et
        tmp = tempfile.mkdtemp(prefix="sreparam-ref-")
        try:
            src = os.path.join(tmp, "ref.c")
            open(src, "w").write(SREPARAM_REF)
            exe = os.path.join(tmp, "ref")
            libs = subprocess.run(["pkg-config", "--libs", "openblas"], capture_output=True, text=True).stdout.split()
            cflags = subprocess.run(["pkg-config", "--cflags", "openblas"], capture_output=True, text=True).stdout.split()
            cc = subprocess.run(["cc", "-std=c11", "-O1", "-I" + os.path.join(ROOT, "trainer"), src,
                                 os.path.join(BUILD, "libtrainer.a"), "-o", exe] + cflags + libs + ["-llapacke", "-lm"],
                                capture_output=True, text=True)
            self.assertEqual(cc.returncode, 0, cc.stderr)
            g = torch.Generator().manual_seed(5)
            out, inn = 7, 5
            lin = torch.nn.Linear(inn, out, bias=False)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(out, inn, generator=g))
            et.sigma_reparam(lin, gamma_init="one")
            p = lin.parametrizations.weight
            with torch.no_grad():
                p[0].gamma.fill_(1.7)
                p[0].u.copy_(torch.nn.functional.normalize(torch.randn(inn, generator=g), dim=0))  # not converged
            W = p.original.detach().clone()
            u0 = p[0].u.clone()
            G = torch.randn(out, inn, generator=g)
            lin.train()
            y = lin(torch.zeros(1, inn))            # the forward pre-hook: one power step
            del y
            weff = lin.weight
            (weff * G).sum().backward()            # dL/dW_hat = G
            text = "%d %d %.9g\n%s\n%s\n%s\n" % (out, inn, 1.7, " ".join("%.9g" % v for v in W.flatten().tolist()),
                                                 " ".join("%.9g" % v for v in u0.tolist()),
                                                 " ".join("%.9g" % v for v in G.flatten().tolist()))
            r = subprocess.run([exe], input=text, capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.split("\n")
            c_sigma = float(lines[0])
            c_weff = np.array(lines[1].split(), dtype=np.float64)
            c_dw = np.array(lines[2].split(), dtype=np.float64)
            c_dgamma = float(lines[3])
            self.assertAlmostEqual(p[0].sigma.item(), c_sigma, delta=1e-5 * c_sigma)
            np.testing.assert_allclose(weff.detach().flatten().numpy(), c_weff, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(p.original.grad.flatten().numpy(), c_dw, rtol=1e-4, atol=1e-5)
            self.assertAlmostEqual(p[0].gamma.grad.item(), c_dgamma, delta=1e-4 * max(1, abs(c_dgamma)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_example_baseline_collapses_and_its_sigma_reparam_twin_does_not(self):
        d = Daemon(http=True).start()
        try:
            env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
            ex = os.path.join(ROOT, "examples", "pytorch_lm.py")
            steps = os.environ.get("LM_STEPS", "60")
            procs = {}
            for run, extra in (("lm-baseline", []), ("lm-sigma", ["--sigma-reparam"])):
                procs[run] = subprocess.Popen([sys.executable, ex, "--daemon", "unix:" + d.sock, "--run", run,
                                               "--steps", steps] + extra, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True)
            outs = {}
            for run, p in procs.items():
                outs[run], _ = p.communicate(timeout=600)
                self.assertEqual(p.returncode, 0, outs[run])
            status, alerts = d.get("/api/alerts")
            self.assertEqual(status, 200)
            fired = {(a["run"], a["rule"]) for a in alerts}
            self.assertIn(("lm-baseline", "entropy_collapse"), fired, outs["lm-baseline"])
            self.assertNotIn(("lm-sigma", "entropy_collapse"), fired, outs["lm-sigma"])
            # the alert came back to the training loop (AlertResponder prints it)
            self.assertIn("entropyd alert: entropy_collapse firing", outs["lm-baseline"])
            status, runs = d.get("/api/runs")
            by = {r["name"]: r for r in runs}
            for run in procs:
                self.assertEqual(by[run]["status"], "finished")
                self.assertEqual(by[run]["last_step"], int(steps) - 1)
        finally:
            d.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
