#!/usr/bin/env python3
"""sigmatrain --on-alert against the real entropyd: the trainer's
response to an alert.

1. rollback: the documented unstable config (docs/demo.md:
   post-LN, Adam, lr 0.1, no clip, --reparam none) collapses; entropyd, with
   only entropy_collapse (entropy_norm < 0.01 for 20 steps, the default),
   fires; the trainer restores its newest in-memory snapshot from before the
   alert's start_step, divides lr by 100 and completes (exit 0, run
   finished). The daemon keeps the abandoned steps apart (a `branches` row),
   records the trainer's "rollback from step S to step C" event, and every
   step 1..N is stored exactly once.
2. stop: the same run with --on-alert stop saves a checkpoint, ends the run
   "aborted" and exits 5.
3. --max-rollbacks 2 without lowering lr: the third collapse ends the run
   as stop does.
4. checkpoint: a checkpoint lands in the --spool directory, the run goes on.

Env: SIGMATRAIN, ENTROPYD (binaries). python3 standard library only."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import COLLAPSE_ONLY_RULES, UNSTABLE_ARGS, Daemon, ROOT  # noqa: E402

SIGMATRAIN = os.environ.get("SIGMATRAIN") or os.path.join(ROOT, "build", "sigmatrain")


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def daemon(tmp, name):
    rules = os.path.join(tmp, "rules.json")
    with open(rules, "w") as f:
        json.dump(COLLAPSE_ONLY_RULES, f)
    data = os.path.join(tmp, name)
    os.makedirs(data)
    return Daemon(data=data, args=["--rules", rules]).start()


def train(d, run, extra, timeout=120):
    cmd = [SIGMATRAIN] + UNSTABLE_ARGS + ["--daemon", "unix:" + d.sock, "--run", run] + extra
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def test_rollback(tmp):
    d = daemon(tmp, "d1")
    steps = 200
    t0 = time.time()
    try:
        rc, out = train(d, "rb", ["--steps", str(steps), "--on-alert", "rollback", "--rollback-every", "10", "--rollback-keep", "20",
                                  "--rollback-lr-scale", "0.01"])
        check(rc == 0, "sigmatrain exit %d:\n%s" % (rc, out[-3000:]))
        m = re.search(r"rollback from step (\d+) to step (\d+) \(alert entropy_collapse, started at step (\d+)\)", out)
        check(m, "no rollback:\n" + out[-3000:])
        s, c, start = (int(x) for x in m.groups())
        check(c < start <= s and c % 10 == 0, "rollback %d -> %d, alert start %d" % (s, c, start))
        check(re.search(r"summary: steps %d " % steps, out), "no summary:\n" + out[-2000:])
    finally:
        d.stop()
    d.start()
    try:
        rid, status = d.query("SELECT id, status FROM runs WHERE name = 'rb'")[0]
        check(status == "finished", "run status %r" % status)
        br = d.query("SELECT from_step, to_step FROM branches WHERE run_id = ?", (rid,))
        check(len(br) >= 1 and br[0][0] == c + 1 and br[0][1] >= s, "branches %r (rollback %d -> %d)" % (br, s, c))
        ev = [t for (t,) in d.query("SELECT text FROM events WHERE run_id = ?", (rid,))]
        check(any(t.startswith("rollback from step %d to step %d" % (s, c)) for t in ev), "events %r" % ev)
        n, distinct, lo, hi = d.query("SELECT count(*), count(DISTINCT step), min(step), max(step) FROM steps "
                                      "WHERE run_id = ?", (rid,))[0]
        check((n, distinct, lo, hi) == (steps, steps, 1, steps), "steps %r" % ((n, distinct, lo, hi),))
    finally:
        d.stop()
    print("rollback: from step %d to %d (collapse from step %d), %d rollback event(s), %d steps once each, %.1f s"
          % (s, c, start, sum("rollback from" in t for t in ev), steps, time.time() - t0))


def test_stop(tmp):
    d = daemon(tmp, "d2")
    t0 = time.time()
    try:
        ck = os.path.join(tmp, "stop-{step}.ckpt")
        rc, out = train(d, "st", ["--steps", "400", "--on-alert", "stop", "--save", ck])
        check(rc == 5, "expected exit 5, got %d:\n%s" % (rc, out[-3000:]))
        m = re.search(r"saved (\S+stop-(\d+)\.ckpt)", out)
        check(m and os.path.getsize(m.group(1)) > 0, "no checkpoint saved:\n" + out[-2000:])
        stopped = int(m.group(2))
        check(stopped < 400, "stopped at %d" % stopped)
    finally:
        d.stop()
    d.start()
    try:
        (status,), = d.query("SELECT status FROM runs WHERE name = 'st'")
        check(status == "aborted", "run status %r" % status)
    finally:
        d.stop()
    print("stop: exit 5 at step %d, checkpoint saved, run aborted, %.1f s" % (stopped, time.time() - t0))


def test_max_rollbacks(tmp):
    d = daemon(tmp, "d4")
    try:  # lr unchanged: it collapses again after each rollback
        rc, out = train(d, "mx", ["--steps", "400", "--on-alert", "rollback", "--rollback-every", "10", "--rollback-keep", "20",
                                  "--max-rollbacks", "2", "--save", os.path.join(tmp, "mx-{step}.ckpt")])
        check(rc == 5, "expected exit 5, got %d:\n%s" % (rc, out[-3000:]))
        check(out.count("rollback from step") == 2 and "--max-rollbacks reached" in out, out[-3000:])
    finally:
        d.stop()
    d.start()
    try:
        rid, status = d.query("SELECT id, status FROM runs WHERE name = 'mx'")[0]
        check(status == "aborted", "run status %r" % status)
        (nb,), = d.query("SELECT count(*) FROM branches WHERE run_id = ?", (rid,))
        check(nb == 2, "%d branches" % nb)
        n, distinct = d.query("SELECT count(*), count(DISTINCT step) FROM steps WHERE run_id = ?", (rid,))[0]
        check(n == distinct, "steps %d, distinct %d" % (n, distinct))
    finally:
        d.stop()
    print("max-rollbacks 2: two rollbacks, then the third collapse stopped the run (exit 5, aborted, 2 branches)")


def test_checkpoint(tmp):
    d = daemon(tmp, "d3")
    spool = os.path.join(tmp, "spool3")
    try:
        # the alert fires at about step 46 (collapse from ~26, for 20 steps) and
        # reaches the trainer a few hundred ms later (the sender is paced at
        # 100 ms, the daemon evaluates after commit): 80 steps (~0.4 s) were
        # over before it came on a loaded machine, 300 leave it ~1 s more
        rc, out = train(d, "ck", ["--steps", "300", "--on-alert", "checkpoint", "--spool", spool])
        check(rc == 0, "sigmatrain exit %d:\n%s" % (rc, out[-3000:]))
        m = re.search(r"saved (\S+/ck-step(\d+)\.ckpt)", out)
        check(m and os.path.dirname(m.group(1)) == spool and os.path.getsize(m.group(1)) > 0,
              "no checkpoint in the spool:\n" + out[-2000:])
    finally:
        d.stop()
    print("checkpoint: saved %s, run went on to the end" % os.path.basename(m.group(1)))


def main():
    with tempfile.TemporaryDirectory(prefix="e2e-rollback-") as tmp:
        test_rollback(tmp)
        test_stop(tmp)
        test_checkpoint(tmp)
        test_max_rollbacks(tmp)
    print("ok")


if __name__ == "__main__":
    main()
