"""Reliability and security of entropyd, end to end: the real
daemon, real sockets, the real SQLite file. tests/e2e_ingest.py already
covers each bad protocol input, three kill -9s of one trainer, the socket's
mode 0600, TCP + token, a full tmpfs; tests/test_http.c covers the HTTP
token, path traversal and request bodies. This file adds:

- kill -9 at random moments of a load of several trainers, many rounds,
  checking at every restart that no acknowledged step was lost (a welcome's
  last_seq is never below an ack the trainer saw) and at the end that every
  step is stored exactly once with its values;
- load: 200 trainers (12 x 12 model, 8 head metrics) and 100 SSE clients
  for a while on loopback: no error line, every step acked and stored,
  every all-runs SSE client sees every step, RSS sampled (bounded);
- security: HTTP on loopback by default and TCP ingest only on an address
  given; the token on the Unix socket too; HTTP header and URL size limits;
  HTTP and trainer connection limits; no SQL built from input (hostile
  strings through every text input, and a scan of the daemon's sources).

Short by default (make test); STRESS=1 runs the long versions (make stress:
20 kill rounds, 60 s of load) and RELIABILITY_JSON=FILE receives the figures
for scripts/run-stress.sh's table."""
import json
import os
import random
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import (ENTROPYD, ROOT, Client, Daemon, floats,  # noqa: E402
                            head_value, step_msg, wait_for)

STRESS = os.environ.get("STRESS") == "1"
KILL_ROUNDS = int(os.environ.get("KILL_ROUNDS", 20 if STRESS else 4))
LOAD_SECONDS = float(os.environ.get("LOAD_SECONDS", 60 if STRESS else 10))
LOAD_TRAINERS = int(os.environ.get("LOAD_TRAINERS", 200))
LOAD_SSE = int(os.environ.get("LOAD_SSE", 100))
RESULTS = {}


def record(**kv):
    RESULTS.update(kv)
    path = os.environ.get("RELIABILITY_JSON")
    if path:
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1)


def http_port(d):
    """The port of a daemon started with --http 127.0.0.1:0."""
    line = d.proc.stdout.readline().decode()
    m = re.match(r"http port (\d+)", line)
    if not m:
        raise RuntimeError("no http port line: %r; log %s" % (line, d.log()[-2000:]))
    return int(m.group(1))


def http_get(port, target, headers="", timeout=10):
    """One HTTP/1.0 request on a raw socket (no client library normalising
    the target). Returns (status, body) or (None, b"") if closed unanswered."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(("GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n%s\r\n" % (target, headers)).encode())
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    if not data.startswith(b"HTTP/"):
        return None, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


class AckedTrainer(threading.Thread):
    """A careful trainer that also audits the daemon: it remembers the
    highest ack it saw, and a welcome whose last_seq is below it means an
    acknowledged step was lost. Reconnects and resends from last_seq."""

    def __init__(self, sock, run, n, layers=2, heads=3):
        super().__init__(daemon=True)
        self.sock, self.run_name, self.n = sock, run, n
        self.layers, self.heads = layers, heads
        self.max_ack = 0
        self.seq = 0            # highest seq sent
        self.lost = []          # (ack seen, welcome last_seq)
        self.errors = []
        self.reconnects = 0
        self.last_exc = None
        self.hello_timeouts = 0
        self.max_hello_s = 0.0
        self.stop = False

    def run(self):
        while self.max_ack < self.n and not self.stop:
            try:
                c = Client(self.sock, timeout=5)
                t_hello = time.time()
                try:
                    w = c.hello(self.run_name, layers=self.layers, heads=self.heads)
                except TimeoutError:
                    self.hello_timeouts += 1  # connected, hello sent, no welcome in 10 s
                    raise
                self.max_hello_s = max(self.max_hello_s, time.time() - t_hello)
                if w["type"] != "welcome":
                    raise RuntimeError(w)
                if w["last_seq"] < self.max_ack:
                    self.lost.append((self.max_ack, w["last_seq"]))
                self.max_ack = max(self.max_ack, w["last_seq"])  # committed, hence acknowledged
                self.seq = acked = w["last_seq"]
                while acked < self.n and not self.stop:
                    while self.seq < min(self.n, acked + 100):
                        self.seq += 1
                        c.send(step_msg(self.seq, self.seq, self.layers, self.heads))
                    m = c.recv(timeout=5)
                    if m["type"] == "ack":
                        acked = m["seq"]
                        self.max_ack = max(self.max_ack, acked)
                    elif m["type"] == "error" and m["code"] != "duplicate":
                        self.errors.append(m)
                c.close()
            except (OSError, EOFError, ValueError, RuntimeError) as e:
                self.last_exc = "%s: %s" % (type(e).__name__, e)
                self.reconnects += 1
                time.sleep(0.02)  # not a wait: a reconnecting trainer's pause


class KillTest(unittest.TestCase):
    def test_kill9_at_random_points_every_acked_step_survives(self):
        rnd = random.Random(int(os.environ.get("SEED", time.time())))
        d = Daemon().start()
        trainers = [AckedTrainer(d.sock, "kill-%d" % i, 1 << 40) for i in range(4)]
        try:
            for t in trainers:
                t.start()
            t0 = time.time()
            kills = 0
            for _ in range(KILL_ROUNDS):
                time.sleep(rnd.uniform(0.05, 1.2))  # not a wait: a random point to kill at
                d.kill9()
                kills += 1
                time.sleep(rnd.uniform(0, 0.3))  # not a wait: trainers find no daemon for a moment
                d.start()
            for t in trainers:  # finish with what each has sent
                t.n = t.seq
            for t in trainers:
                t.join(float(os.environ.get("KILL_JOIN", 120)))
                self.assertFalse(t.is_alive(), "%s still running: acked %d of %d, %d reconnects, errors %s, last %s; "
                                 "daemon log:\n%s" % (t.run_name, t.max_ack, t.n, t.reconnects, t.errors[:3],
                                                       t.last_exc, d.log()[-3000:]))
            elapsed = time.time() - t0
            for t in trainers:
                self.assertEqual(t.lost, [], "acked steps lost across kill -9 (%s)" % t.run_name)
                self.assertEqual(t.errors, [])
                self.assertEqual(t.hello_timeouts, 0, "%s: a hello was never answered" % t.run_name)
                self.assertGreaterEqual(t.max_ack, t.n, "%s did not finish" % t.run_name)
            lost = 0
            for t in trainers:
                n = t.max_ack
                rid = d.query("SELECT id FROM runs WHERE name=?", (t.run_name,))[0][0]
                rows = d.query("SELECT step, seq FROM steps WHERE run_id=? ORDER BY step", (rid,))
                self.assertEqual(rows, [(i, i) for i in range(1, n + 1)])
                cnt = d.query("SELECT count(*), count(DISTINCT f.step) FROM frames f JOIN metrics m ON m.id=f.metric_id "
                              "WHERE m.run_id=?", (rid,))[0]
                # loss, rank_ratio, entropy and the entropy_norm ingest derives, per step
                self.assertEqual(cnt, (4 * n, n))
                for step in rnd.sample(range(1, n + 1), 20):
                    data = d.query("SELECT f.data FROM frames f JOIN metrics m ON m.id=f.metric_id "
                                   "WHERE m.run_id=? AND m.name='entropy' AND f.step=?", (rid, step))[0][0]
                    want = [head_value(step, l, h) for l in range(2) for h in range(3)]
                    self.assertEqual([round(x, 4) for x in floats(data)], [round(x, 4) for x in want])
            self.assertEqual(d.query("PRAGMA integrity_check")[0][0], "ok")
            record(kill_rounds=kills, kill_trainers=len(trainers), kill_steps=sum(t.max_ack for t in trainers), kill_lost=lost,
                   kill_reconnects=sum(t.reconnects for t in trainers), kill_seconds=round(elapsed, 1))
            print("kill -9: %d rounds, %d trainers, %d steps, every acked step present once, %d reconnects, "
                  "slowest welcome %.2f s, %.1f s" % (kills, len(trainers), sum(t.max_ack for t in trainers),
                                                      sum(t.reconnects for t in trainers),
                                                      max(t.max_hello_s for t in trainers), elapsed))
        finally:
            for t in trainers:
                t.stop = True
            d.cleanup()


class FrozenDaemonTest(unittest.TestCase):
    """build/sigmatrain streaming to entropyd: its throughput (the tok/s of
    its progress lines) while the daemon is running, frozen with SIGSTOP,
    and running again. The bound is generous (the machine is shared); the
    figures go to the stress table. tests/test_telemetry_frozen.c measures
    the telemetry calls themselves."""

    def test_sigmatrain_does_not_slow_down_when_its_daemon_freezes(self):
        exe = os.environ.get("SIGMATRAIN") or os.path.join(ROOT, "build", "sigmatrain")
        if not os.access(exe, os.X_OK) or b"--daemon" not in subprocess.run([exe, "--help"], capture_output=True).stdout:
            self.skipTest("no sigmatrain with --daemon")
        pairs = int(os.environ.get("FROZEN_PAIRS", 10 if STRESS else 4))
        block = float(os.environ.get("FROZEN_BLOCK_S", 1.5))
        d = Daemon().start()
        spool = tempfile.mkdtemp(prefix="entropyd-spool-")
        p = subprocess.Popen([exe, "--daemon", "unix:" + d.sock, "--run", "frozen-sgt", "--spool", spool,
                              "--layers", "2", "--heads", "4", "--dim", "64", "--seq-len", "64", "--batch", "8",
                              "--threads", "1", "--steps", "1000000", "--print-every", "1", "--eval-every", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        lines = []  # (arrival time, tok/s)
        try:
            def reader():
                for raw in p.stdout:
                    m = re.match(rb"step +(\d+)/", raw)
                    if m:
                        lines.append((time.time(), int(m.group(1))))
            th = threading.Thread(target=reader, daemon=True)
            th.start()
            deadline = time.time() + 30
            while not lines and time.time() < deadline:
                time.sleep(0.05)
            self.assertTrue(lines, "sigmatrain printed no progress")
            # alternate running and frozen blocks, so that the machine's
            # other load (it is shared) falls on both alike
            control = os.environ.get("FROZEN_CONTROL") == "1"  # the same blocks without the freeze
            blocks = {"running": [], "frozen": []}
            for i in range(2 * pairs):
                kind = "frozen" if i % 2 else "running"
                if kind == "frozen" and not control:
                    d.proc.send_signal(signal.SIGSTOP)
                ta = time.time()
                time.sleep(block)  # not a wait: the block whose steps are counted
                blocks[kind].append((ta, time.time()))
                if kind == "frozen":
                    d.proc.send_signal(signal.SIGCONT)

            def rate(kind):
                """Steps per second over the blocks of one kind (each line
                is printed as its step ends; stdout is line-buffered)."""
                steps = secs = 0
                for a, b in blocks[kind]:
                    inside = [s for t, s in lines if a < t <= b]
                    if len(inside) >= 2:
                        steps += inside[-1] - inside[0]
                        secs += b - a
                return steps / secs if secs else 0.0, steps
            def gaps(kind):
                g = sorted(t2 - t1 for a, b in blocks[kind] for (t1, _), (t2, _) in zip(lines, lines[1:]) if a < t1 and t2 <= b)
                return "p50 %.1f ms, p90 %.1f ms, max %.1f ms" % tuple(1e3 * g[int(q * (len(g) - 1))] for q in (0.5, 0.9, 1.0)) if g else "-"
            print("time between steps: running %s; frozen %s" % (gaps("running"), gaps("frozen")))
            (run, nrun), (frozen, nfrozen) = rate("running"), rate("frozen")
            print("sigmatrain steps/s, %d blocks of %.1f s each: daemon running %.1f (%d steps), daemon frozen %.1f "
                  "(%d steps)%s" % (pairs, block, run, nrun, frozen, nfrozen, " [control: never frozen]" if control else ""))
            record(sgt_running_steps_s=round(run, 1), sgt_frozen_steps_s=round(frozen, 1), sgt_blocks=pairs, sgt_block_s=block)
            self.assertGreater(run, 0)
            self.assertGreaterEqual(frozen, 0.5 * run, "training slowed down while its daemon was frozen")
            self.assertIsNone(p.poll(), "sigmatrain exited")
            # after SIGCONT the run's steps reach the database
            deadline = time.time() + 20
            while time.time() < deadline:
                n = d.query("SELECT count(*) FROM steps")[0][0]
                if n > 0:
                    break
                time.sleep(0.2)
            self.assertGreater(n, 0)
        finally:
            if d.proc is not None:
                d.proc.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()
            p.stdout.close()
            d.cleanup()
            subprocess.run(["rm", "-rf", spool])


# ---- load -------------------------------------------------------------

L, H, NHEAD = 12, 12, 8


def step_template(run_index):
    """A 12 x 12 step line with %d for seq and step (values fixed per trainer)."""
    heads = {}
    for m in range(NHEAD):
        heads["h%d" % m] = [[round(((run_index + m * 7 + l * 3 + h) % 101) / 10.0, 1) for h in range(H)] for l in range(L)]
    msg = {"type": "step", "seq": 0, "step": 0, "scalars": {"loss": 2.5, "lr": 0.001, "gnorm": 0.7, "tok_s": 1000},
           "layers": {"rank_ratio": [0.5] * L, "sigma": [1.5] * L}, "heads": heads}
    line = json.dumps(msg, separators=(",", ":"))
    return line.replace('"seq":0,"step":0', '"seq":%d,"step":%d', 1) + "\n"


class LoadConn:
    def __init__(self, kind, sock, idx):
        self.kind, self.sock, self.idx = kind, sock, idx
        self.out = b""
        self.inbuf = b""
        self.tail = b""
        self.seq = 0
        self.acked = 0
        self.welcomed = False
        self.errors = []
        self.steps_seen = 0
        self.resets = 0
        self.closed = False
        self.run_id = None


class LoadTest(unittest.TestCase):
    def test_200_trainers_and_100_sse_clients(self):
        d = Daemon(args=["--http", "127.0.0.1:0", "--max-conns", "1000", "--http-max-conns", "512"]
                   + os.environ.get("LOAD_ARGS", "").split()).start()
        port = http_port(d)
        rate = float(os.environ.get("LOAD_RATE", 5))  # steps/s per trainer
        sel = selectors.DefaultSelector()
        trainers, sses = [], []
        templates = [step_template(i) for i in range(16)]
        try:
            for i in range(LOAD_TRAINERS):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(d.sock)
                s.setblocking(False)
                c = LoadConn("trainer", s, i)
                c.out = (json.dumps({"type": "hello", "protocol": 1, "run": "load-%03d" % i, "layers": L, "heads": H,
                                     "seq_len": 128}) + "\n").encode()
                trainers.append(c)
                sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
            # 20 SSE clients follow every run; the others one run each
            n_all = max(1, LOAD_SSE // 5)
            for i in range(LOAD_SSE):
                s = socket.create_connection(("127.0.0.1", port))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
                s.setblocking(False)
                c = LoadConn("sse", s, i)
                target = "/api/stream" if i < n_all else "/api/stream?run=%d" % (i % LOAD_TRAINERS + 1)
                c.out = ("GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" % target).encode()  # 1.0: no chunk framing inside the events
                sses.append(c)
                sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, c)

            def pump(deadline, sending, until=None):
                t_start = time.time()
                while time.time() < deadline and not (until and until()):
                    now = time.time()
                    if sending:
                        due = int((now - t_start) * rate)
                        for c in trainers:
                            if c.welcomed and c.seq < due and not c.closed and len(c.out) < (1 << 20):
                                tmpl = templates[c.idx % len(templates)]
                                while c.seq < due:
                                    c.seq += 1
                                    c.out += (tmpl % (c.seq, c.seq)).encode()
                                sel.modify(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
                    for key, ev in sel.select(timeout=0.02):
                        c = key.data
                        if ev & selectors.EVENT_WRITE and c.out:
                            try:
                                n = c.sock.send(c.out)
                                c.out = c.out[n:]
                            except BlockingIOError:
                                pass
                            if not c.out:
                                sel.modify(c.sock, selectors.EVENT_READ, c)
                        if ev & selectors.EVENT_READ:
                            try:
                                data = c.sock.recv(1 << 20)
                            except BlockingIOError:
                                continue
                            except ConnectionResetError:
                                data = b""
                            if not data:
                                c.closed = True
                                sel.unregister(c.sock)
                                continue
                            if c.kind == "sse":
                                both = c.tail + data
                                c.steps_seen += both.count(b"event: step\n")
                                c.resets += both.count(b"event: reset\n")
                                c.tail = both[-16:]
                                # do not count an event twice across the kept tail
                                c.steps_seen -= c.tail.count(b"event: step\n")
                                c.resets -= c.tail.count(b"event: reset\n")
                            else:
                                c.inbuf += data
                                *lines, c.inbuf = c.inbuf.split(b"\n")
                                for ln in lines:
                                    m = json.loads(ln)
                                    if m["type"] == "welcome":
                                        c.welcomed = True
                                        c.run_id = m["run_id"]
                                    elif m["type"] == "ack":
                                        c.acked = m["seq"]
                                    elif m["type"] == "error":
                                        c.errors.append(m)
                # a finished pass: nothing

            rss = []
            t0 = time.time()
            sampler_stop = threading.Event()

            def sample():
                while not sampler_stop.is_set():
                    try:
                        rss.append((time.time() - t0, d.rss_kb()))
                    except (OSError, ValueError):
                        pass
                    sampler_stop.wait(1.0)
            th = threading.Thread(target=sample, daemon=True)
            th.start()
            # the hellos answered: until every trainer is welcomed (a sanitized
            # daemon on a loaded machine took longer than the 2 s once given)
            pump(t0 + 60.0, False, until=lambda: all(c.welcomed for c in trainers))
            self.assertTrue(all(c.welcomed for c in trainers), "not every trainer was welcomed within 60 s")
            t_load = time.time()
            pump(t_load + LOAD_SECONDS, True)
            t_end_send = time.time()
            sent = sum(c.seq for c in trainers)
            deadline = time.time() + 60
            while time.time() < deadline and any(c.acked < c.seq for c in trainers):
                pump(time.time() + 0.2, False)
            t_acked = time.time()
            pump(time.time() + 1.0, False)  # the last SSE events
            sampler_stop.set()
            th.join()
            acked = sum(c.acked for c in trainers)
            errors = [e for c in trainers for e in c.errors]
            closed = [c.idx for c in trainers + sses if c.closed]
            all_runs = sses[:n_all]
            resets = sum(c.resets for c in sses)
            values = acked * (L * H * NHEAD + 2 * L + 4)
            rate_steps = acked / (t_acked - t_load)
            max_rss = max(r for _, r in rss)
            half = [r for t, r in rss if t > (t_end_send - t0) / 2]
            first = [r for t, r in rss if t <= (t_end_send - t0) / 2]
            stored = d.query("SELECT count(*) FROM steps")[0][0]
            report = ("load: %d trainers (12x12, 8 head metrics, %.0f steps/s each) + %d SSE clients, %.0f s: "
                      "%d steps sent, %d acked, %d stored, %d error lines, %d closed connections, %d SSE resets; "
                      "ingest %.0f steps/s = %.2fM values/s; last ack %.1f s after sending stopped; "
                      "all-runs SSE clients saw %s of %d steps; RSS max %.0f MiB (first half max %.0f, second half max %.0f)"
                      % (LOAD_TRAINERS, rate, LOAD_SSE, LOAD_SECONDS, sent, acked, stored, len(errors), len(closed), resets,
                         rate_steps, values / (t_acked - t_load) / 1e6, t_acked - t_end_send,
                         sorted(set(c.steps_seen for c in all_runs)), sent, max_rss / 1024,
                         max(first or [0]) / 1024, max(half or [0]) / 1024))
            print(report)
            record(load_trainers=LOAD_TRAINERS, load_sse=LOAD_SSE, load_seconds=LOAD_SECONDS, load_sent=sent,
                   load_acked=acked, load_stored=stored, load_errors=len(errors), load_closed=len(closed),
                   load_resets=resets, load_steps_per_s=round(rate_steps), load_values_per_s=round(values / (t_acked - t_load)),
                   load_rss_max_mib=round(max_rss / 1024, 1), load_rss_first_half_mib=round(max(first or [0]) / 1024, 1),
                   load_rss_second_half_mib=round(max(half or [0]) / 1024, 1))
            self.assertEqual(errors, [])
            self.assertEqual(closed, [])
            self.assertEqual(resets, 0)
            self.assertEqual(acked, sent)
            self.assertEqual(stored, sent)
            for c in all_runs:
                self.assertEqual(c.steps_seen, sent, "an all-runs SSE client missed steps")
            for c in sses[n_all:]:
                self.assertGreater(c.steps_seen, 0)
            # ASan's shadow memory and quarantine take several hundred MiB more
            limit_mib = 2048 if os.environ.get("SANITIZE") else 1024
            self.assertLess(max_rss, limit_mib * 1024, "RSS over %d MiB" % limit_mib)
            self.assertTrue(d.alive())
        finally:
            for c in trainers + sses:
                try:
                    c.sock.close()
                except OSError:
                    pass
            d.cleanup()


# ---- security ---------------------------------------------------------


def listening_addrs(pid):
    """(family, ip hex, port) of every TCP socket pid listens on."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    for fam in ("tcp", "tcp6"):
        with open("/proc/%d/net/%s" % (pid, fam)) as f:
            for line in f.readlines()[1:]:
                p = line.split()
                if p[3] == "0A" and p[9] in inodes:  # LISTEN
                    ip, port = p[1].split(":")
                    out.append((fam, ip, int(port, 16)))
    return out


class SecurityTest(unittest.TestCase):
    def test_http_listens_on_loopback_by_default_and_tcp_ingest_needs_an_address(self):
        tmp = tempfile.TemporaryDirectory()
        p = subprocess.Popen([ENTROPYD, "--data", tmp.name], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            first = p.stdout.readline().decode()
            if not first:  # 8080 was taken: that is an error, never a daemon without HTTP
                err = p.communicate(timeout=10)[1].decode()
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("127.0.0.1:8080", err)
            else:
                self.assertIn("socket", first)
                addrs = listening_addrs(p.pid)
                self.assertEqual(addrs, [("tcp", "0100007F", 8080)], "HTTP must listen on 127.0.0.1 only by default")
        finally:
            if p.poll() is None:
                p.terminate()
                p.wait(10)
            p.stdout.close()
            p.stderr.close()
            tmp.cleanup()
        # TCP ingest exists only on an explicit HOST:PORT: a bare port is refused
        for spec in (":7070", "7070"):
            r = subprocess.run([ENTROPYD, "--data", tempfile.mkdtemp(prefix="entropyd-sec-"), "--http", "off",
                                "--listen-tcp", spec], capture_output=True, timeout=20)
            self.assertNotEqual(r.returncode, 0, spec)
            self.assertIn(b"HOST:PORT", r.stderr)

    def test_data_directory_is_private(self):
        """The socket is 0600; the database beside it must not be readable
        by others either: a data directory the daemon creates is 0700."""
        tmp = tempfile.TemporaryDirectory()
        data = os.path.join(tmp.name, "new")
        p = subprocess.Popen([ENTROPYD, "--data", data, "--http", "off"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
        try:
            self.assertIn("socket", p.stdout.readline().decode())
            self.assertEqual(os.stat(data).st_mode & 0o777, 0o700)
            self.assertEqual(os.stat(os.path.join(data, "entropyd.sock")).st_mode & 0o777, 0o600)
        finally:
            p.terminate()
            p.wait(10)
            p.stdout.close()
            tmp.cleanup()

    def test_token_is_required_on_the_unix_socket_too(self):
        d = Daemon(args=["--token", "s3cret"]).start()
        try:
            c = Client(d.sock)
            self.assertEqual(c.hello("tok")["code"], "unauthorized")
            with self.assertRaises((EOFError, ConnectionResetError)):
                c.recv(timeout=5)  # and the connection is closed
            c = Client(d.sock)
            self.assertEqual(c.hello("tok", token="s3cre")["code"], "unauthorized")
            c = Client(d.sock)
            self.assertEqual(c.hello("tok", token="s3cret")["type"], "welcome")
            self.assertEqual(d.query("SELECT count(*) FROM runs")[0][0], 1)
        finally:
            d.cleanup()

    def test_http_request_line_and_header_limits(self):
        d = Daemon(args=["--http", "127.0.0.1:0"]).start()
        try:
            port = http_port(d)
            # 200 KiB of headers: over the 128 KiB per-connection limit
            st, _ = http_get(port, "/healthz", "X-Big: %s\r\n" % ("a" * (200 << 10)))
            self.assertIn(st, (None, 400, 413, 431), "a 200 KiB header block must be refused")
            many = "".join("X-H%d: %s\r\n" % (i, "b" * 100) for i in range(2000))
            st, _ = http_get(port, "/healthz", many)
            self.assertIn(st, (None, 400, 413, 431))
            st, _ = http_get(port, "/api/runs?status=" + "x" * (200 << 10))
            self.assertIn(st, (None, 400, 413, 414, 431))
            # the daemon serves on
            self.assertEqual(http_get(port, "/healthz")[0], 200)
            self.assertTrue(d.alive())
        finally:
            d.cleanup()

    def test_http_connection_limit(self):
        d = Daemon(args=["--http", "127.0.0.1:0", "--http-max-conns", "8"]).start()
        held = []
        try:
            port = http_port(d)
            for _ in range(8):  # 8 requests being answered (streams) hold every slot
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"GET /api/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                self.assertIn(b" 200 ", s.recv(4096))
                held.append(s)
            # every ordinary slot serves a stream: a newcomer gets one of the
            # reserved slots (daemon/http_slots.h), which answer a health
            # check and refuse anything else, naming the limit
            st, _ = http_get(port, "/healthz", timeout=5)
            self.assertEqual(st, 200, "a health check over --http-max-conns busy slots gets a reserved slot")
            st, body = http_get(port, "/api/runs", timeout=5)
            self.assertEqual(st, 503, body[:300])
            self.assertIn(b"--http-max-conns", body)
            for s in held:
                s.close()
            held = []
            # once the server has seen the streams close, their slots serve anything again
            wait_for(lambda: http_get(port, "/api/runs")[0] == 200, timeout=10, what="the streams' slots freed")
            self.assertEqual(http_get(port, "/healthz")[0], 200)
        finally:
            for s in held:
                s.close()
            d.cleanup()

    def test_trainer_connection_limit(self):
        d = Daemon(args=["--max-conns", "5"], http=True).start()
        try:
            cs = [Client(d.sock) for _ in range(5)]
            for i, c in enumerate(cs):
                self.assertEqual(c.hello("conn-%d" % i)["type"], "welcome")
            extra = Client(d.sock)  # told why, then closed
            m = extra.recv()
            self.assertEqual((m["type"], m["code"]), ("error", "internal"))
            self.assertIn("too many connections", m["message"])
            with self.assertRaises((EOFError, ConnectionResetError)):
                extra.recv(timeout=5)
            cs[0].close()
            # a hello before the daemon has seen the close would be refused, rightly
            wait_for(lambda: "\nentropyd_connections_open 4\n" in d.get("/metrics")[1], what="the closed slot freed")
            again = Client(d.sock)
            self.assertEqual(again.hello("conn-again")["type"], "welcome")
        finally:
            d.cleanup()

    HOSTILE = ["x' OR '1'='1", "x\"; DROP TABLE runs; --", "1; DELETE FROM frames", "%' --", "\\'; ATTACH DATABASE '/tmp/x' AS x; --"]

    def test_no_sql_is_built_from_input(self):
        d = Daemon(args=["--http", "127.0.0.1:0"]).start()
        try:
            port = http_port(d)
            c = Client(d.sock)
            # hostile text where the protocol allows free text: stored verbatim
            w = c.hello("sql", meta={"note": self.HOSTILE[1]})
            for i, h in enumerate(self.HOSTILE):
                c.send({"type": "event", "seq": i + 1, "level": "info", "text": h})
            c.send(step_msg(len(self.HOSTILE) + 1, 1))
            c.wait_ack(len(self.HOSTILE) + 1)
            # where it does not, refused by the parser
            for h in self.HOSTILE:
                c.send({"type": "hello", "protocol": 1, "run": h, "layers": 2, "heads": 3, "seq_len": 1})
                self.assertEqual(c.recv()["code"], "bad_field")
                c.send({"type": "step", "seq": 99, "step": 2, "scalars": {h: 1.0}})
                self.assertEqual(c.recv()["code"], "bad_field")
            texts = [r[0] for r in d.query("SELECT text FROM events WHERE run_id=? ORDER BY seq", (w["run_id"],))]
            self.assertEqual(texts, self.HOSTILE)
            self.assertEqual(json.loads(d.query("SELECT meta FROM runs WHERE id=?", (w["run_id"],))[0][0]),
                             {"note": self.HOSTILE[1]})
            # through every text parameter of the HTTP API: a clean 4xx, never 500
            from urllib.parse import quote
            rid = w["run_id"]
            for h in self.HOSTILE:
                q = quote(h, safe="")
                for target, ok in (("/api/runs?status=" + q, (400,)),
                                   ("/api/runs/%d/series?metric=%s" % (rid, q), (404,)),
                                   ("/api/runs/%d/frame?metric=%s" % (rid, q), (404,)),
                                   ("/api/runs/%d/series?metric=loss&agg=%s" % (rid, q), (400,)),
                                   ("/api/runs/%d/export?format=%s" % (rid, q), (400,)),
                                   ("/api/runs/%s" % q, (400, 404)),
                                   ("/api/stream?run=%s" % q, (400,))):
                    st, body = http_get(port, target)
                    self.assertIn(st, ok, "%s -> %s %r" % (target, st, body[:200]))
            self.assertEqual(d.query("SELECT count(*) FROM runs")[0][0], 1)
            self.assertEqual(d.query("SELECT count(*) FROM frames")[0][0], 4)  # entropy_norm derived
            self.assertEqual(d.query("PRAGMA integrity_check")[0][0], "ok")
        finally:
            d.cleanup()

    def test_sql_text_in_the_sources_takes_no_strings(self):
        """Where the daemon formats SQL text (snprintf into a buffer later
        prepared or executed), only numbers are formatted in; the one %s
        (query.c's prepare_runs) is passed string literals only. Any new
        sqlite3_mprintf / sqlite3_snprintf / %q is flagged for review."""
        bad, seen = [], 0
        for name in sorted(os.listdir(os.path.join(ROOT, "daemon"))):
            if not name.endswith(".c"):
                continue
            src = open(os.path.join(ROOT, "daemon", name)).read()
            for m in re.finditer(r"sqlite3_(mprintf|vmprintf|snprintf)\s*\(", src):
                bad.append("%s: sqlite3_%s" % (name, m.group(1)))
            for m in re.finditer(r"snprintf\(\s*sql\s*,\s*sizeof\s+sql\s*,((?:\s*\"(?:[^\"\\]|\\.)*\"|\s*[A-Z_]+)+)", src):
                fmt = "".join(re.findall(r"\"((?:[^\"\\]|\\.)*)\"", m.group(1)))
                seen += 1
                convs = re.findall(r"%[-+ #0]*[0-9]*(?:\.[0-9]+)?(?:ll|l|z|j|h)?[a-zA-Z%]", fmt)
                for cv in convs:
                    if cv[-1] in "dfgiu%":
                        continue
                    if cv == "%s" and name == "query.c" and "FROM runs %s" in fmt:
                        continue
                    bad.append("%s: %s in %r" % (name, cv, fmt[:80]))
            if name == "query.c":
                for m in re.finditer(r"prepare_runs\(\s*q\s*,\s*([^,]+),", src):
                    if not m.group(1).strip().startswith('"'):
                        bad.append("query.c: prepare_runs called with %s" % m.group(1).strip())
        self.assertEqual(bad, [])
        self.assertGreaterEqual(seen, 5, "the scan no longer finds the SQL formats it is meant to check")


if __name__ == "__main__":
    unittest.main(verbosity=2)
