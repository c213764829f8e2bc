"""Faults nobody chose against the real daemon:
512 event streams holding every HTTP slot while /healthz and /metrics are
asked for; a WAL truncated to 0 bytes under the running daemon, and what a
restart then does.

Each test waits on conditions, never on fixed sleeps; timings are in
make bench (bench/healthz_slots.py), not here. python3 stdlib only."""
import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Client, Daemon, step_msg, use_python_client, wait_for  # noqa: E402
from e2e_http_guard import raw  # noqa: E402

STREAMS = 512  # --http-max-conns' default: every ordinary slot


def open_streams(port, n, first_addr=2):
    """n /api/stream clients, 128 per loopback address from 127.0.0.first_addr
    (the per-address limit is a quarter of the slots); returns the sockets
    once each got its 200."""
    socks = []
    for i in range(n):
        s = socket.socket()
        s.bind(("127.0.0.%d" % (first_addr + i // 128), 0))
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        s.sendall(("GET /api/stream HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port).encode())
        socks.append(s)
    for s in socks:
        head = s.recv(4096)
        if b" 200 " not in head:
            raise AssertionError("a stream was not opened: %r" % head[:200])
    return socks


class ReservedSlotTest(unittest.TestCase):
    def test_healthz_and_metrics_answered_with_every_slot_streaming(self):
        d = Daemon(http=True).start()
        socks = []
        try:
            port = d.http_port
            socks = open_streams(port, STREAMS)
            # every ordinary slot serves a stream now: /metrics itself comes
            # through a reserved slot
            wait_for(lambda: "\nentropyd_stream_clients %d\n" % STREAMS in raw(port, "GET", "/metrics")[1],
                     what="%d stream clients" % STREAMS)
            answered = 0
            for _ in range(20):
                st, body = raw(port, "GET", "/healthz", timeout=5)
                self.assertEqual(st, 200, "/healthz unanswered with %d streams open: %r" % (STREAMS, body))
                answered += 1
            self.assertEqual(answered, 20)
            st, body = raw(port, "GET", "/metrics")
            self.assertEqual(st, 200)
            n = int(body.split("\nentropyd_http_connections_reserved_total ")[1].split()[0])
            self.assertGreaterEqual(n, 21)
            # anything else in a reserved slot: 503 naming why, not a stream
            st, body = raw(port, "GET", "/api/runs")
            self.assertEqual(st, 503, body)
            self.assertIn("only /healthz and /metrics", body)
            # a reserved slot serves one request: the daemon closes it
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port).encode())
            data = b""
            while True:
                b = s.recv(4096)
                if not b:
                    break
                data += b
            s.close()
            self.assertIn(b" 200 ", data)
            # a stream that goes frees an ordinary slot: plain requests again
            socks.pop().close()
            wait_for(lambda: raw(port, "GET", "/api/runs")[0] == 200, what="/api/runs once a stream closed")
            self.assertTrue(d.alive())
        finally:
            for s in socks:
                s.close()
            d.cleanup()


class PerAddressReservedTest(unittest.TestCase):
    """A monitoring probe from an address that holds its share of the slots
    (--http-max-conns-per-ip) in streams gets a reserved slot: /healthz and
    /metrics answered, anything else 503 naming the limit; still bounded by
    the 8 reserved slots."""

    def test_healthz_from_an_address_holding_its_share(self):
        per_ip = 16
        d = Daemon(http=True, args=["--http-max-conns-per-ip", str(per_ip)]).start()
        socks, idle = [], []
        reserved = lambda: int(raw(port, "GET", "/metrics", src="127.0.0.3")[1].split(  # noqa: E731
            "\nentropyd_http_connections_reserved_total ")[1].split()[0])
        try:
            port = d.http_port
            socks = open_streams(port, per_ip)  # all from 127.0.0.2: its share
            wait_for(lambda: "\nentropyd_stream_clients %d\n" % per_ip in raw(port, "GET", "/metrics",
                                                                                src="127.0.0.3")[1],
                     what="%d stream clients" % per_ip)
            for path in ("/healthz", "/metrics"):
                st, body = raw(port, "GET", path, src="127.0.0.2")
                self.assertEqual(st, 200, "%s from an address holding its share: %r" % (path, body[:200]))
            st, body = raw(port, "GET", "/api/runs", src="127.0.0.2")
            self.assertEqual(st, 503, body)
            self.assertIn("--http-max-conns-per-ip", body)
            self.assertIn("only /healthz and /metrics", body)
            self.assertEqual(raw(port, "GET", "/api/runs", src="127.0.0.3")[0], 200)  # other addresses as before
            # bounded by the reserved slots: idle sockets from it take all 8
            # (until they time out, 2 s), and a probe then finds none
            r0 = reserved()
            for _ in range(8):
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.connect(("127.0.0.1", port))
                idle.append(s)
            wait_for(lambda: reserved() >= r0 + 8, what="8 reserved slots taken")
            st, body = raw(port, "GET", "/healthz", src="127.0.0.2", timeout=5)
            if st is not None:  # admitted only if a reserved slot was freed meanwhile (timed out)
                freed = 0
                for s in idle:
                    s.setblocking(False)
                    try:
                        freed += s.recv(1) == b""
                    except BlockingIOError:
                        pass
                self.assertGreater(freed, 0, "a ninth reserved slot for one address: %r" % body[:200])
            print("per-address share held: /healthz and /metrics 200, /api/runs 503; with the 8 reserved slots "
                  "taken a probe was %s" % ("refused" if st is None else "answered after one timed out"),
                  file=sys.stderr)
            # the idle ones time out: a probe is answered again
            wait_for(lambda: raw(port, "GET", "/healthz", src="127.0.0.2")[0] == 200, timeout=20,
                     what="/healthz once the idle reserved slots timed out")
            self.assertTrue(d.alive())
        finally:
            for s in socks + idle:
                s.close()
            d.cleanup()


class LostWalTest(unittest.TestCase):
    def test_a_wal_truncated_under_the_daemon_is_noticed_and_refused_at_restart(self):
        d = Daemon(http=True, args=["--drain-ms", "300"]).start()
        try:
            c = Client(d.sock)
            c.hello("w", layers=2, heads=3)
            for i in range(1, 41):
                c.send(step_msg(i, i))
            c.wait_ack(40)
            st, body = raw(d.http_port, "GET", "/healthz")
            self.assertEqual(st, 200, body)
            wal = d.db + "-wal"
            self.assertGreater(os.path.getsize(wal), 32)
            os.truncate(wal, 0)  # the fault: a WAL cut to nothing under the running daemon
            for i in range(41, 61):
                c.send(step_msg(i, i))
            # noticed: /healthz 503 with the reason, and the trainer told
            # (db_failing); nothing after the truncation is acked
            st, body = wait_for(lambda: (lambda r: r if r[0] == 503 else None)(raw(d.http_port, "GET", "/healthz")),
                                what="/healthz 503")
            self.assertIn('"status":"wal_lost"', body)
            self.assertIn("truncated", body)
            _, seen = c.recv_until(lambda m: m.get("code") == "db_failing", timeout=10)
            acked = [m["seq"] for m in seen if m.get("type") == "ack"]
            self.assertTrue(all(a <= 40 for a in acked), acked)
            self.assertIn("the database takes no more writes", d.log())
            self.assertTrue(os.path.exists(d.db + "-wal-lost"))
            c.close()
            self.assertEqual(d.stop(timeout=30), 0)
            # the next start refuses the database, naming entropyd --check
            d.start(wait=False)
            rc = d.proc.wait(30)
            d.proc.stdout.close()
            d.proc = None
            self.assertNotEqual(rc, 0)
            log = d.log()
            self.assertIn("its WAL was lost under an earlier daemon", log)
            self.assertIn("entropyd --check", log)
            # moved aside and unmarked, as the message says: it starts
            os.rename(wal, wal + ".lost")
            os.remove(d.db + "-wal-lost")
            d.start()
            st, body = raw(d.http_port, "GET", "/healthz")
            self.assertEqual(st, 200, body)
        finally:
            d.cleanup()


HEAD_METRICS = 8  # PROTO_STEP_HEAD_METRICS: what sigmatrain's probe sends
DEFAULT_CELLS = 65536  # --max-cells-per-run's default: 256 x 256


def wide_step(seq, step, metrics, layers, heads, value):
    """A step line of `metrics` head metrics, every value the text `value`."""
    row = "[" + ",".join([value] * heads) + "]"
    grid = "[" + ",".join([row] * layers) + "]"
    hm = ",".join('"m%d":%s' % (k, grid) for k in range(metrics))
    return ('{"type":"step","seq":%d,"step":%d,"scalars":{"loss":1.5},"heads":{%s}}\n' % (seq, step, hm)).encode()


class CellCapLineTest(unittest.TestCase):
    """The largest run --max-cells-per-run admits can send its steps: the
    line limit grows with the cap (proto_line_max, 4 MiB + 128 bytes a cell)."""

    def test_a_step_of_the_largest_run_fits_its_line(self):
        d = Daemon(http=True).start()
        try:
            c = Client(d.sock, timeout=60)
            self.assertEqual(c.hello("wide", layers=256, heads=256)["type"], "welcome")
            # each value at its longest as the client writes a float32
            line = wide_step(1, 0, HEAD_METRICS, 256, 256, "-1.17549435e-38")
            self.assertGreater(len(line), 8 << 20)  # twice the old 4 MiB limit
            c.send_raw(line)
            m, seen = c.recv_until(lambda m: m["type"] in ("ack", "error"), timeout=60)
            self.assertEqual(m["type"], "ack", m)
            # stored, every value
            st, body = raw(d.http_port, "GET", "/api/runs/1/frame?metric=m7&step=0")
            self.assertEqual(st, 200, body[:300])
            self.assertEqual(body.count("-1.17549435e-38"), DEFAULT_CELLS)
            # past the limit (4 MiB + 128 bytes a cell, here 12 MiB): refused,
            # naming the limit, and the connection goes on
            c.send_raw(wide_step(2, 1, 13, 256, 256, "-1.17549435e-38"))
            m, _ = c.recv_until(lambda m: m["type"] in ("ack", "error"), timeout=60)
            self.assertEqual(m.get("code"), "line_too_long", m)
            self.assertIn("12582912 bytes", m["message"])
            c.send_raw(wide_step(2, 1, 1, 256, 256, "0.5"))
            c.wait_ack(2, timeout=60)
            c.close()
        finally:
            d.cleanup()

    @unittest.skipIf(os.environ.get("SANITIZE"), "ctypes cannot load a sanitizer-instrumented client library "
                     "(the unsanitized suite runs this part)")
    def test_the_python_clients_step_of_the_largest_run_fits(self):
        d = Daemon(http=True).start()
        try:
            # the client library's own step of 8 head metrics of random
            # float32s (it dropped every one before: over 4 MiB)
            use_python_client()
            import entropyd
            import random
            rnd = random.Random(36)
            run = entropyd.init("wide-py", layers=256, heads=256, seq_len=64, daemon="unix:" + d.sock,
                                spool_dir=os.path.join(d.data, "spool"))
            grid = lambda: [[rnd.uniform(-1e3, 1e3) for _ in range(256)] for _ in range(256)]  # noqa: E731
            run.log(0, scalars={"loss": 2.0}, heads={"m%d" % k: grid() for k in range(HEAD_METRICS)})
            self.assertTrue(run.flush(timeout=60))
            stats = run.stats()
            run.finish(quiet=True)
            self.assertEqual(stats["dropped_oversize"], 0, stats)
            self.assertEqual(stats["acked"], stats["enqueued"], stats)
            self.assertEqual(d.query("SELECT count(*) FROM steps s JOIN runs r ON r.id = s.run_id "
                                     "WHERE r.name = 'wide-py'")[0][0], 1)
        finally:
            d.cleanup()


# docs/reliability.md, "The memory bound": the terms of the formula (MiB)
# and the alert state per head of the built-in rules (docs/alerts.md#memory)
MEM_BASE, MEM_PAGE_CACHE, MEM_RING, MEM_READER, MEM_ALLOCATOR = 20, 64, 32, 16, 80
ALERT_BYTES_PER_HEAD = 614
RULE_METRICS = {"entropy_norm": "0.8123457", "entropy": "3.1234567", "entropy_bound": "0.5123457",
                "sigma_qk": "1.2345678", "max_logit": "7.1234567"}


class MemoryBoundTest(unittest.TestCase):
    """The daemon's RSS for a configuration stays within the documented
    formula, alert state included (8 live 256 x 256 runs once reached
    254 MB, 198 MB of it alert state, which the formula left out)."""

    def test_rss_within_the_formula_with_live_runs_alert_state(self):
        runs, layers, heads, steps = 4, 128, 128, 55  # windows of 50 steps full
        queue_mb, input_mb = 8, 16
        d = Daemon(http=True, args=["--queue-mb", str(queue_mb), "--input-mb", str(input_mb),
                                    "--max-cells-per-run", str(layers * heads)]).start()
        try:
            row = lambda v: "[" + ",".join([v] * heads) + "]"  # noqa: E731
            body = ",".join('"%s":[%s]' % (m, ",".join([row(v)] * layers)) for m, v in RULE_METRICS.items())
            cs = []
            for r in range(runs):
                c = Client(d.sock, timeout=120)
                c.hello("mem-%d" % r, layers=layers, heads=heads)
                cs.append(c)
            for s in range(steps):
                for c in cs:
                    c.send_raw(('{"type":"step","seq":%d,"step":%d,"scalars":{"loss":%g},"heads":{%s}}\n'
                                % (s + 1, s, 2.0 - s * 1e-3, body)).encode())
            for c in cs:
                c.wait_ack(steps, timeout=120)
            st, m = raw(d.http_port, "GET", "/metrics")
            alert = float(m.split("\nentropyd_alert_state_bytes ")[1].split()[0])
            cells = runs * layers * heads
            # the formula's alert term: 614 bytes a head, plus a run's own
            # record (~2 KB) and 12 bytes per firing cell (none fire here)
            self.assertGreaterEqual(alert, cells * ALERT_BYTES_PER_HEAD)
            self.assertLessEqual(alert, cells * ALERT_BYTES_PER_HEAD + runs * 4096)
            bound = (MEM_BASE + input_mb + queue_mb + MEM_PAGE_CACHE + MEM_RING + MEM_READER + MEM_ALLOCATOR +
                     (cells * ALERT_BYTES_PER_HEAD + runs * 4096) / 2**20)
            rss = d.rss_kb() / 1024
            print("memory bound: %d live %dx%d runs: RSS %.1f MiB, alert state %.1f MiB, formula %.1f MiB"
                  % (runs, layers, heads, rss, alert / 2**20, bound), file=sys.stderr)
            # under the sanitizers RSS is mostly theirs (shadow memory, freed
            # blocks held in quarantine: 481 MiB here), not the daemon's
            if not os.environ.get("SANITIZE"):
                self.assertLessEqual(rss, bound)
            for c in cs:
                c.close()
        finally:
            d.cleanup()


if __name__ == "__main__":
    unittest.main()
