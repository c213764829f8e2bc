"""End-to-end test of `make experiments --quick`: runs
research/experiments.py --part predict --quick (the real entropyd with its
built-in rules and four short real sigmatrain runs, research/sweep.py
QUICK: two that collapse in their first steps, two that train fine) into a
scratch directory, then checks the daemon's own alerts as the driver
recorded them (quick.json): on every run that collapses a collapse_risk*
rule fired before entropy_collapse fired, and no later than entropy_drop
(the early collapses); on the runs that train fine no
collapse_risk* rule fired at all. Standard library only."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import BUILD, ENTROPYD, ROOT  # noqa: E402

SIGMATRAIN = os.environ.get("SIGMATRAIN") or os.path.join(ROOT, BUILD, "sigmatrain")


class QuickExperiments(unittest.TestCase):
    def test_predictor_fires_before_collapse_and_never_on_healthy_runs(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            env = dict(os.environ, ENTROPYD=ENTROPYD, SIGMATRAIN=SIGMATRAIN)
            p = subprocess.run([sys.executable, os.path.join(ROOT, "research", "experiments.py"), "--part",
                                "predict", "--quick", "--scratch", os.path.join(tmp, "scratch"), "--out", out],
                               env=env, capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            runs = json.load(open(os.path.join(out, "quick.json")))
        self.assertEqual(len(runs), 4, runs)
        collapsing = [r for r in runs if r["collapsed"]]
        healthy = [r for r in runs if r["healthy"]]
        self.assertEqual((len(collapsing), len(healthy)), (2, 2), runs)
        for r in collapsing:
            self.assertIsNotNone(r["risk_fires"], r)
            self.assertLess(r["risk_fires"], r["collapse_fires"], r)
            if r["entropy_drop_fires"] is not None:
                self.assertLessEqual(r["risk_fires"], r["entropy_drop_fires"], r)
        for r in healthy:
            self.assertIsNone(r["risk_fires"], r)


if __name__ == "__main__":
    unittest.main()
