"""End to end: sigmatrain streaming its collapse metrics to a real entropyd.

1. The daemon is killed (SIGKILL) and restarted twice while a run trains:
   every logged step ends up stored exactly once (steps, frames of a scalar,
   a layer and a head metric), the run is `finished`, the summary says every
   message was acknowledged, and the stored per-head values obey the probe's
   invariants (entropy >= entropy_bound, entropy <= log T, 0 <= entropy_norm <= 1).
2. No daemon (unreachable socket): the run trains, exits 0 and leaves a spool;
   `sigmatrain --upload-spool` with the same --run and --spool later uploads
   all of it (and the run's `end`), exactly once; a trainer with another
   shape under that name prints the daemon's shape_mismatch error.
3. Without --daemon nothing of telemetry happens (no telemetry line).

Env: SIGMATRAIN, ENTROPYD (binaries). python3 standard library only.
"""
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Daemon, ROOT  # noqa: E402

SIGMATRAIN = os.environ.get("SIGMATRAIN") or os.path.join(ROOT, "build", "sigmatrain")
L, H, T = 2, 2, 32
TINY = ["--layers", str(L), "--heads", str(H), "--dim", "32", "--seq-len", str(T), "--batch", "4",
        "--threads", "1", "--eval-every", "0"]


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def run_id(d, name):
    rows = d.query("SELECT id, status FROM runs WHERE name = ?", (name,))
    check(len(rows) == 1, "run %s not found: %r" % (name, rows))
    return rows[0]


def metric_steps(d, rid, metric):
    return [r[0] for r in d.query(
        "SELECT f.step FROM frames f JOIN metrics m ON m.id = f.metric_id "
        "WHERE m.run_id = ? AND m.name = ? ORDER BY f.step", (rid, metric))]


def frames(d, rid, metric):
    out = {}
    for step, blob in d.query(
            "SELECT f.step, f.data FROM frames f JOIN metrics m ON m.id = f.metric_id "
            "WHERE m.run_id = ? AND m.name = ?", (rid, metric)):
        out[step] = struct.unpack("<%df" % (len(blob) // 4), blob)
    return out


def check_exactly_once(d, name, steps, status="finished"):
    rid, got_status = run_id(d, name)
    want = list(range(1, steps + 1))
    got = [r[0] for r in d.query("SELECT step FROM steps WHERE run_id = ? ORDER BY step", (rid,))]
    check(got == want, "steps table: %d rows, first missing %r" %
          (len(got), sorted(set(want) - set(got))[:5]))
    for metric in ("loss", "tokens_per_s", "rank_ratio", "sigma_qkv", "entropy", "entropy_bound", "max_logit"):
        s = metric_steps(d, rid, metric)
        check(s == want, "%s: %d frames for %d steps (missing %r, extra %r)" % (
            metric, len(s), steps, sorted(set(want) - set(s))[:5], len(s) - len(set(s))))
    ev = metric_steps(d, rid, "eval_loss")
    check(ev == [steps], "eval_loss at the last step only, got %r" % ev[:5])
    check(status is None or got_status == status, "run status %s" % got_status)
    return rid


def check_values(d, rid):
    ent, bnd, norm = frames(d, rid, "entropy"), frames(d, rid, "entropy_bound"), frames(d, rid, "entropy_norm")
    checked = 0
    for step, e in ent.items():
        check(len(e) == L * H, "entropy frame of %d values" % len(e))
        for k in range(L * H):
            check(e[k] >= bnd[step][k] - 1e-4, "step %d head %d: entropy %g < bound %g" % (step, k, e[k], bnd[step][k]))
            check(0.0 <= e[k] <= math.log(T) + 1e-4, "step %d head %d: entropy %g" % (step, k, e[k]))
            check(-1e-5 <= norm[step][k] <= 1.0 + 1e-5, "entropy_norm %g" % norm[step][k])
            checked += 1
    return checked


def summary_line(out):
    m = re.search(r"telemetry: run \S+ \| enqueued (\d+) \| sent (\d+) \| acked (\d+) of (\d+) \| spooled (\d+).*dropped (\d+)", out)
    check(m, "no telemetry summary in output:\n" + out[-2000:])
    return [int(x) for x in m.groups()]


def test_kill_restart(tmp):
    d = Daemon(data=os.path.join(tmp, "daemon"))
    os.makedirs(d.data)
    d.start()
    # a tiny model trains ~2,000 steps a second on a fast machine, and the
    # client's reconnect backoff (50, 100, 200, 400 ms) can take ~0.75 s:
    # enough steps that the trainer is back before the second kill
    steps = 4000
    spool = os.path.join(tmp, "spool")
    cmd = [SIGMATRAIN] + TINY + ["--steps", str(steps), "--print-every", "100", "--daemon", "unix:" + d.sock,
                                 "--run", "e2e-kill", "--spool", spool]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, kills, back = [], 0, 0
    t0 = time.time()
    for line in p.stdout:
        out.append(line)
        back += line.startswith("telemetry: reconnected")
        m = re.match(r"step\s+(\d+)/", line)
        # the second kill waits until the trainer has reconnected after the first
        if m and kills < 2 and int(m.group(1)) >= steps * (kills + 1) // 3 and back >= kills:
            d.kill9()
            time.sleep(0.2)  # not a wait: the daemon stays down while the trainer spools
            d.start()
            kills += 1
    rc = p.wait(60)
    text = "".join(out)
    check(rc == 0, "sigmatrain exit %d:\n%s" % (rc, text[-3000:]))
    check(kills == 2, "the run ended before two kills (%d):\n%s" % (kills, text[-2000:]))
    enq, sent, acked, total, spooled, dropped = summary_line(text)
    check(dropped == 0 and acked == total and total == spooled, "summary: %r" % ((enq, sent, acked, total, spooled, dropped),))
    check(text.count("telemetry: reconnected") >= 2, "expected two reconnects:\n" + text[-2000:])
    d.stop()  # the db is complete; read it without a writer
    d.start()
    rid = check_exactly_once(d, "e2e-kill", steps)
    n = check_values(d, rid)
    meta = d.query("SELECT meta FROM runs WHERE id = ?", (rid,))[0][0]
    for key in ('"model"', '"optimizer"', '"reparam"', '"norm"', '"seed"', '"data"', '"host"', '"start_time"', '"version"'):
        check(key in meta, "meta lacks %s: %s" % (key, meta))
    d.stop()
    print("kill/restart x2: %d steps stored exactly once, %d head values checked, %.1f s" % (steps, n, time.time() - t0))


def test_spool_then_upload(tmp):
    spool = os.path.join(tmp, "spool2")
    steps = 300
    t0 = time.time()
    r = subprocess.run([SIGMATRAIN] + TINY + ["--steps", str(steps), "--print-every", "100",
                        "--daemon", "unix:" + os.path.join(tmp, "nobody-here.sock"),
                        "--run", "e2e-spool", "--spool", spool,
                        "--end-grace", "1",  # nobody will come: do not wait the default 30 s
                        # a tiny model logs a step every ~50 us: 300 steps can come and go within one
                        # of the sender's idle naps (<= 16 ms), so give the ring room for all of them;
                        # what this test checks is the spool, not ring overflow (test_telemetry does)
                        "--telemetry-queue", "4096"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, "no-daemon run failed (%d):\n%s%s" % (r.returncode, r.stdout, r.stderr))
    # the grace period's progress lines never promise more than the grace left (the
    # last one once said "waiting up to 18446744074 s more", an unsigned underflow)
    waits = [int(w) for w in re.findall(r"waiting up to (\d+) s more", r.stdout + r.stderr)]
    check(all(w <= 1 for w in waits), "progress lines promise more than --end-grace 1: %r" % waits)
    enq, sent, acked, total, spooled, dropped = summary_line(r.stdout + r.stderr)
    check(acked == 0 and dropped == 0 and spooled == total and total >= steps, "summary %r" % ((enq, acked, total, spooled),))
    segs = [f for f in os.listdir(os.path.join(spool, "e2e-spool")) if f.startswith("seg-")]
    check(segs, "no spool segments left")
    d = Daemon(data=os.path.join(tmp, "daemon2"))
    os.makedirs(d.data)
    d.start()
    u = subprocess.run([SIGMATRAIN, "--upload-spool", "--daemon", "unix:" + d.sock, "--run", "e2e-spool",
                        "--spool", spool, "--layers", str(L), "--heads", str(H), "--seq-len", str(T)],
                       capture_output=True, text=True, timeout=90)
    check(u.returncode == 0, "upload failed (%d):\n%s%s" % (u.returncode, u.stdout, u.stderr))
    d.stop()
    d.start()
    check_exactly_once(d, "e2e-spool", steps)
    # a second upload finds nothing new and duplicates nothing
    u2 = subprocess.run([SIGMATRAIN, "--upload-spool", "--daemon", "unix:" + d.sock, "--run", "e2e-spool",
                         "--spool", spool, "--layers", str(L), "--heads", str(H), "--seq-len", str(T)],
                        capture_output=True, text=True, timeout=90)
    check(u2.returncode == 0, "second upload failed:\n%s%s" % (u2.stdout, u2.stderr))
    # (its hello reopens the run, which is left stale: the daemon's rule for a hello)
    check_exactly_once(d, "e2e-spool", steps, status=None)
    # the trainer prints what the daemon refuses: a hello with another shape
    bad = subprocess.run([SIGMATRAIN, "--layers", str(L), "--heads", "4", "--dim", "32", "--seq-len", str(T),
                          "--batch", "4", "--threads", "1", "--eval-every", "0", "--steps", "5",
                          "--daemon", "unix:" + d.sock, "--run", "e2e-spool"], capture_output=True, text=True, timeout=60)
    check("telemetry: daemon error:" in bad.stderr and "shape_mismatch" in bad.stderr,
          "shape_mismatch not printed:\n%s" % bad.stderr[-2000:])
    check_exactly_once(d, "e2e-spool", steps, status=None)
    d.stop()
    print("no daemon: %d steps spooled, uploaded later exactly once, %.1f s" % (steps, time.time() - t0))


def test_no_daemon_no_telemetry(tmp):
    r = subprocess.run([SIGMATRAIN] + TINY + ["--steps", "20"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, r.stderr)
    check("telemetry" not in r.stdout + r.stderr, "telemetry output without --daemon")
    r = subprocess.run([SIGMATRAIN] + TINY + ["--steps", "20", "--spool", tmp], capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "--daemon" in r.stderr, "--spool without --daemon must be refused")
    print("no --daemon: no telemetry")


def main():
    tmp = tempfile.mkdtemp(prefix="e2e-teltrain-")
    try:
        test_no_daemon_no_telemetry(tmp)
        test_kill_restart(tmp)
        test_spool_then_upload(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("e2e_telemetry_trainer: OK")


if __name__ == "__main__":
    main()
