#!/usr/bin/env python3
"""entropyd --remote-write against Debian's real Prometheus (2.42, started
with --web.enable-remote-write-receiver on a free port and its own temp
storage). docs/remote-write.md is what is checked.

1. receiver down: steps are committed, requests fail and are retried,
   /metrics counts them pending; once Prometheus is up every sample arrives.
2. values: every stored value of every series, read back through PromQL
   (a range selector at /api/v1/query gives the raw samples), equals the
   stored float32 exactly, at the step time in ms (bumped 1 ms past the
   previous step where the trainer's clock did not advance).
3. rollback: the abandoned steps stay in Prometheus at their times, the new
   branch follows at its later times; entropyd_run_last_step goes back.
4. a run older than the receiver's window is refused: counted as rejected,
   not retried forever, and later runs still go through.
5. restart mid-push: the daemon is killed (SIGKILL) while a backlog is half
   delivered; restarted, it resumes from its cursor and every step is in
   Prometheus exactly once (count_over_time equals the stored steps).
6. a receiver that accepts and never answers: failing and pending_samples
   are true within seconds of the hang (not after the 30 s request
   timeout), a run created during the hang included.

Env: ENTROPYD, PROMETHEUS (binaries). python3 standard library only."""
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Client, Daemon, free_port  # noqa: E402

PROMETHEUS = os.environ.get("PROMETHEUS") or shutil.which("prometheus") or "/usr/bin/prometheus"
NOW = time.time()


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def wait_for(pred, what, timeout=60):
    deadline = time.time() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.time() > deadline:
            raise TimeoutError("timed out waiting for " + what)
        time.sleep(0.05)


class Prometheus:
    def __init__(self, tmp):
        self.port = free_port()
        self.dir = os.path.join(tmp, "prom")
        os.makedirs(self.dir, exist_ok=True)
        self.cfg = os.path.join(tmp, "prometheus.yml")
        with open(self.cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
        self.proc = None
        self.url = "http://127.0.0.1:%d" % self.port

    def start(self):
        log = open(os.path.join(self.dir, "..", "prometheus.log"), "ab")
        self.proc = subprocess.Popen([PROMETHEUS, "--config.file=" + self.cfg, "--storage.tsdb.path=" + self.dir,
                                      "--web.listen-address=127.0.0.1:%d" % self.port,
                                      "--web.enable-remote-write-receiver"], stdout=log, stderr=log)

        def ready():
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    return r.status == 200
            except OSError:
                check(self.proc.poll() is None, "prometheus exited")
                return False
        wait_for(ready, "prometheus to be ready")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        self.proc = None

    def query(self, q, at):
        u = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": "%.3f" % at})
        with urllib.request.urlopen(u, timeout=30) as r:
            doc = json.load(r)
        check(doc["status"] == "success", "query %s: %r" % (q, doc))
        return doc["data"]["result"]


def rw_metrics(d):
    status, text = d.get("/metrics")
    check(status == 200, "/metrics %d" % status)
    out = {}
    for line in text.splitlines():
        if line.startswith("entropyd_remote_write_"):
            k, v = line.split()
            out[k[len("entropyd_remote_write_"):]] = float(v)
    return out


def send_steps(c, seq, steps, times, layers, heads, salt):
    """Steps with distinct float32 values (scalar, layer and head metrics)
    at the given times; waits for the ack of the last one."""
    for step, t in zip(steps, times):
        seq += 1
        v = lambda l, h: ((step * 131 + l * 17 + h * 7 + salt) % 9973) / 997.0 + 0.1  # noqa: E731
        c.send({"type": "step", "seq": seq, "step": step, "time": t,
                "scalars": {"loss": 3.0 - step * 1e-4 + salt},
                "layers": {"rank_ratio": [v(l, 99) for l in range(layers)]},
                "heads": {"entropy_norm": [[v(l, h) for h in range(heads)] for l in range(layers)]}})
    c.wait_ack(seq, timeout=60)
    return seq


def stored(d, run):
    """{(name, metric, layer, head): [(ts_ms, value)]} as the docs say the
    pusher derives them from the database."""
    rid, layers, heads = d.query("SELECT id, layers, heads FROM runs WHERE name = ?", (run,))[0]
    steps = d.query("SELECT step, time FROM steps WHERE run_id = ? ORDER BY step", (rid,))
    ts, prev = {}, None
    for step, t in steps:
        ms = int(round(t * 1000))
        if prev is not None and ms <= prev:
            ms = prev + 1
        ts[step] = prev = ms
    out = {("entropyd_run_last_step", "", "", ""): [(ts[s], float(s)) for s, _ in steps]}
    for name, kind, step, blob in d.query(
            "SELECT m.name, m.kind, f.step, f.data FROM metrics m JOIN frames f ON f.metric_id = m.id "
            "WHERE m.run_id = ? ORDER BY f.step", (rid,)):
        vals = struct.unpack("<%df" % (len(blob) // 4), blob)
        for i, x in enumerate(vals):
            if kind == 0:
                key = ("entropyd_scalar", name, "", "")
            elif kind == 1:
                key = ("entropyd_layer", name, str(i), "")
            else:
                key = ("entropyd_head", name, str(i // heads), str(i % heads))
            out.setdefault(key, []).append((ts[step], x))
    return out


def pushed(prom, run, at):
    out = {}
    for r in prom.query('{__name__=~"entropyd_.*", run="%s"}[6h]' % run, at):
        m = r["metric"]
        key = (m["__name__"], m.get("metric", ""), m.get("layer", ""), m.get("head", ""))
        out[key] = [(int(round(float(t) * 1000)), float(v)) for t, v in r["values"]]
    return out


def check_equal(d, prom, run, at, expect=None):
    want = expect if expect is not None else stored(d, run)
    got = pushed(prom, run, at)
    check(set(got) == set(want), "%s: series %r, stored %r" % (run, sorted(got)[:5], sorted(want)[:5]))
    for k in want:
        check(got[k] == want[k], "%s %r: pushed %r, stored %r" % (run, k, got[k][:4], want[k][:4]))
    return sum(len(v) for v in want.values())


def cursor(d):
    """{run id: last step delivered} from the daemon's cursor file."""
    try:
        with open(d.db + ".remote-write") as f:
            return {int(l.split()[0]): int(l.split()[1]) for l in f.read().splitlines()[2:]}
    except OSError:
        return {}


def caught_up(d):
    runs = dict(d.query("SELECT id, last_step FROM runs WHERE last_step IS NOT NULL"))
    if d.query("SELECT count(*) FROM rewinds") != [(0,)]:
        return False
    cur = cursor(d)
    return all(cur.get(r) == s for r, s in runs.items())


def wait_delivered(d, extra=""):
    """Every run's cursor at its last step, then the counters once the
    pending gauge (counted at most once a second) says so too."""
    wait_for(lambda: caught_up(d), "every step delivered " + extra, timeout=120)
    return wait_for(lambda: (lambda m: m if m.get("pending_samples") == 0 and m.get("failing") == 0 else None)(
        rw_metrics(d)), "pending 0 " + extra, timeout=30)


def hung_receiver(tmp):
    """6. A receiver that takes the connection and never answers: the
    first request hangs for its whole timeout (30 s), yet the gauges tell
    the truth at once, for every run, one created during the hang too."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    held, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except socket.timeout:
                pass
    th = threading.Thread(target=accept, daemon=True)
    th.start()
    url = "http://127.0.0.1:%d/api/v1/write" % srv.getsockname()[1]
    d = Daemon(data=os.path.join(tmp, "hung"), args=["--remote-write", url], http=True)
    os.makedirs(d.data)
    try:
        d.start()
        c = Client(d.sock)
        check(c.hello("rw-hang-a", layers=1, heads=2)["type"] == "welcome", "hello")
        send_steps(c, 0, range(1, 51), [NOW - 600 + s for s in range(1, 51)], 1, 2, 7)
        want = 50 * (1 + 1 + 2 + 1)
        m = wait_for(lambda: (lambda m: m if m["failing"] == 1 and m["pending_samples"] == want else None)(
            rw_metrics(d)), "failing and %d pending while the receiver hangs" % want, timeout=10)
        check(m["requests_failed_total"] == 0 and held, "not the first request's timeout: %r" % m)
        c2 = Client(d.sock)
        check(c2.hello("rw-hang-b", layers=2, heads=2)["type"] == "welcome", "hello")
        send_steps(c2, 0, range(1, 21), [NOW - 500 + s for s in range(1, 21)], 2, 2, 8)
        want += 20 * (1 + 2 + 4 + 1)
        m = wait_for(lambda: (lambda m: m if m["pending_samples"] == want else None)(rw_metrics(d)),
                     "%d pending with a run created during the hang" % want, timeout=10)
        check(m["failing"] == 1 and m["requests_failed_total"] == 0, "still the first request: %r" % m)
        print("hung receiver: failing 1 and %d samples pending (2 runs, one created during the hang) "
              "before the first request timed out" % want)
        c.close()
        c2.close()
    except BaseException:
        sys.stderr.write("--- daemon log (hung receiver)\n" + d.log()[-4000:])
        raise
    finally:
        d.stop()
        stop.set()
        th.join()
        for s in held:
            s.close()
        srv.close()


def main():
    tmp = tempfile.mkdtemp(prefix="entropyd-rw-")
    hung_receiver(tmp)
    prom = Prometheus(tmp)
    url = prom.url + "/api/v1/write"
    d = Daemon(data=os.path.join(tmp, "data"), args=["--remote-write", url], http=True)
    os.makedirs(d.data)
    t0 = NOW - 1800
    try:
        # 1. receiver down: committed, pending, retried
        d.start()
        c = Client(d.sock)
        check(c.hello("rw-a", layers=2, heads=3)["type"] == "welcome", "hello")
        seq = send_steps(c, 0, range(1, 201), [t0 + s * 0.05 for s in range(1, 201)], 2, 3, 0)
        m = wait_for(lambda: (lambda m: m if m["requests_failed_total"] >= 2 else None)(rw_metrics(d)),
                     "failed requests while the receiver is down")
        check(m["samples_total"] == 0 and m["failing"] == 1, "while down: %r" % m)
        wait_for(lambda: rw_metrics(d)["pending_samples"] == 200 * 10, "2000 samples pending")
        prom.start()
        m = wait_delivered(d, "after the receiver came up")
        check(m["samples_total"] == 2000 and m["samples_rejected_total"] == 0, "after up: %r" % m)
        at = t0 + 60
        n = check_equal(d, prom, "rw-a", at)
        check(n == 2000, "rw-a: %d samples" % n)
        print("receiver down then up: 2000 of 2000 samples, values equal; %d failed requests retried"
              % m["requests_failed_total"])

        # 2. a trainer clock that does not advance: 1 ms apart
        c2 = Client(d.sock)
        check(c2.hello("rw-same-time", layers=1, heads=2)["type"] == "welcome", "hello")
        send_steps(c2, 0, range(0, 30), [t0 + 100] * 30, 1, 2, 5)
        wait_delivered(d)
        want = stored(d, "rw-same-time")
        check(want[("entropyd_scalar", "loss", "", "")][-1][0] == int(round((t0 + 100) * 1000)) + 29, "bumped ts")
        check_equal(d, prom, "rw-same-time", t0 + 200)

        # 3. rollback: steps 1..50, then 30..60 again at later times
        c3 = Client(d.sock)
        check(c3.hello("rw-rollback", layers=2, heads=2)["type"] == "welcome", "hello")
        s3 = send_steps(c3, 0, range(1, 51), [t0 + 300 + s for s in range(1, 51)], 2, 2, 1)
        wait_delivered(d)
        before = stored(d, "rw-rollback")
        s3 = send_steps(c3, s3, range(30, 61), [t0 + 400 + s for s in range(30, 61)], 2, 2, 2)
        wait_for(lambda: d.query("SELECT count(*) FROM rewinds") == [(0,)], "the rewind")
        wait_delivered(d)
        after = stored(d, "rw-rollback")
        expect = {k: before[k] + [p for p in after[k] if p[0] > before[k][-1][0]] for k in after}
        n = check_equal(d, prom, "rw-rollback", t0 + 600, expect)
        check(n == 81 * 8, "rollback: %d samples, want 81 steps x 8 series" % n)
        steps_seen = [v for _, v in expect[("entropyd_run_last_step", "", "", "")]]
        check(steps_seen[49:51] == [50.0, 30.0], "last_step series %r" % steps_seen[45:55])
        print("rollback: abandoned 30..50 kept, new branch 30..60 after it, %d samples equal" % n)

        # 4. a run older than Prometheus's head window (now - 1 h) is refused
        m0 = rw_metrics(d)
        c4 = Client(d.sock)
        check(c4.hello("rw-old", layers=1, heads=1)["type"] == "welcome", "hello")
        send_steps(c4, 0, range(1, 21), [NOW - 4 * 3600 + s for s in range(1, 21)], 1, 1, 3)
        m = wait_delivered(d, "with an old run")
        check(m["samples_rejected_total"] - m0["samples_rejected_total"] == 20 * 4, "rejected %r" % m)
        check(pushed(prom, "rw-old", NOW) == {}, "old run in prometheus")
        send_steps(c, seq, range(201, 211), [t0 + s * 0.05 for s in range(201, 211)], 2, 3, 0)
        wait_delivered(d)
        check_equal(d, prom, "rw-a", at)
        print("old run: %d samples rejected and counted; later steps still delivered"
              % (m["samples_rejected_total"] - m0["samples_rejected_total"]))
        for cl in (c, c2, c3, c4):
            cl.close()

        # 5. SIGKILL mid-push, restart: nothing lost, nothing twice
        d.stop()
        prom.stop()
        d.start()
        c5 = Client(d.sock)
        layers, heads, steps = 4, 8, 30000
        check(c5.hello("rw-big", layers=layers, heads=heads)["type"] == "welcome", "hello")
        send_steps(c5, 0, range(1, steps + 1), [t0 + 900 + s * 0.01 for s in range(1, steps + 1)], layers, heads, 4)
        c5.close()
        per_step = 1 + layers + layers * heads + 1
        wait_for(lambda: rw_metrics(d)["pending_samples"] == steps * per_step, "the backlog counted")
        rid = d.query("SELECT id FROM runs WHERE name = 'rw-big'")[0][0]
        prom.start()
        # a batch counts as sent when the receiver answers and its cursor is
        # saved just after: wait for both (under the sanitizers the kill once
        # fell between them, with nothing of rw-big in the cursor file yet)
        m = wait_for(lambda: (lambda m: m if m["samples_total"] > 0 and cursor(d).get(rid, 0) > 0 else None)(
            rw_metrics(d)), "a first batch delivered and its cursor saved", 60)
        d.kill9()
        cur = cursor(d)
        check(0 < cur.get(rid, 0) < steps, "killed mid-push? cursor %r, %r" % (cur, m))
        t_restart = time.time()
        d.start()
        m2 = wait_delivered(d, "after the restart")
        rate = (steps * per_step - m["samples_total"]) / (time.time() - t_restart)
        big = stored(d, "rw-big")
        n = check_equal(d, prom, "rw-big", t0 + 900 + steps * 0.01 + 1, big)
        check(n == steps * per_step, "rw-big: %d samples" % n)
        cnt = prom.query('count_over_time(entropyd_head{run="rw-big",layer="3",head="7"}[6h])', NOW)
        check(len(cnt) == 1 and cnt[0]["value"][1] == str(steps), "count_over_time %r" % cnt)
        check(m2["samples_rejected_total"] <= 65536, "resent after the kill: %r" % m2)
        for run in ("rw-a", "rw-same-time"):
            check_equal(d, prom, run, at if run == "rw-a" else t0 + 200)
        print("SIGKILL after %d of %d samples: after the restart all %d in prometheus once, values equal "
              "(%d resent and refused as already there); resumed push %.0f samples/s (load %s)"
              % (m["samples_total"], n, n, m2["samples_rejected_total"], rate, os.getloadavg()[0]))
    except BaseException:
        sys.stderr.write("--- daemon log\n" + d.log()[-4000:])
        try:
            with open(os.path.join(tmp, "prometheus.log")) as f:
                sys.stderr.write("--- prometheus log\n" + f.read()[-3000:])
        except OSError:
            pass
        raise
    finally:
        d.stop()
        prom.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("e2e_remote_write: ok")


if __name__ == "__main__":
    main()
