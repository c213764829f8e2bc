"""End-to-end tests of entropyd's ingest: the real daemon, real sockets, the
real SQLite file. Every message type, every bad input of the ingest issue,
exactly-once across reconnects and kill -9, drain on SIGTERM, stale/live,
full disk, many connections, slow readers."""
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import (ENTROPYD, Client, Daemon, floats, head_value, isnan,  # noqa: E402
                            step_msg, wait_for)


class IngestTest(unittest.TestCase):
    def setUp(self):
        self.d = Daemon().start()

    def tearDown(self):
        if self.d.proc is not None and not self.d.alive():
            print("daemon died; its log:\n" + self.d.log()[-4000:])
        self.d.cleanup()

    def client(self):
        return Client(self.d.sock)

    def run_id(self, name):
        return self.d.query("SELECT id FROM runs WHERE name = ?", (name,))[0][0]

    # ---- every message type ----

    def test_message_types_are_stored(self):
        c = self.client()
        w = c.hello("types", meta={"model": {"layers": 2}, "lr": 0.001})
        self.assertEqual(w["type"], "welcome")
        self.assertEqual(w["last_seq"], 0)
        c.send({"type": "step", "seq": 1, "step": 10, "time": 1764500000.5,
                "scalars": {"loss": 2.5, "lr": None},
                "layers": {"rank_ratio": [0.25, None]},
                "heads": {"entropy": [[1.5, 2.5, 3.5], [None, 0.0, -1.25]]}})
        c.wait_ack(1)
        c.send({"type": "event", "seq": 2, "level": "warn", "text": "héllo \"world\"\n"})
        c.wait_ack(2)
        c.send({"type": "end", "seq": 3, "status": "finished"})
        c.wait_ack(3)
        rid = w["run_id"]
        run = self.d.query("SELECT name, status, layers, heads, seq_len, meta, last_seq, last_step FROM runs WHERE id=?", (rid,))[0]
        self.assertEqual(run[:5], ("types", "finished", 2, 3, 16))
        self.assertEqual(json.loads(run[5]), {"model": {"layers": 2}, "lr": 0.001})
        self.assertEqual(run[6:], (3, 10))
        rows = dict((name, (kind, floats(data))) for name, kind, data in self.d.query(
            "SELECT m.name, m.kind, f.data FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.run_id=? AND f.step=10", (rid,)))
        self.assertEqual(rows["loss"], (0, [2.5]))
        self.assertTrue(isnan(rows["lr"][1][0]), "null must be stored as NaN, not dropped or zero")
        self.assertEqual(rows["rank_ratio"][1][0], 0.25)
        self.assertTrue(isnan(rows["rank_ratio"][1][1]))
        ent = rows["entropy"][1]
        self.assertEqual(rows["entropy"][0], 2)
        self.assertEqual(ent[:3], [1.5, 2.5, 3.5])
        self.assertTrue(isnan(ent[3]))
        self.assertEqual(ent[4:], [0.0, -1.25])
        ev = self.d.query("SELECT seq, level, text FROM events WHERE run_id=?", (rid,))
        self.assertEqual(ev, [(2, "warn", "héllo \"world\"\n")])
        self.assertEqual(self.d.query("SELECT step, seq, time FROM steps WHERE run_id=?", (rid,)), [(10, 1, 1764500000.5)])

    # ---- bad input: each gets an error line and the connection goes on ----

    def expect_error(self, c, raw, code):
        c.send_raw(raw if isinstance(raw, bytes) else json.dumps(raw).encode() + b"\n")
        m = c.recv()
        self.assertEqual(m["type"], "error", m)
        self.assertEqual(m["code"], code, m)
        return m

    def test_bad_input_before_hello(self):
        c = self.client()
        self.expect_error(c, b"{not json\n", "bad_json")
        self.expect_error(c, b"[1,2]\n", "bad_json")
        self.expect_error(c, b"\xff\xfe\n", "bad_json")
        self.expect_error(c, b'{"type":"st\xc0\xafep"}\n', "bad_json")
        self.expect_error(c, {"type": "dance"}, "bad_type")
        self.expect_error(c, {"seq": 1}, "bad_type")
        self.expect_error(c, {"type": 5}, "bad_type")
        self.expect_error(c, {"type": "step", "seq": 1, "step": 0}, "no_hello")
        self.expect_error(c, {"type": "hello", "protocol": 2, "run": "x", "layers": 1, "heads": 1, "seq_len": 1}, "bad_protocol")
        self.expect_error(c, {"type": "hello", "protocol": 1, "layers": 1, "heads": 1, "seq_len": 1}, "missing_field")
        self.expect_error(c, {"type": "hello", "protocol": 1, "run": "a b", "layers": 1, "heads": 1, "seq_len": 1}, "bad_field")
        self.expect_error(c, {"type": "hello", "protocol": 1, "run": "x", "layers": "2", "heads": 1, "seq_len": 1}, "bad_field")
        self.expect_error(c, {"type": "hello", "protocol": 1, "run": "x", "layers": 0, "heads": 1, "seq_len": 1}, "bad_field")
        self.expect_error(c, b"{" + b'"a":[' * 100 + b"\n", "bad_json")
        # still usable
        self.assertEqual(c.hello("after-errors")["type"], "welcome")

    def test_bad_steps_after_hello(self):
        c = self.client()
        c.hello("bad-steps", layers=2, heads=3)
        e = self.expect_error(c, {"type": "step", "seq": 1}, "missing_field")
        self.assertEqual(e.get("seq"), 1)
        self.expect_error(c, {"type": "step", "seq": "1", "step": 0}, "bad_field")
        self.expect_error(c, {"type": "step", "seq": 0, "step": 0}, "bad_field")
        self.expect_error(c, {"type": "step", "seq": 1, "step": -1}, "bad_field")
        self.expect_error(c, {"type": "step", "seq": 1, "step": 0, "scalars": {"loss": "high"}}, "bad_field")
        self.expect_error(c, {"type": "step", "seq": 1, "step": 0, "scalars": []}, "bad_field")
        self.expect_error(c, {"type": "step", "seq": 1, "step": 0, "layers": {"r": [1, 2, 3]}}, "bad_shape")
        self.expect_error(c, {"type": "step", "seq": 1, "step": 0, "heads": {"e": [[1, 2, 3]]}}, "bad_shape")
        self.expect_error(c, {"type": "step", "seq": 1, "step": 0, "heads": {"e": [[1, 2, 3], [1, 2]]}}, "bad_shape")
        self.expect_error(c, {"type": "step", "seq": 1, "step": 0, "heads": {"e": [1, 2]}}, "bad_field")
        self.expect_error(c, {"type": "step", "seq": 1, "step": 0, "scalars": {"bad name": 1}}, "bad_field")
        self.expect_error(c, {"type": "event", "seq": 1, "level": "fatal", "text": "x"}, "bad_field")
        self.expect_error(c, {"type": "end", "seq": 1, "status": "live"}, "bad_field")
        self.expect_error(c, {"type": "step", "seq": 2, "step": 0}, "seq_gap")
        c.send(step_msg(1, 0))
        c.wait_ack(1)
        self.expect_error(c, step_msg(1, 0), "duplicate")
        self.expect_error(c, step_msg(3, 1), "seq_gap")
        # a metric name reused as another kind: stored without it, and said so
        c.send({"type": "step", "seq": 2, "step": 1, "scalars": {"entropy": 1.0, "loss": 2.0}})
        m, _ = c.recv_until(lambda m: m["type"] == "error")
        self.assertEqual(m["code"], "kind_conflict")
        c.wait_ack(2)
        rid = self.run_id("bad-steps")
        self.assertEqual(self.d.query("SELECT last_seq FROM runs WHERE id=?", (rid,))[0][0], 2)
        self.assertEqual(self.d.query("SELECT count(*) FROM steps WHERE run_id=?", (rid,))[0][0], 2)
        c.send({"type": "end", "seq": 3, "status": "failed"})
        c.wait_ack(3)
        self.expect_error(c, step_msg(4, 2), "run_ended")
        self.assertEqual(c.hello("bad-steps")["last_seq"], 3)

    def test_oversized_line_is_skipped_and_connection_survives(self):
        c = self.client()
        c.hello("big")
        # over the line limit: 4 MiB + 128 bytes a cell of --max-cells-per-run (12 MiB by default)
        big = b'{"type":"event","seq":1,"level":"info","text":"' + b"x" * (13 << 20) + b'"}\n'
        c.send_raw(big)
        m = c.recv(timeout=30)
        self.assertEqual(m["code"], "line_too_long")
        c.send(step_msg(1, 0))
        c.wait_ack(1)

    def test_shape_mismatch_on_resume_and_takeover(self):
        a = self.client()
        a.hello("shape", layers=2, heads=3)
        b = self.client()
        self.assertEqual(b.hello("shape", layers=4, heads=3)["code"], "shape_mismatch")
        # a third connection takes the run over; the first is told and closed
        w = b.hello("shape", layers=2, heads=3)
        self.assertEqual(w["type"], "welcome")
        m = a.recv()
        self.assertEqual(m["code"], "superseded")
        with self.assertRaises((EOFError, ConnectionResetError)):
            a.recv(timeout=5)
        b.send(step_msg(1, 0))
        b.wait_ack(1)

    def test_history_rewrite_on_step_regression(self):
        c = self.client()
        c.hello("rewind")
        for i in range(1, 11):
            c.send(step_msg(i, i * 10))
        c.wait_ack(10)
        c.send(step_msg(11, 50))  # rolled back to a checkpoint at step 50
        c.wait_ack(11)
        rid = self.run_id("rewind")
        steps = [r[0] for r in self.d.query("SELECT step FROM steps WHERE run_id=? ORDER BY step", (rid,))]
        self.assertEqual(steps, [10, 20, 30, 40, 50])
        ev = self.d.query("SELECT text FROM events WHERE run_id=?", (rid,))
        self.assertTrue(any("rollback to step 50" in e[0] for e in ev), ev)
        # the abandoned branch is kept apart, not lost
        br = self.d.query("SELECT id, from_step, to_step FROM branches WHERE run_id=?", (rid,))
        self.assertEqual([b[1:] for b in br], [(50, 100)])
        kept = self.d.query("SELECT DISTINCT step FROM abandoned_frames WHERE branch_id=? ORDER BY step", (br[0][0],))
        self.assertEqual([k[0] for k in kept], [50, 60, 70, 80, 90, 100])

    # ---- connections ----

    def test_stale_on_disconnect_and_live_on_reconnect(self):
        c = self.client()
        c.hello("stale")
        c.send(step_msg(1, 0))
        c.wait_ack(1)
        c.close()
        deadline = time.time() + 5
        while time.time() < deadline and self.d.query("SELECT status FROM runs WHERE name='stale'")[0][0] != "stale":
            time.sleep(0.05)
        self.assertEqual(self.d.query("SELECT status FROM runs WHERE name='stale'")[0][0], "stale")
        c = self.client()
        self.assertEqual(c.hello("stale")["last_seq"], 1)
        self.assertEqual(self.d.query("SELECT status FROM runs WHERE name='stale'")[0][0], "live")

    def test_exactly_once_across_reconnect(self):
        c = self.client()
        c.hello("once")
        for i in range(1, 51):
            c.send(step_msg(i, i))
        c.wait_ack(50)
        # more, then drop the connection without waiting for acks
        for i in range(51, 81):
            c.send(step_msg(i, i))
        c.close()
        c = self.client()
        w = c.hello("once")
        last = w["last_seq"]
        self.assertGreaterEqual(last, 50)
        self.assertLessEqual(last, 80)
        # a careless trainer resends a few old ones: they are refused as duplicates
        for i in range(last - 2, 101):
            c.send(step_msg(i, i))
        c.wait_ack(100)
        rid = self.run_id("once")
        rows = self.d.query("SELECT step, seq FROM steps WHERE run_id=? ORDER BY step", (rid,))
        self.assertEqual(rows, [(i, i) for i in range(1, 101)])
        self.assertEqual(self.d.query("SELECT count(*) FROM frames f JOIN metrics m ON m.id=f.metric_id "
                                      "WHERE m.run_id=? AND m.name='entropy'", (rid,))[0][0], 100)

    def test_half_line_stall_and_many_connections(self):
        stall = self.client()
        stall.hello("stall")
        stall.send_raw(b'{"type":"step","seq":1,"st')  # and never more
        idle = []
        for _ in range(2000):
            idle.append(self.client())
        c = self.client()
        c.hello("busy")
        t0 = time.time()
        for i in range(1, 21):
            c.send(step_msg(i, i))
        c.wait_ack(20)
        self.assertLess(time.time() - t0, 5)
        stall.send_raw(b'ep":0}\n')  # the rest of the line arrives much later
        stall.wait_ack(1)
        for s in idle:
            s.close()
        self.assertTrue(self.d.alive())

    def test_client_that_never_reads(self):
        c = self.client()
        c.hello("deaf")
        c.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # a flood of bad lines answered with errors nobody reads, then good steps
        payload = b"{bad}\n" * 200000 + b"".join(
            json.dumps(step_msg(i, i)).encode() + b"\n" for i in range(1, 2001))

        def flood():
            try:
                c.s.sendall(payload)
            except OSError:
                pass  # the daemon closed this client: too many unread errors
        t = threading.Thread(target=flood, daemon=True)
        t.start()
        other = self.client()
        other.hello("other")
        for i in range(1, 11):
            other.send(step_msg(i, i))
        other.wait_ack(10)
        t.join(30)
        self.assertTrue(self.d.alive())
        self.assertLess(self.d.rss_kb(), 300 * 1024)

    def test_tcp_and_token(self):
        self.d.cleanup()
        port = __import__("daemon_harness").free_port()
        self.d = Daemon(args=["--listen-tcp", "127.0.0.1:%d" % port, "--token", "s3cret"]).start()
        c = Client(tcp=("127.0.0.1", port))
        m = c.hello("tok")
        self.assertEqual(m["code"], "unauthorized")
        c = Client(tcp=("127.0.0.1", port))
        self.assertEqual(c.hello("tok", token="wrong")["code"], "unauthorized")
        c = Client(tcp=("127.0.0.1", port))
        self.assertEqual(c.hello("tok", token="s3cret")["type"], "welcome")
        c.send(step_msg(1, 0))
        c.wait_ack(1)
        self.assertEqual(os.stat(self.d.sock).st_mode & 0o777, 0o600)

    # ---- lifecycle ----

    def test_sigterm_commits_and_acks_then_exits_0(self):
        # a drain long enough for a sanitizer build on a loaded machine: the
        # default 5 s can run out before the last batch is committed and acked
        self.d.stop()
        self.d = Daemon(args=["--drain-ms", "60000"]).start()
        c = self.client()
        c.hello("drain")
        n = 3000
        c.s.sendall(b"".join(json.dumps(step_msg(i, i)).encode() + b"\n" for i in range(1, n + 1)))
        last = c.recv_until(lambda m: m["type"] == "ack")[0]["seq"]
        self.d.proc.send_signal(signal.SIGTERM)
        try:
            while True:
                m = c.recv(timeout=60)
                if m["type"] == "ack":
                    last = m["seq"]
        except (EOFError, ConnectionResetError):
            pass
        self.assertEqual(self.d.proc.wait(60), 0)
        stored = self.d.query("SELECT last_seq FROM runs WHERE name='drain'")[0][0]
        self.assertEqual(stored, last, "the last ack must say exactly what was committed")
        self.assertGreater(last, 0)
        self.assertEqual(self.d.query("SELECT status FROM runs WHERE name='drain'")[0][0], "stale")

    def test_newer_schema_is_refused(self):
        self.d.stop()
        con = sqlite3.connect(self.d.db)
        con.execute("PRAGMA user_version = 999")
        con.close()
        r = subprocess.run([os.environ.get("ENTROPYD", "build/entropyd"), "--data", self.d.data] +
                           (["--http", "off"] if Daemon._has_http_flag() else []),
                           capture_output=True, timeout=20)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"newer than this entropyd", r.stderr)

    def test_a_hello_over_the_cell_cap_is_refused(self):
        self.d.cleanup()
        self.d = d = Daemon(args=["--max-cells-per-run", "64"]).start()
        c = self.client()
        m = c.hello("too-wide", layers=4, heads=17)
        self.assertEqual((m["type"], m["code"]), ("error", "bad_field"))
        self.assertIn("68 cells", m["message"])
        self.assertIn("--max-cells-per-run 64", m["message"])
        self.assertEqual(d.query("SELECT count(*) FROM runs WHERE name='too-wide'")[0][0], 0)
        # the connection stays, and a run within the cap is taken on it
        self.assertEqual(c.hello("just-fits", layers=4, heads=16)["type"], "welcome")
        c.send(step_msg(1, 1, layers=4, heads=16))
        c.wait_ack(1)

    def test_the_default_cell_cap(self):
        c = self.client()
        m = c.hello("one-too-many", layers=256, heads=257)
        self.assertEqual((m["type"], m["code"]), ("error", "bad_field"))
        self.assertIn("--max-cells-per-run 65536", m["message"])
        self.assertEqual(c.hello("at-the-cap", layers=256, heads=256)["type"], "welcome")

    def test_help_and_bad_flags(self):
        exe = os.environ.get("ENTROPYD", "build/entropyd")
        r = subprocess.run([exe, "--help"], capture_output=True, timeout=10)
        self.assertEqual(r.returncode, 0)
        self.assertIn(b"--listen-tcp", r.stdout)
        r = subprocess.run([exe, "--max-conns", "zero"], capture_output=True, timeout=10)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--max-conns", r.stderr)
        r = subprocess.run([exe, "--max-cells-per-run", "0"], capture_output=True, timeout=10)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--max-cells-per-run", r.stderr)


class Trainer(threading.Thread):
    """A well-behaved trainer: keeps every unacked message, reconnects with
    backoff, and resends from the welcome's last_seq. Stops after n steps
    are acked."""

    def __init__(self, sock, run, n):
        super().__init__(daemon=True)
        self.sock, self.run_name, self.n = sock, run, n
        self.acked = 0
        self.reconnects = 0
        self.stop = False

    def run(self):
        while self.acked < self.n and not self.stop:
            try:
                c = Client(self.sock, timeout=5)
                w = c.hello(self.run_name)
                if w["type"] != "welcome":
                    raise RuntimeError(w)
                self.acked = w["last_seq"]
                seq = self.acked
                while self.acked < self.n and not self.stop:
                    while seq < min(self.n, self.acked + 200):
                        seq += 1
                        c.send(step_msg(seq, seq))
                    m = c.recv(timeout=5)
                    if m["type"] == "ack":
                        self.acked = m["seq"]
                c.close()
            except (OSError, EOFError, ValueError):
                self.reconnects += 1
                time.sleep(0.05)  # not a wait: a reconnecting trainer's pause


class CrashTest(unittest.TestCase):
    def test_kill9_mid_stream_then_resume_exactly_once(self):
        d = Daemon().start()
        try:
            t = Trainer(d.sock, "crashy", 3000)
            t.start()
            for _ in range(3):
                deadline = time.time() + 10
                start = t.acked
                while t.acked < start + 300 and time.time() < deadline:
                    time.sleep(0.01)
                d.kill9()
                d.start()
            t.join(60)
            self.assertEqual(t.acked, 3000, "trainer did not finish")
            self.assertGreaterEqual(t.reconnects, 3)
            rid = d.query("SELECT id FROM runs WHERE name='crashy'")[0][0]
            rows = d.query("SELECT step, seq FROM steps WHERE run_id=? ORDER BY step", (rid,))
            self.assertEqual(rows, [(i, i) for i in range(1, 3001)])
            n = d.query("SELECT count(*), count(DISTINCT f.step) FROM frames f JOIN metrics m ON m.id=f.metric_id "
                        "WHERE m.run_id=? AND m.name='entropy'", (rid,))[0]
            self.assertEqual(n, (3000, 3000))
            # and the values are the ones sent
            data = d.query("SELECT f.data FROM frames f JOIN metrics m ON m.id=f.metric_id "
                           "WHERE m.run_id=? AND m.name='entropy' AND f.step=1234", (rid,))[0][0]
            expect = [head_value(1234, l, h) for l in range(2) for h in range(3)]
            self.assertEqual([round(x, 4) for x in floats(data)], [round(x, 4) for x in expect])
        finally:
            d.cleanup()


def stream_until_behind(c, behind, need_told=False):
    """Streams 12x12 steps (seq = step = 1, 2, ...) 20 at a time on client
    c, reading what comes back, until the acks trail what was sent by more
    than `behind` steps (with need_told: and a db_failing line came too), or
    8,000 steps went. Returns (last seq sent, last ack, the db_failing
    lines seen)."""
    seq, last_ack, told = 0, 0, []
    for _ in range(400):
        for _ in range(20):
            seq += 1
            c.send(step_msg(seq, seq, layers=12, heads=12))
        try:
            while True:
                m = c.recv(timeout=0.3)
                if m["type"] == "ack":
                    last_ack = m["seq"]
                elif m["type"] == "error" and m["code"] == "db_failing":
                    told.append(m)
        except (TimeoutError, socket.timeout):
            pass
        if last_ack < seq - behind and (told or not need_told):
            break
    return seq, last_ack, told


class FullDiskTest(unittest.TestCase):
    """A real full disk: the data directory on a small tmpfs. Needs root
    (make test runs as root in CI; the developers' machines too)."""

    def test_full_disk_stops_acks_and_recovers(self):
        mnt = tempfile.mkdtemp(prefix="entropyd-full-")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", mnt], capture_output=True)
        self.assertEqual(r.returncode, 0, "cannot mount a tmpfs (not root?): %s" % r.stderr)
        d = None
        try:
            d = Daemon(data=mnt).start()
            c = Client(d.sock)
            c.hello("full", layers=12, heads=12)
            filler = os.path.join(mnt, "filler")
            with open(filler, "wb") as f:
                f.write(b"\0" * (3 << 20))
            seq, last_ack, early_told = stream_until_behind(c, 200)
            self.assertLess(last_ack, seq - 200, "the disk never filled")
            self.assertTrue(d.alive(), "daemon died on a full disk")
            # while the disk stays full the daemon still answers (a seq it
            # has taken is refused at once, without the disk) and acks
            # nothing it could not commit
            c.send(step_msg(1, 1, layers=12, heads=12))
            m, seen = c.recv_until(lambda m: m["type"] == "error" and m["code"] != "db_failing", timeout=20)
            self.assertEqual(m["code"], "duplicate")
            # and the trainer was told why its acks stopped (once: the streak goes on)
            told = early_told + [x for x in seen if x["type"] == "error" and x["code"] == "db_failing"]
            self.assertEqual(len(told), 1, "one db_failing line for the streak: %s" % told)
            self.assertIn("cannot write its database", told[0]["message"])
            acked = max([last_ack] + [x["seq"] for x in seen if x["type"] == "ack"])
            self.assertLess(acked, seq, "every step acked although the disk was full")
            os.unlink(filler)  # space returns
            m, _ = c.recv_until(lambda m: m["type"] == "ack" and m["seq"] == seq, timeout=30)
            for i in range(seq + 1, seq + 11):
                c.send(step_msg(i, i, layers=12, heads=12))
            c.wait_ack(seq + 10, timeout=20)
            rid = d.query("SELECT id FROM runs WHERE name='full'")[0][0]
            rows = d.query("SELECT step, seq FROM steps WHERE run_id=? ORDER BY step", (rid,))
            self.assertEqual(rows, [(i, i) for i in range(1, seq + 11)])
            c.close()
        finally:
            if d:
                d.cleanup()
            subprocess.run(["umount", "-l", mnt])
            os.rmdir(mnt)


    def test_sigterm_on_a_full_disk_exits_within_the_drain(self):
        """With the disk full and ~2,000 steps queued, SIGTERM
        exits within --drain-ms + 5 s, saying how many steps stay unacked
        (their trainer still holds them), and the log while full grows by at
        most about a line a second."""
        mnt = tempfile.mkdtemp(prefix="entropyd-full-")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", mnt], capture_output=True)
        self.assertEqual(r.returncode, 0, "cannot mount a tmpfs (not root?): %s" % r.stderr)
        d = None
        try:
            d = Daemon(data=mnt, args=["--drain-ms", "1000"])
            logdir = tempfile.TemporaryDirectory(prefix="entropyd-full-log-")
            self.addCleanup(logdir.cleanup)
            d.log_path = os.path.join(logdir.name, "daemon.log")  # not on the full disk
            d.start()
            c = Client(d.sock)
            c.hello("full", layers=12, heads=12)
            with open(os.path.join(mnt, "filler"), "wb") as f:
                f.write(b"\0" * (3 << 20))
            seq, last_ack, told = stream_until_behind(c, 2000, need_told=True)
            self.assertTrue(told, "the trainer was never told the database fails")
            self.assertLess(last_ack, seq - 2000, "~2,000 steps queued unacked")
            log_before = len(d.log().splitlines())
            time.sleep(3)  # not a wait: 3 s of a full disk, the writer retrying, whose log lines are counted
            grown = len(d.log().splitlines()) - log_before
            self.assertLessEqual(grown, 3 * 3 + 2, "log lines in 3 s of a full disk:\n" + "\n".join(d.log().splitlines()[-grown:]))
            t0 = time.time()
            d.proc.send_signal(signal.SIGTERM)
            d.proc.wait(30)
            took = time.time() - t0
            self.assertLess(took, 1.0 + 5.0, "SIGTERM on a full disk took %.1f s" % took)
            self.assertRegex(d.log(), r"\d+ step\(s\) stay unacked at shutdown")
            c.close()
        finally:
            if d:
                d.cleanup()
            subprocess.run(["umount", "-l", mnt])
            os.rmdir(mnt)

class OutOfDescriptorsTest(unittest.TestCase):
    """A daemon out of file descriptors (RLIMIT_NOFILE 96,
    150 idle connections waiting) neither spins nor floods its log: the
    listeners rest 100 ms after each EMFILE, the error is logged at most once
    a second; once descriptors free, a trainer is welcomed again."""

    def test_emfile_backs_off(self):
        tmp = tempfile.TemporaryDirectory(prefix="entropyd-nofile-")
        self.addCleanup(tmp.cleanup)
        log_path = os.path.join(tmp.name, "daemon.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(["prlimit", "--nofile=96:96", ENTROPYD, "--data", tmp.name, "--http", "off"],
                                    stdout=subprocess.PIPE, stderr=log)
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        self.assertTrue(proc.stdout.readline(), "entropyd did not start")
        sock = os.path.join(tmp.name, "entropyd.sock")
        idle = []
        for _ in range(150):
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            idle.append(s)

        def cpu_s():
            with open("/proc/%d/stat" % proc.pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        def accept_lines():
            with open(log_path, "rb") as f:
                return sum(1 for l in f.read().decode(errors="replace").splitlines() if "accept:" in l)
        wait_for(lambda: accept_lines() > 0, what="an accept error logged")
        c0, l0, t0 = cpu_s(), accept_lines(), time.time()
        time.sleep(3)  # not a wait: 3 s out of descriptors, whose CPU and log lines are counted
        cpu, lines, span = cpu_s() - c0, accept_lines() - l0, time.time() - t0
        self.assertLess(cpu / span, 0.25, "daemon CPU while out of descriptors: %.0f%% of a core" % (100 * cpu / span))
        self.assertLessEqual(lines, span + 1, "accept error lines in %.1f s: %d" % (span, lines))
        for s in idle:
            s.close()
        c = Client(sock)
        w = c.hello("after-emfile", layers=2, heads=3)
        self.assertEqual(w["type"], "welcome")
        c.close()

if __name__ == "__main__":
    unittest.main(verbosity=2)
