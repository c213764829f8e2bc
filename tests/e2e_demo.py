"""End-to-end test of `make demo`: runs scripts/demo.sh shortened
(the real entropyd and two real sigmatrain runs, 80 steps), then
checks through the HTTP API that both runs were stored and finished, that
the unstable baseline's entropy_collapse alert fired and that the
sigmaReparam run fired no alert at all (default rules). Then: a busy first port is skipped, and SIGINT
to the demo's process group (a terminal's Ctrl-C) stops every process it
started.

Alerts are read from GET /api/runs/{id}/alerts (from the daemon's SQLite file
if the daemon predates that route; the test says which it used).
Standard library only.
"""
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import ENTROPYD, ROOT  # noqa: E402

SIGMATRAIN = os.environ.get("SIGMATRAIN") or os.path.join(ROOT, "build", "sigmatrain")
DEMO = os.path.join(ROOT, "scripts", "demo.sh")
STEPS = int(os.environ.get("E2E_DEMO_STEPS", "80"))


def env_for(data, **extra):
    env = dict(os.environ, ENTROPYD=ENTROPYD, SIGMATRAIN=SIGMATRAIN, DEMO_DATA=data, DEMO_HOLD="0")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def get(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as r:
        return json.loads(r.read().decode())


def session_pids(sid):
    """Processes whose session id is sid (the demo runs in its own session)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p) as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(p))
    return out


def test_short_demo(tmp):
    data = os.path.join(tmp, "demo")
    t0 = time.time()
    r = subprocess.run(["bash", DEMO], env=env_for(data, DEMO_STEPS=STEPS, DEMO_PORT=0),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    took = time.time() - t0
    print(r.stdout)
    assert r.returncode == 0, "demo.sh exit %d\n%s" % (r.returncode, r.stderr)
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/", r.stdout), "no dashboard URL printed"
    print("short demo (%d steps) took %.1f s" % (STEPS, took))

    # The demo stopped its daemon; a new one on the same data serves what it stored.
    d = subprocess.Popen([ENTROPYD, "--data", data, "--http", "127.0.0.1:0"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = None
        for _ in range(5):
            m = re.match(r"http port (\d+)", d.stdout.readline())
            if m:
                port = int(m.group(1))
                break
        assert port, "entropyd did not print its http port"
        runs = {x["name"]: x for x in get(port, "/api/runs")}
        for name in ("demo-baseline", "demo-sigmareparam"):
            assert name in runs, "run %s not stored: %s" % (name, sorted(runs))
            assert runs[name]["status"] == "finished", (name, runs[name]["status"])
            assert runs[name]["last_step"] == STEPS, (name, runs[name]["last_step"])
            assert runs[name]["meta"]["model"]["layers"] == 2
            detail = get(port, "/api/runs/%d" % runs[name]["id"])
            assert "entropy_norm" in detail["metrics"]["heads"], detail["metrics"]
        base, sig = runs["demo-baseline"], runs["demo-sigmareparam"]

        def alerts(run):
            try:
                a = get(port, "/api/runs/%d/alerts" % run["id"])
                rows = a["alerts"] if isinstance(a, dict) else a
                return "http", [(x.get("rule") or x["labels"]["alertname"], x.get("start_step")) for x in rows]
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    raise
            con = sqlite3.connect("file:%s?mode=ro" % os.path.join(data, "entropyd.db"), uri=True)
            try:
                return "sqlite", con.execute("SELECT rule, start_step FROM alerts WHERE run_id = ?",
                                             (run["id"],)).fetchall()
            finally:
                con.close()

        how, ab = alerts(base)
        _, asig = alerts(sig)
        print("alerts read through %s: baseline %s; sigmareparam %s" % (how, ab, asig))
        collapse = [s for rule, s in ab if rule == "entropy_collapse"]
        assert collapse, "the baseline's entropy_collapse alert did not fire: %s" % ab
        # the demo's point: the same config with sigmaReparam fires nothing (no rule of the default set)
        assert not asig, "sigmaReparam fired alerts: %s" % asig
        # after both runs finished, the baseline's verdict is
        # collapsed from the step its entropy_collapse alert began, in the run
        # and in the runs list (the list read before, from a fresh daemon);
        # the sigmaReparam twin is healthy.
        vb = get(port, "/api/runs/%d" % base["id"])["verdict"]
        vs = get(port, "/api/runs/by-name/demo-sigmareparam")["verdict"]
        print("verdicts: baseline %s; sigmareparam %s" % (vb, vs))
        assert vb["state"] == "collapsed", vb
        assert vb["since_step"] == collapse[0], (vb, collapse)
        assert vb["rule"] == "entropy_collapse" and vb["heads"], vb
        assert base["verdict"] == vb, (base["verdict"], vb)
        assert vs == {"state": "healthy", "since_step": None, "heads": [], "rule": None, "evidence": None}, vs
        assert sig["verdict"] == vs, sig["verdict"]
        page = get(port, "/api/runs?limit=10&verdict=collapsed")
        assert [r["name"] for r in page["runs"]] == ["demo-baseline"], page
        # The baseline's collapse is visible in the stored series too.
        s = get(port, "/api/runs/%d/series?metric=entropy_norm&agg=min&points=%d" % (base["id"], STEPS + 1))
        t = get(port, "/api/runs/%d/series?metric=entropy_norm&agg=min&points=%d" % (sig["id"], STEPS + 1))
        bmin = min(v for v in s["min"] if v is not None)
        smin = min(v for v in t["min"] if v is not None)
        print("min head entropy_norm: baseline %.4f, sigmareparam %.4f" % (bmin, smin))
        assert bmin < smin
    finally:
        d.send_signal(signal.SIGTERM)
        d.wait(15)


def test_busy_port_and_ctrl_c(tmp):
    data = os.path.join(tmp, "interrupted")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(4)
    port = busy.getsockname()[1]
    p = subprocess.Popen(["bash", DEMO], env=env_for(data, DEMO_STEPS=100000, DEMO_PORT=port),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, url = [], None
        deadline = time.time() + 30
        while time.time() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            out.append(line)
            m = re.search(r"dashboard: (http://127\.0\.0\.1:(\d+)/)", line)
            if m:
                url = m.group(1)
                break
        assert url, "no dashboard URL:\n" + "".join(out)
        assert "port %d is busy" % port in "".join(out), "".join(out)
        assert url != "http://127.0.0.1:%d/" % port
        with urllib.request.urlopen(url + "healthz", timeout=10) as r:
            assert json.loads(r.read().decode())["status"] == "ok"
        # Ctrl-C once both trainers stream (each run live with a step stored)
        deadline = time.time() + 60
        while True:
            with urllib.request.urlopen(url + "api/runs", timeout=10) as r:
                runs = json.loads(r.read().decode())
            if len(runs) == 2 and all(r["status"] == "live" and r["last_step"] is not None for r in runs):
                break
            assert time.time() < deadline, "the trainers did not stream: %s" % runs
            time.sleep(0.1)
        assert len(session_pids(p.pid)) >= 4, session_pids(p.pid)  # bash, entropyd, 2 trainers
        os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        rest, _ = p.communicate(timeout=30)
        print("".join(out) + rest)
        assert "demo: stopped" in rest, rest
        left = session_pids(p.pid)
        assert not left, "processes left after Ctrl-C: %s" % left
        # The daemon shut down cleanly: its database opens and holds both runs.
        con = sqlite3.connect(os.path.join(data, "entropyd.db"))
        names = [r[0] for r in con.execute("SELECT name FROM runs ORDER BY name")]
        con.close()
        assert names == ["demo-baseline", "demo-sigmareparam"], names
    finally:
        busy.close()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main():
    for b in (ENTROPYD, SIGMATRAIN):
        if not os.access(b, os.X_OK):
            print("missing binary %s" % b)
            sys.exit(1)
    with tempfile.TemporaryDirectory(prefix="e2e-demo-") as tmp:
        for t in (test_short_demo, test_busy_port_and_ctrl_c):
            t0 = time.time()
            t(tmp)
            print("ok %s (%.1f s)" % (t.__name__, time.time() - t0))


if __name__ == "__main__":
    main()
