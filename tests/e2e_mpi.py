"""End-to-end test of data-parallel sigmatrain on MPI.

Runs the real build/sigmatrain-mpi under `mpirun -np 2` (1 thread per rank)
and the plain single-process build/sigmatrain on the same global batch, and
compares the parameter arrays of their final checkpoints (ckpt.h's layout):
within 1e-5 relative, for σReparam + AdamW and for the plain model + SGD
with momentum.  Then the 2-rank run streams to a real entropyd (--http off):
the database holds ONE run, finished, with every step, the model's metrics
and the per-rank scalars rank0_/rank1_ tokens_per_s, step_ms, comm_ms.  A
rank that dies mid-run (SIGMATRAIN_DIST_FAULT=1:3:die) leaves that run
`failed`; a rank whose gradient silently differs (1:2:skew) is caught by the
checksum at the next check (exit status 4).  --on-alert rollback and stop
work on 2 ranks (rank 0 hears the alert, every rank answers it alike).
python3 stdlib only."""
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import COLLAPSE_ONLY_RULES, UNSTABLE_ARGS, Daemon  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
SIGMATRAIN = os.environ.get("SIGMATRAIN") or os.path.join(BUILD, "sigmatrain")
SIGMATRAIN_MPI = os.path.join(os.path.dirname(SIGMATRAIN), "sigmatrain-mpi")
SUPP = os.path.join(ROOT, "tests", "lsan-openmpi.supp")

TINY = ["--layers", "2", "--heads", "2", "--dim", "32", "--seq-len", "32", "--batch", "8",
        "--threads", "1", "--eval-every", "0", "--eval-batches", "2", "--print-every", "1"]
K = 8

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def mpi_env():
    env = dict(os.environ)
    # vader's single-copy mechanism (CMA) needs ptrace rights that containers
    # often lack; plain copies through shared memory work everywhere.
    env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    # SIGTERM -> SIGKILL delay when mpirun ends a job (default 1 s): time for
    # rank 0 to end the run as failed on a loaded machine (docs/distributed.md)
    env.setdefault("OMPI_MCA_odls_base_sigkill_timeout", "5")
    if os.environ.get("SANITIZE"):
        # OpenMPI's own allocations that live until exit (see the file)
        env["LSAN_OPTIONS"] = "suppressions=%s:print_suppressions=0" % SUPP
        asan = env.get("ASAN_OPTIONS", "")
        env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "fast_unwind_on_malloc=0"
    return env


def mpirun(n, args, env_extra=None, timeout=300):
    env = mpi_env()
    if env_extra:
        env.update(env_extra)
    cmd = ["mpirun", "-np", str(n), SIGMATRAIN_MPI] + args
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, text=True)


def read_ckpt(path):
    """Parameters and power-iteration vectors of a checkpoint (ckpt.h)."""
    with open(path, "rb") as f:
        b = f.read()
    magic, version = struct.unpack_from("<II", b, 0)
    assert magic == 0x52544753 and version == 1, (hex(magic), version)
    off = 8 + 8 * 4 + 7 * 4 + 8 + 6 * 4 + 3 * 8 + 4 * 8
    step = struct.unpack_from("<q", b, off - 32)[0]
    (n,) = struct.unpack_from("<Q", b, off)
    off += 8
    params = struct.unpack_from("<%df" % n, b, off)
    off += 4 * n
    (sn,) = struct.unpack_from("<Q", b, off)
    off += 8 + 4 * sn
    (nl,) = struct.unpack_from("<I", b, off)
    off += 4 + 4 * nl
    (pn,) = struct.unpack_from("<Q", b, off)
    off += 8
    pi = struct.unpack_from("<%df" % pn, b, off)
    return step, params, pi


def rel_diff(a, b):
    """max |a - b| / max |a| over the array, and the worst element's
    relative difference (|a - b| / max(|a|, 1e-3 * max|a|))."""
    scale = max(abs(x) for x in a) or 1.0
    dmax = max(abs(x - y) for x, y in zip(a, b))
    floor = 1e-3 * scale
    elem = max(abs(x - y) / max(abs(x), floor) for x, y in zip(a, b))
    return dmax / scale, elem


def compare_single_vs_two(tmp, extra, label):
    single = os.path.join(tmp, label + "-1.ckpt")
    two = os.path.join(tmp, label + "-2.ckpt")
    p1 = subprocess.run([SIGMATRAIN] + TINY + extra + ["--steps", str(K), "--save", single],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    check(p1.returncode == 0, "%s: single process exits 0 (%s)" % (label, p1.stderr.strip()[-300:]))
    p2 = mpirun(2, TINY + extra + ["--steps", str(K), "--save", two, "--dist-check-every", "1"])
    check(p2.returncode == 0, "%s: mpirun -np 2 exits 0 (%s)" % (label, p2.stderr.strip()[-600:]))
    if p1.returncode or p2.returncode:
        return
    check("dist: 2 ranks" in p2.stdout, "%s: the 2-rank run says it runs on 2 ranks" % label)
    s1, a, pa = read_ckpt(single)
    s2, b, pb = read_ckpt(two)
    check(s1 == s2 == K and len(a) == len(b), "%s: both checkpoints at step %d, %d params" % (label, K, len(a)))
    moved = max(abs(x - y) for x, y in zip(a, read_ckpt_init(tmp, extra, label)[1]))
    check(moved > 1e-4, "%s: training moved the parameters (max change %.3g)" % (label, moved))
    glob, elem = rel_diff(a, b)
    print("     %s: parameters: max |diff| / max |p| = %.3g, worst element rel diff %.3g" % (label, glob, elem))
    check(glob <= 1e-5, "%s: parameters of 2 ranks = 1 process within 1e-5 relative (%.3g)" % (label, glob))
    if pa:
        pg, pe = rel_diff(pa, pb)
        print("     %s: power-iteration vectors: %.3g (worst element %.3g)" % (label, pg, pe))
        check(pg <= 1e-5, "%s: power-iteration vectors within 1e-5 relative (%.3g)" % (label, pg))
    l1 = [ln for ln in p1.stdout.splitlines() if ln.startswith("step ")]
    l2 = [ln for ln in p2.stdout.splitlines() if ln.startswith("step ")]
    loss1 = [float(ln.split("|")[1].split()[1]) for ln in l1]
    loss2 = [float(ln.split("|")[1].split()[1]) for ln in l2]
    check(len(loss1) == K and len(loss2) == K and all(abs(x - y) <= 2e-4 for x, y in zip(loss1, loss2)),
          "%s: the printed losses agree step by step (%s vs %s)" % (label, loss1[-2:], loss2[-2:]))


_init_cache = {}


def read_ckpt_init(tmp, extra, label):
    """The step-0 checkpoint (to check the runs actually trained)."""
    if label not in _init_cache:
        p = os.path.join(tmp, label + "-0.ckpt")
        subprocess.run([SIGMATRAIN] + TINY + extra + ["--steps", "0", "--save", p],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=True)
        _init_cache[label] = read_ckpt(p)
    return _init_cache[label]


def run_status(d, name):
    rows = d.query("SELECT id, status, last_step FROM runs WHERE name = ?", (name,))
    return rows[0] if rows else None


def wait_status(d, name, want, timeout=20):
    t = time.time() + timeout
    st = None
    while time.time() < t:
        st = run_status(d, name)
        if st and st[1] in want:
            return st
        time.sleep(0.2)
    return st


def on_alert(tmp):
    """The demo's unstable config on 2 ranks against a daemon that fires
    entropy_collapse: rollback restores the same snapshot on both ranks (the
    checksum every 5 steps after it passes) and the run completes as one run
    with one branch; stop ends every rank with exit 5 and the run aborted."""
    import json
    rules = os.path.join(tmp, "collapse-only.json")
    with open(rules, "w") as f:
        json.dump(COLLAPSE_ONLY_RULES, f)
    d = Daemon(args=["--rules", rules])
    d.start()
    try:
        sock = "unix:" + d.sock
        p = mpirun(2, UNSTABLE_ARGS + ["--steps", "200", "--daemon", sock, "--run", "mpi-rb", "--on-alert", "rollback",
                                  "--rollback-every", "10", "--rollback-keep", "20", "--rollback-lr-scale", "0.01",
                                  "--dist-check-every", "5"], timeout=180)
        rb = [ln for ln in p.stdout.splitlines() if ln.startswith("rollback from step")]
        check(p.returncode == 0 and rb and "differ" not in p.stderr,
              "on-alert rollback on 2 ranks: exit %d, %s (%s)" % (p.returncode, rb[:1], p.stderr.strip()[-300:]))
        st = run_status(d, "mpi-rb")
        check(st is not None and st[1] == "finished" and st[2] == 200, "rollback run finished at step 200: %s" % (st,))
        if st:
            br = d.query("SELECT from_step, to_step FROM branches WHERE run_id = ?", (st[0],))
            n, distinct = d.query("SELECT count(*), count(DISTINCT step) FROM steps WHERE run_id = ?", (st[0],))[0]
            check(len(br) == len(rb) >= 1 and (n, distinct) == (200, 200),
                  "one branch per rollback (%s), every step once (%d rows, %d distinct)" % (br, n, distinct))
        ck = os.path.join(tmp, "mpi-stop-{step}.ckpt")
        p = mpirun(2, UNSTABLE_ARGS + ["--steps", "400", "--daemon", sock, "--run", "mpi-stop", "--on-alert", "stop",
                                  "--save", ck], timeout=180)
        saved = [ln for ln in p.stdout.splitlines() if ln.startswith("saved ")]
        check(p.returncode == 5 and len(saved) == 1, "on-alert stop on 2 ranks: exit %d, %s" % (p.returncode, saved))
        st = wait_status(d, "mpi-stop", ("aborted",))
        check(st is not None and st[1] == "aborted" and st[2] < 400, "stopped run aborted early: %s" % (st,))
    finally:
        d.stop()
        d.cleanup()


def main():
    for exe in (SIGMATRAIN, SIGMATRAIN_MPI):
        if not os.access(exe, os.X_OK):
            print("FAIL %s is missing: `make deps` installs OpenMPI, then `make` builds it" % exe)
            return 1
    if not shutil.which("mpirun"):
        print("FAIL mpirun not found (make deps installs openmpi-bin)")
        return 1
    tmp = tempfile.mkdtemp(prefix="e2e-mpi-")
    try:
        # 1. 2 ranks = 1 process on the same global batch
        compare_single_vs_two(tmp, [], "sigma+adamw")
        compare_single_vs_two(tmp, ["--reparam", "none", "--optimizer", "momentum", "--lr", "0.05",
                                    "--norm", "post"], "none+momentum")

        # 2. telemetry of a 2-rank run arrives as one run
        d = Daemon()
        d.start()
        try:
            sock = "unix:" + d.sock
            p = mpirun(2, TINY + ["--steps", str(K), "--daemon", sock, "--run", "mpi-ok", "--eval-every", "4"])
            check(p.returncode == 0, "telemetry run: mpirun exits 0 (%s)" % p.stderr.strip()[-600:])
            runs = d.query("SELECT name, status, last_step FROM runs")
            check(runs == [("mpi-ok", "finished", K)], "one run, finished at step %d: %s" % (K, runs))
            names = {r[0]: r[1] for r in d.query(
                "SELECT m.name, m.kind FROM metrics m JOIN runs r ON r.id = m.run_id WHERE r.name = 'mpi-ok'")}
            per_rank = ["rank%d_%s" % (r, k) for r in (0, 1) for k in ("tokens_per_s", "step_ms", "comm_ms")]
            check(all(n in names for n in per_rank), "per-rank scalars stored: %s" %
                  sorted(n for n in names if n.startswith("rank")))
            check(all(n in names for n in ("loss", "entropy", "entropy_norm", "sigma_qkv", "eval_loss")),
                  "the model's metrics stored (loss, entropy, entropy_norm, sigma_qkv, eval_loss)")
            for n in ("rank0_tokens_per_s", "rank1_tokens_per_s", "rank1_step_ms"):
                rows = d.query("SELECT f.step, f.data FROM frames f JOIN metrics m ON m.id = f.metric_id "
                               "JOIN runs r ON r.id = m.run_id WHERE r.name = 'mpi-ok' AND m.name = ? "
                               "ORDER BY f.step", (n,))
                vals = [struct.unpack("<f", bytes(b))[0] for _, b in rows]
                check([s for s, _ in rows] == list(range(1, K + 1)) and all(v > 0 for v in vals),
                      "%s: one positive value per step 1..%d (%s)" % (n, K, ["%.3g" % v for v in vals[:3]]))
            steps = d.query("SELECT COUNT(*) FROM steps s JOIN runs r ON r.id = s.run_id WHERE r.name = 'mpi-ok'")
            check(steps == [(K,)], "every step stored once: %s" % steps)

            # 3. a rank that dies marks the run failed
            t0 = time.time()
            p = mpirun(2, TINY + ["--steps", "200", "--daemon", sock, "--run", "mpi-dead"],
                       env_extra={"SIGMATRAIN_DIST_FAULT": "1:5:die"}, timeout=120)
            check(p.returncode != 0, "dead rank: mpirun exits non-zero (%d) in %.1f s" % (p.returncode, time.time() - t0))
            st = wait_status(d, "mpi-dead", ("failed",))
            check(st is not None and st[1] == "failed",
                  "dead rank: the run is failed in the database: %s (rank 0 said: %s)" %
                  (st, [ln for ln in p.stderr.splitlines() if "rank 0" in ln][-2:]))
            check(st is not None and st[2] is not None and st[2] < 200, "dead rank: the run stopped early (%s)" % (st,))
        finally:
            d.stop()
            d.cleanup()

        # 4. --on-alert under MPI: rank 0 hears the alert, every rank answers it
        on_alert(tmp)

        # 5. a rank that silently diverges is caught by the checksum
        p = mpirun(2, TINY + ["--steps", "10", "--dist-check-every", "3"],
                   env_extra={"SIGMATRAIN_DIST_FAULT": "1:2:skew"})
        check(p.returncode != 0 and "differ across ranks" in p.stderr and "step 3:" in p.stderr,
              "skewed rank: exit %d, mismatch reported at the step-3 check: %s" %
              (p.returncode, [ln for ln in p.stderr.splitlines() if "differ" in ln][:1]))
        p = mpirun(2, TINY + ["--steps", "4", "--dist-check-every", "1"])
        check(p.returncode == 0 and "differ" not in p.stderr, "no fault: no mismatch with a check every step")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("e2e_mpi: %d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
