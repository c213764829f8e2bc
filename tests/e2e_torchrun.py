#!/usr/bin/env python3
"""End-to-end test of entropyd.torch under torch.distributed:
examples/torch_ddp.py launched by torchrun with 2 ranks (DDP, gloo on CPU)
against the real entropyd:

- ranks="zero" (the default), the nanoGPT-style model reporting through
  watch.record: one run stored, every step exactly once, probed steps
  with head metrics; rank 1 probes nothing;
- ranks="min", nn.TransformerEncoder, every=3: one run, every step exactly
  once, head metrics on steps 0, 3, 6, ... only, and both ranks probed the
  same number of steps (the agreed schedule: a rank that probed alone would
  hang in the all_reduce, which the timeout turns into a failure);
- ranks="mean", the same model, seed and data as a ranks="min" run in the
  same daemon: every stored head at or above the min run's, and above it
  somewhere (a reduction that did nothing, or took the min, fails).

torchrun of Debian's torch 1.13 under Python 3.11 cannot parse its own
default --redirects/--tee ("0": IntFlag iteration skips the zero member);
the explicit per-rank mapping used here works (docs/pytorch.md).  Needs
/usr/bin/python3 with torch; skipped under SANITIZE (ctypes cannot load the
instrumented library)."""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from daemon_harness import BUILD, Daemon, ROOT, floats  # noqa: E402

SANITIZE = os.environ.get("SANITIZE", "")
PY = "/usr/bin/python3"
HAVE_TORCH = os.path.exists(PY) and subprocess.run([PY, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                                                   capture_output=True).returncode == 0
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "--redirects", "0:1,1:1", "--tee", "0:1,1:1"]


@unittest.skipIf(SANITIZE, "ctypes cannot load a sanitizer-instrumented library")
@unittest.skipIf(not HAVE_TORCH, "no torch with gloo at /usr/bin/python3")
class Torchrun(unittest.TestCase):
    def setUp(self):
        self.d = Daemon().start()

    def tearDown(self):
        self.d.cleanup()

    def launch(self, run, *extra):
        env = dict(os.environ, ENTROPYD_TELEMETRY_LIB=os.path.join(BUILD, "libentropyd_telemetry.so"),
                   OMP_NUM_THREADS="1")
        r = subprocess.run(TORCHRUN + [os.path.join(ROOT, "examples", "torch_ddp.py"), "--daemon",
                                       "unix:" + self.d.sock, "--run", run, "--steps", "12"] + list(extra),
                           env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        return r.stdout

    def steps(self, run):
        return [s for (s,) in self.d.query("SELECT s.step FROM steps s JOIN runs r ON r.id = s.run_id "
                                           "WHERE r.name = ? ORDER BY s.step", (run,))]

    def head_steps(self, run):
        return sorted(s for (s,) in self.d.query(
            "SELECT f.step FROM frames f JOIN metrics m ON m.id = f.metric_id JOIN runs r ON r.id = m.run_id "
            "WHERE r.name = ? AND m.name = 'entropy_norm'", (run,)))

    def test_rank_zero_reports_once(self):
        out = self.launch("ddp-zero")
        self.assertEqual([n for (n,) in self.d.query("SELECT name FROM runs")], ["ddp-zero"])
        self.assertEqual(self.steps("ddp-zero"), list(range(12)))
        self.assertEqual(self.d.query("SELECT count(*) FROM steps")[0][0], 12)
        hs = self.head_steps("ddp-zero")
        self.assertEqual(hs[:2], [0, 4], (hs, out))            # the budget: warm-up probe, then 4 steps on
        self.assertIn("rank 1 done, 0 probed", out)
        self.assertEqual(self.d.query("SELECT status FROM runs WHERE name = 'ddp-zero'"), [("finished",)])

    def test_min_over_ranks_with_an_agreed_schedule(self):
        out = self.launch("ddp-min", "--ranks", "min", "--model", "encoder", "--every", "3")
        self.assertEqual([n for (n,) in self.d.query("SELECT name FROM runs")], ["ddp-min"])
        self.assertEqual(self.steps("ddp-min"), list(range(12)))
        self.assertEqual(self.head_steps("ddp-min"), [0, 3, 6, 9])
        self.assertIn("4 probed (ranks=min)", out)
        self.assertIn("rank 1 done, 4 probed", out)

    def head_values(self, run):
        """{(step, cell): entropy_norm} of run's probed steps (frames of L x H float32s)."""
        out = {}
        for step, data in self.d.query(
                "SELECT f.step, f.data FROM frames f JOIN metrics m ON m.id = f.metric_id JOIN runs r "
                "ON r.id = m.run_id WHERE r.name = ? AND m.name = 'entropy_norm'", (run,)):
            for cell, v in enumerate(floats(data)):
                out[(step, cell)] = v
        return out

    def test_mean_over_ranks_lies_above_the_minimum(self):
        # the same model, seed and data launched twice: under ranks=mean each
        # stored head is the mean of the two ranks' values, under min their
        # minimum, so mean >= min everywhere and > where the ranks differ
        self.launch("ddp-min", "--ranks", "min", "--model", "encoder", "--every", "3")
        out = self.launch("ddp-mean", "--ranks", "mean", "--model", "encoder", "--every", "3")
        self.assertEqual(self.steps("ddp-mean"), list(range(12)))
        self.assertEqual(self.head_steps("ddp-mean"), [0, 3, 6, 9])
        self.assertIn("4 probed (ranks=mean)", out)
        self.assertIn("rank 1 done, 4 probed", out)
        lo, mean = self.head_values("ddp-min"), self.head_values("ddp-mean")
        self.assertEqual(sorted(lo), sorted(mean))
        self.assertTrue(all(mean[k] >= lo[k] - 1e-6 for k in lo), [(k, lo[k], mean[k]) for k in lo if mean[k] < lo[k]])
        self.assertTrue(any(mean[k] > lo[k] + 1e-6 for k in lo), "mean equals min on every cell: not reduced")


if __name__ == "__main__":
    unittest.main(verbosity=2)
