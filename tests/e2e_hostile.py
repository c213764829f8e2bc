"""Strangers and careless clients against the real entropyd,
the trainer side: what a connection may cost before its hello is welcomed,
the global input budget, hello timeout, per-peer limits, a full house of
idle sockets, and a --socket path that is not a socket.

Each test states a bound the daemon once did not hold:
60 TCP connections sending `{` + 4 MiB of spaces took it from 2 MB to
242 MB; 20 idle sockets with --max-conns 20 locked every trainer out.
python3 stdlib only."""
import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import ENTROPYD, Client, Daemon, step_msg, wait_for  # noqa: E402
import subprocess  # noqa: E402


def tcp_port(d):
    for line in d.stdout_lines:
        if "tcp port" in line:
            return int(line.split("tcp port ")[1].split(",")[0])
    raise AssertionError("no tcp port in %r" % d.stdout_lines)


def closed_by_peer(s, timeout=10):
    """True once the daemon has closed s (EOF or reset), reading what it sent."""
    s.settimeout(timeout)
    try:
        while True:
            b = s.recv(65536)
            if not b:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def flood(s, nbytes):
    """Sends `{` and then spaces, no newline; stops when the daemon closes."""
    chunk = b" " * (256 << 10)
    try:
        s.sendall(b"{")
        sent = 0
        while sent < nbytes:
            s.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError, socket.timeout):
        pass


def trainer_connects(d, name, timeout=1.0, token=None):
    """Seconds from connect to welcome for a trainer on the Unix socket; a
    step is then streamed and acked."""
    t0 = time.time()
    c = Client(d.sock, timeout=timeout)
    w = c.hello(name, token=token)
    took = time.time() - t0
    assert w["type"] == "welcome", w
    c.send(step_msg(1, 1))
    c.wait_ack(1, timeout=5)
    c.close()
    return took


class HostileIngest(unittest.TestCase):
    def tearDown(self):
        if getattr(self, "d", None):
            self.d.cleanup()

    def test_60_floods_of_4_mib_without_newline_cost_little_and_a_trainer_gets_in(self):
        # refused floods are held until their hello deadline: 2 s keeps the test short
        self.d = d = Daemon(args=["--listen-tcp", "127.0.0.1:0", "--token", "s3cret", "--hello-timeout-s", "2"]).start()
        port = tcp_port(d)
        base = d.rss_kb()
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(60)]
        peak = [base]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], d.rss_kb())
                time.sleep(0.01)  # not a wait: the RSS sampling interval
        t = threading.Thread(target=sample)
        t.start()
        threads = [threading.Thread(target=flood, args=(s, 4 << 20)) for s in socks]
        for th in threads:
            th.start()
        took = trainer_connects(d, "during-flood", timeout=5, token="s3cret")
        for th in threads:
            th.join(60)
        done.set()
        t.join()
        for s in socks:
            self.assertTrue(closed_by_peer(s), "a flood connection was not closed")
            s.close()
        grew_mib = (peak[0] - base) / 1024
        print("60 x 4 MiB floods: RSS %d -> peak %d KiB (+%.1f MiB); trainer welcomed in %.3f s"
              % (base, peak[0], grew_mib, took))
        # 60 strangers may hold 64 KiB of line each (~4 MiB), not 4 MiB each
        self.assertLess(grew_mib, 32, "strangers' unfinished lines must not cost 4 MiB each")
        self.assertLess(took, 1.0)
        self.assertTrue(d.alive())

    def test_a_line_before_the_welcome_is_limited_to_64_kib(self):
        self.d = d = Daemon(args=["--hello-timeout-s", "2"], http=True).start()
        c = Client(d.sock)
        t0 = time.time()
        c.send_raw(b"{" + b" " * (100 << 10))
        m = c.recv()
        self.assertEqual((m["type"], m["code"]), ("error", "line_too_long"))
        # held till its hello deadline, its input buffer given back at once
        self.assertIn("\nentropyd_input_bytes 0\n", d.get("/metrics")[1])
        self.assertTrue(closed_by_peer(c.s))
        self.assertLess(time.time() - t0, 5)
        # once welcomed, lines of up to 4 MiB are still taken
        c = Client(d.sock)
        self.assertEqual(c.hello("big-lines")["type"], "welcome")
        msg = step_msg(1, 1)
        import json
        line = json.dumps(msg)[:-1] + ', "pad": "' + "x" * (200 << 10) + '"}\n'
        c.send_raw(line.encode())
        c.wait_ack(1)

    def test_a_refused_flood_is_held_not_handed_a_reconnect_loop(self):
        # Closed at once, a flooding client reconnected as fast as it could
        # (hundreds of connections a second from 4 loops); held until its
        # hello deadline, each loop gets one connection per deadline.
        self.d = d = Daemon(args=["--hello-timeout-s", "3"], http=True).start()
        stop = threading.Event()

        def loop():
            while not stop.is_set():
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(0.5)
                try:
                    s.connect(d.sock)
                    flood(s, 4 << 20)
                except OSError:
                    pass
                finally:
                    s.close()
        loops = [threading.Thread(target=loop) for _ in range(4)]
        for t in loops:
            t.start()
        time.sleep(2)  # not a wait: the loops' 2 s whose connections are counted
        stop.set()
        for t in loops:
            t.join()
        m = d.get("/metrics")[1]
        total = int(m.split("\nentropyd_connections_total ")[1].split("\n")[0])
        print("4 flood loops for 2 s: %d connections accepted" % total)
        # each loop's send blocks for its 0.5 s timeout on a held connection: at most ~4 each
        self.assertLessEqual(total, 24)
        self.assertGreaterEqual(total, 4)
        self.assertLess(trainer_connects(d, "after-loops"), 1.0)

    def test_idle_sockets_holding_every_slot_do_not_lock_a_trainer_out(self):
        self.d = d = Daemon(args=["--max-conns", "20"], http=True).start()
        idle = []
        for _ in range(20):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.sock)
            idle.append(s)
        # the trainer must find every slot held, not a backlog the daemon has yet to accept
        wait_for(lambda: "\nentropyd_connections_open 20\n" in d.get("/metrics")[1], what="20 idle sockets accepted")
        took = trainer_connects(d, "not-locked-out")
        print("20 idle sockets, --max-conns 20: trainer welcomed in %.3f s" % took)
        self.assertLess(took, 1.0)
        evicted = sum(1 for s in idle if closed_by_peer(s, timeout=0.5))
        self.assertGreaterEqual(evicted, 1, "a slot was made by closing an idle socket")
        for s in idle:
            s.close()

    def test_welcomed_connections_are_not_evicted_and_the_newcomer_is_told(self):
        self.d = d = Daemon(args=["--max-conns", "3"]).start()
        cs = [Client(d.sock) for _ in range(3)]
        for i, c in enumerate(cs):
            self.assertEqual(c.hello("full-%d" % i)["type"], "welcome")
        extra = Client(d.sock)
        m = extra.recv()
        self.assertIn("too many connections", m["message"])
        for i, c in enumerate(cs):  # all three still stream
            c.send(step_msg(1, 1))
            c.wait_ack(1)

    def test_no_hello_in_time_closes_the_connection(self):
        self.d = d = Daemon(args=["--hello-timeout-s", "1"], http=True).start()
        c = Client(d.sock)
        t0 = time.time()
        m = c.recv(timeout=5)
        self.assertEqual((m["type"], m["code"]), ("error", "no_hello"))
        self.assertIn("no hello within", m["message"])
        self.assertTrue(closed_by_peer(c.s))
        self.assertLess(time.time() - t0, 3)
        self.assertIn("\nentropyd_connections_timed_out_total 1\n", d.get("/metrics")[1])
        # a trainer that says hello is not timed out later
        c = Client(d.sock)
        self.assertEqual(c.hello("in-time")["type"], "welcome")
        time.sleep(1.5)  # not a wait: past the 1 s hello timeout, which must not apply any more
        c.send(step_msg(1, 1))
        c.wait_ack(1)

    def test_idle_timeout_closes_a_silent_welcomed_connection(self):
        self.d = d = Daemon(args=["--idle-timeout-s", "1"]).start()
        c = Client(d.sock)
        self.assertEqual(c.hello("silent")["type"], "welcome")
        m = c.recv(timeout=5)
        self.assertEqual(m["type"], "error")
        self.assertIn("nothing received", m["message"])
        self.assertTrue(closed_by_peer(c.s))

    def test_connections_per_peer_are_limited_on_both_sockets(self):
        self.d = d = Daemon(args=["--max-conns-per-peer", "3", "--listen-tcp", "127.0.0.1:0"]).start()
        port = tcp_port(d)
        held = [Client(d.sock) for _ in range(3)]
        for i, c in enumerate(held):
            self.assertEqual(c.hello("peer-%d" % i)["type"], "welcome")
        extra = Client(d.sock)
        m = extra.recv()
        self.assertIn("from this peer", m["message"])
        self.assertTrue(closed_by_peer(extra.s))
        tcp = [Client(tcp=("127.0.0.1", port)) for _ in range(3)]
        for i, c in enumerate(tcp):
            self.assertEqual(c.hello("tcp-%d" % i)["type"], "welcome")
        extra = Client(tcp=("127.0.0.1", port))
        self.assertIn("from this peer", extra.recv()["message"])
        # another address is another peer
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", port))
        other = Client.__new__(Client)
        other.s, other.buf = s, b""
        self.assertEqual(other.hello("tcp-other")["type"], "welcome")
        # closing one frees its slot
        held[0].close()
        deadline = time.time() + 5
        while True:
            c = Client(d.sock)
            c.send({"type": "hello", "protocol": 1, "run": "peer-again", "layers": 2, "heads": 3, "seq_len": 16})
            m = c.recv()
            if m["type"] == "welcome" or time.time() > deadline:
                break
        self.assertEqual(m["type"], "welcome")

    def test_the_input_budget_refuses_strangers_once_spent(self):
        self.d = d = Daemon(args=["--input-mb", "1"]).start()
        socks = []
        for _ in range(40):  # 40 x up to 64 KiB > 1 MiB
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.sock)
            s.sendall(b"{" + b" " * (60 << 10))
            socks.append(s)
        refused = 0
        for s in socks:
            s.settimeout(0.5)
            try:
                data = s.recv(4096)
                if b"input memory" in data:
                    refused += 1
            except socket.timeout:
                pass
        self.assertGreater(refused, 0, "over --input-mb, strangers are refused")
        self.assertLess(d.rss_kb() / 1024, 64)
        # strangers still holding the budget cannot keep a trainer out: the
        # oldest unfinished line is closed to make room for its hello
        self.assertLess(trainer_connects(d, "while-budget-spent"), 1.0)
        for s in socks:
            s.close()

    def test_a_welcomed_connection_waits_for_the_budget_then_is_closed(self):
        self.d = d = Daemon(args=["--input-mb", "2", "--hello-timeout-s", "1"]).start()
        cs = []
        for i in range(3):
            c = Client(d.sock)
            self.assertEqual(c.hello("hog-%d" % i)["type"], "welcome")
            cs.append(c)
        # three unfinished 1.5 MiB lines do not fit in 2 MiB: someone waits, then is closed
        for c in cs:
            threading.Thread(target=flood, args=(c.s, 3 << 19), daemon=True).start()
        deadline = time.time() + 10
        closed = 0
        while time.time() < deadline and not closed:
            for c in cs:
                if closed_by_peer(c.s, timeout=0.2):
                    closed += 1
        self.assertGreater(closed, 0, "a hog waiting for memory past the timeout is closed")
        self.assertLess(d.rss_kb() / 1024, 64)
        self.assertLess(trainer_connects(d, "after-hogs"), 1.0)

    def test_socket_path_that_is_not_a_socket_is_left_alone(self):
        tmp = Daemon()  # for its temporary directory only
        try:
            path = os.path.join(tmp.data, "precious.db")
            with open(path, "w") as f:
                f.write("my data")
            r = subprocess.run([ENTROPYD, "--data", tmp.data, "--http", "off", "--socket", path],
                               capture_output=True, text=True, timeout=20)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("not a socket", r.stderr)
            self.assertEqual(open(path).read(), "my data")
        finally:
            tmp.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
