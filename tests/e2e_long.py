"""End-to-end tests of entropyd on long runs (issue "Long runs"): the real
daemon, its real SQLite file, runs seeded straight through the store API
(build/bench/bench_history_seed) so they are long without streaming them.

- /metrics reads the latest values from the `latest` table, not the frames
  (it answers the same with every frame deleted behind the daemon's back),
  follows a rollback, and exports an ended run for --metrics-keep-finished
  only; its alert series is not named ALERTS.
- A DELETE of a big run answers at once and purges the rest in chunks
  while another trainer's acks keep arriving; nothing is left behind.
- A rollback of a big run is done in chunks while another trainer's acks
  keep arriving; the rolling-back trainer's ack comes after the rewind, and
  the result is the whole rewind's (every abandoned frame in the branch).
- The WAL stays under 64 MiB while a trainer streams and an /export client
  reads slowly (the export holds no read transaction between chunks).
- --retain-raw (steps or a duration) deletes the raw frames before the
  window and keeps the rollups: the series over old steps stays exact at
  64-step resolution and says so, the window's steps stay raw.
- A series over sparse and huge steps (every 1,000; {1, 10^6}; {1, 262208};
  up to 2^53; rollbacks) answers, bucket by bucket, what the values sent
  give, whole run and windowed.
- --lossy-bits N rounds the sealed blocks' values to N mantissa bits (the
  open block's stay exact, and so do the rollups); a precision out of
  range, or one that --lossy-bf16 contradicts, is refused at start.

Latency figures belong to `make bench` (bench/history.sh); these tests
assert ordering and bounds that do not depend on the machine's speed."""
import bisect
import os
import random
import socket
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import ENTROPYD, Client, Daemon, floats, head_value, step_msg, wait_for  # noqa: E402

BUILD_DIR = os.path.dirname(ENTROPYD)
SEED = os.path.join(BUILD_DIR, "bench", "bench_history_seed")
BENCH_INGEST = os.path.join(BUILD_DIR, "bench", "bench_ingest")


def seed(d, run, steps, layers=12, heads=12, head_metrics=9, end="finished"):
    out = subprocess.run([SEED, "--db", d.db, "--run", run, "--steps", str(steps), "--layers", str(layers),
                          "--heads", str(heads), "--head-metrics", str(head_metrics), "--end", end],
                         capture_output=True, check=True).stdout.decode()
    return int(out.split("last seq ")[1].split(",")[0])


def metric_value(text, prefix):
    """The value of the first /metrics line starting with prefix, or None."""
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return None


def http_delete(d, path):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (d.http_port, path), method="DELETE")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


class Streamer(threading.Thread):
    """A second trainer streaming small steps, one at a time, recording
    when each ack arrived and how long it took."""

    def __init__(self, d, run):
        super().__init__(daemon=True)
        self.c = Client(d.sock)
        w = self.c.hello(run, layers=2, heads=3)
        assert w["type"] == "welcome", w
        self.seq = w["last_seq"]
        self.acks = []  # (monotonic time of the ack, seconds waited)
        self.stop = threading.Event()
        self.error = None

    def run(self):
        try:
            step = self.seq
            while not self.stop.is_set():
                self.seq += 1
                t = time.monotonic()
                self.c.send(step_msg(self.seq, step))
                self.c.wait_ack(self.seq, timeout=30)
                self.acks.append((time.monotonic(), time.monotonic() - t))
                step += 1
                time.sleep(0.002)  # not a wait: paces the bystander
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def finish(self):
        self.stop.set()
        self.join(40)
        self.c.close()
        if self.error:
            raise self.error


class LongRunsTest(unittest.TestCase):
    def tearDown(self):
        d = getattr(self, "d", None)
        if d is not None:
            if d.proc is not None and not d.alive():
                print("daemon died; its log:\n" + d.log()[-4000:])
            d.cleanup()

    def start(self, args=()):
        self.d = Daemon(http=True, args=list(args)).start()
        return self.d

    def test_metrics_reads_latest_and_keeps_ended_runs_for_a_while(self):
        d = self.start(["--metrics-keep-finished", "2s"])
        live, ended, gone = Client(d.sock), Client(d.sock), Client(d.sock)
        for c, name in ((live, "alive"), (ended, "ended"), (gone, "gone")):
            self.assertEqual(c.hello(name)["type"], "welcome")
        for seq in range(1, 51):
            live.send(step_msg(seq, seq - 1))
        live.wait_ack(50)
        for seq in range(1, 11):
            ended.send(step_msg(seq, seq - 1))
            gone.send(step_msg(seq, seq - 1))
        ended.send({"type": "end", "seq": 11, "status": "finished"})
        ended.wait_ack(11)
        gone.wait_ack(10)
        gone.close()  # no end: the run goes stale
        # a rollback: step 20 again with other values; /metrics follows it
        live.send(step_msg(51, 20, base=5.0))
        live.wait_ack(51)
        t_end = time.monotonic()
        st, text = d.get("/metrics")
        self.assertEqual(st, 200)
        self.assertEqual(metric_value(text, 'entropyd_run_last_step{run="alive"'), 20)
        self.assertAlmostEqual(metric_value(text, 'entropyd_scalar{run="alive",metric="loss"}'), 3.0 - 0.020, places=6)
        self.assertAlmostEqual(metric_value(text, 'entropyd_scalar{run="ended",metric="loss"}'), 3.0 - 0.009, places=6)
        self.assertIn('entropyd_layer{run="ended",metric="rank_ratio",layer="1"}', text)
        self.assertNotIn("\nALERTS", text)
        self.assertIn("# TYPE entropyd_alerts_firing gauge", text)
        # the latest table holds the rolled-back step's values ...
        rid = d.query("SELECT id FROM runs WHERE name = 'alive'")[0][0]
        blob = d.query("SELECT l.step, l.data FROM latest l JOIN metrics m ON m.id = l.metric_id "
                       "WHERE m.run_id = ? AND m.name = 'entropy'", (rid,))
        self.assertEqual(blob[0][0], 20)
        self.assertAlmostEqual(floats(blob[0][1])[4], head_value(20, 1, 1, 5.0), places=5)
        # ... and /metrics reads nothing else: with every frame gone it answers the same
        con = sqlite3.connect(d.db, timeout=10)  # a second writer: the daemon's writer waits its turn
        con.execute("DELETE FROM frames")
        con.execute("DELETE FROM blocks")
        con.execute("DELETE FROM block_chunks")
        con.commit()
        con.close()
        self.assertEqual(d.query("SELECT count(*) FROM frames")[0][0], 0)
        st, text2 = d.get("/metrics")
        self.assertIn('entropyd_scalar{run="alive",metric="loss"}', text2)
        self.assertIn('entropyd_scalar{run="ended",metric="loss"}', text2)
        # the ended and the stale run leave /metrics once 2 s past their end; the live one stays
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            st, text = d.get("/metrics")
            if 'run="ended"' not in text and 'run="gone"' not in text:
                break
            time.sleep(0.1)
        self.assertNotIn('run="ended"', text)
        self.assertNotIn('run="gone"', text)
        self.assertGreater(time.monotonic() - t_end, 1.0)
        self.assertIn('entropyd_scalar{run="alive",metric="loss"}', text)
        self.assertIn('entropyd_run_last_step{run="alive",status="live"} 20', text)
        # still stored and listed: only /metrics forgets them
        st, runs = d.get("/api/runs")
        self.assertEqual(sorted(r["name"] for r in runs), ["alive", "ended", "gone"])
        live.close()

    def test_delete_of_a_big_run_is_chunked_and_others_are_acked_meanwhile(self):
        d = Daemon(http=True)
        seed(d, "big", 6000)
        d.start()
        self.d = d
        big = d.query("SELECT id FROM runs WHERE name = 'big'")[0][0]
        frames = d.query("SELECT count(*) FROM frames")[0][0]
        self.assertEqual(frames, 6000 * 14)
        s = Streamer(d, "bystander")
        s.start()
        wait_for(lambda: len(s.acks) >= 20 or s.error, what="the bystander's first 20 acks")
        chunks0 = metric_value(d.get("/metrics")[1], "entropyd_background_chunks_total")
        t0 = time.monotonic()
        self.assertEqual(http_delete(d, "/api/runs/%d" % big), 200)
        t_deleted = time.monotonic()
        # gone for readers at once ...
        st, runs = d.get("/api/runs")
        self.assertEqual([r["name"] for r in runs], ["bystander"])
        self.assertEqual(d.get("/api/runs/%d" % big)[0], 404)
        # ... its rows purged in chunks behind it
        deadline = time.monotonic() + 120
        while d.query("SELECT count(*) FROM purge")[0][0] and time.monotonic() < deadline:
            time.sleep(0.02)
        t_purged = time.monotonic()
        n_acks = len(s.acks)
        wait_for(lambda: len(s.acks) > n_acks or s.error, what="a bystander ack after it")
        s.finish()
        self.assertEqual(d.query("SELECT count(*) FROM purge")[0][0], 0)
        for table, col, parent in (("frames", "metric_id", "metrics"), ("rollups", "metric_id", "metrics"),
                                   ("latest", "metric_id", "metrics"), ("steps", "run_id", "runs")):
            self.assertEqual(d.query("SELECT count(*) FROM %s WHERE %s NOT IN (SELECT id FROM %s)"
                                     % (table, col, parent))[0][0], 0, table)
        chunks = metric_value(d.get("/metrics")[1], "entropyd_background_chunks_total") - chunks0
        self.assertGreaterEqual(chunks, 3)
        during = [lat for t, lat in s.acks[:n_acks] if t0 <= t <= t_purged]
        print("delete of 6000 steps x 14 metrics (12x12): DELETE answered in %.0f ms, purged in %.0f ms, %d chunks; "
              "bystander acks meanwhile: %d, max %.1f ms"
              % ((t_deleted - t0) * 1e3, (t_purged - t0) * 1e3, chunks, len(during),
                 max(during) * 1e3 if during else float("nan")))
        if t_purged - t_deleted > 0.2:  # a purge long enough to see acks in it
            self.assertGreater(len(during), 0)
        # the bystander's steps are all there
        self.assertEqual(d.query("SELECT count(*) FROM steps s JOIN runs r ON r.id = s.run_id "
                                 "WHERE r.name = 'bystander'")[0][0], s.seq)

    def test_rollback_of_a_big_run_is_chunked_and_others_are_acked_meanwhile(self):
        d = Daemon(http=True)
        last_seq = seed(d, "rewound", 6000, end="live")
        d.start()
        self.d = d
        rid = d.query("SELECT id FROM runs WHERE name = 'rewound'")[0][0]
        s = Streamer(d, "bystander")
        s.start()
        wait_for(lambda: len(s.acks) >= 20 or s.error, what="the bystander's first 20 acks")
        r = Client(d.sock)
        w = r.hello("rewound", layers=12, heads=12)
        self.assertEqual(w["type"], "welcome")
        self.assertEqual(w["last_seq"], last_seq)
        chunks0 = metric_value(d.get("/metrics")[1], "entropyd_background_chunks_total")
        above = d.query("SELECT count(*) FROM frames f JOIN metrics m ON m.id = f.metric_id "
                        "WHERE m.run_id = ? AND f.step >= 100", (rid,))[0][0]
        t0 = time.monotonic()
        msg = step_msg(last_seq + 1, 100, layers=12, heads=12, base=9.0)
        r.send(msg)
        # while the rewind goes on, the rolling-back trainer gets no ack
        seen_rewinding = False
        while True:
            if d.query("SELECT count(*) FROM rewinds")[0][0]:
                seen_rewinding = True
            try:
                m, _ = r.recv_until(lambda m: m["type"] in ("ack", "error"), timeout=0.02)
                break
            except (socket.timeout, TimeoutError):
                self.assertLess(time.monotonic() - t0, 120)
        t_acked = time.monotonic()
        self.assertEqual(m, {"type": "ack", "seq": last_seq + 1})
        # acked only once the rewind is complete and the step stored
        self.assertEqual(d.query("SELECT count(*) FROM rewinds")[0][0], 0)
        n_acks = len(s.acks)
        wait_for(lambda: len(s.acks) > n_acks or s.error, what="a bystander ack after it")
        s.finish()
        r.close()
        chunks = metric_value(d.get("/metrics")[1], "entropyd_background_chunks_total") - chunks0
        self.assertGreaterEqual(chunks, 3)
        # the whole rewind's result: every frame from step 100 on moved into one branch
        br = d.query("SELECT id, from_step, to_step FROM branches WHERE run_id = ?", (rid,))
        self.assertEqual([b[1:] for b in br], [(100, 5999)])
        self.assertEqual(d.query("SELECT count(*) FROM abandoned_frames WHERE branch_id = ?", (br[0][0],))[0][0], above)
        self.assertEqual(d.query("SELECT max(step), count(*) FROM steps WHERE run_id = ?", (rid,))[0], (100, 101))
        self.assertEqual(d.query("SELECT last_step FROM runs WHERE id = ?", (rid,))[0][0], 100)
        # the seeded head metrics stopped at 99 (the new step carries entropy only, and the
        # entropy_norm ingest derives from it); latest follows both
        lat = dict(d.query("SELECT m.name, l.step FROM latest l JOIN metrics m ON m.id = l.metric_id "
                           "WHERE m.run_id = ?", (rid,)))
        self.assertEqual(lat["entropy"], 100)
        self.assertEqual(lat["entropy_norm"], 100)
        self.assertEqual(lat["max_logit"], 99)
        self.assertEqual(d.query("SELECT count(*) FROM rollups a JOIN metrics m ON m.id = a.metric_id "
                                 "WHERE m.run_id = ? AND a.level = 1 AND a.block >= 1", (rid,))[0][0], 0)
        during = [lat for t, lat in s.acks[:n_acks] if t0 <= t <= t_acked]
        print("rollback of 5900 steps x 14 metrics (12x12): acked after %.0f ms, %d chunks; "
              "bystander acks meanwhile: %d, max %.1f ms"
              % ((t_acked - t0) * 1e3, chunks, len(during), max(during) * 1e3 if during else float("nan")))
        if seen_rewinding:
            self.assertGreater(len(during), 0)

    def test_wal_stays_bounded_with_a_slow_export_and_a_streaming_trainer(self):
        d = Daemon(http=True)
        seed(d, "exported", 3000)
        d.start()
        self.d = d
        rid = d.query("SELECT id FROM runs WHERE name = 'exported'")[0][0]
        wal = d.db + "-wal"
        ingest = subprocess.Popen([BENCH_INGEST, "--socket", d.sock, "--trainers", "2", "--seconds", "12"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        # a client reading the export at ~200 KB/s: the whole export takes longer than the ingest
        sk = socket.create_connection(("127.0.0.1", d.http_port))
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sk.sendall(b"GET /api/runs/%d/export?format=csv HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % rid)
        peak, got, t0 = 0, 0, time.monotonic()
        while ingest.poll() is None:
            data = sk.recv(4096)
            self.assertTrue(data, "the export ended early")
            got += len(data)
            if os.path.exists(wal):
                peak = max(peak, os.path.getsize(wal))
            time.sleep(0.02)  # not a wait: the slow reader's pace
        out = ingest.stdout.read().decode()
        sk.close()
        self.assertEqual(ingest.returncode, 0, out)
        mb = peak / 2**20
        print("WAL peak %.1f MiB during %.0f s of ingest with a slow export (%d KB read); %s"
              % (mb, time.monotonic() - t0, got // 1024, out.strip().splitlines()[0] if out.strip() else ""))
        self.assertGreater(got, 100000)
        self.assertLess(peak, 64 * 2**20)
        st, text = d.get("/metrics")
        print("checkpoints %d (busy %d, by the writer %d)" % tuple(metric_value(text, "entropyd_checkpoints" + k)
                                                              for k in ("_total", "_busy_total", "_writer_total")))
        self.assertGreaterEqual(metric_value(text, "entropyd_db_bytes"),
                                metric_value(text, "entropyd_wal_bytes") + os.path.getsize(d.db) * 0.5)


    def stream(self, d, name, steps, time_of=None):
        c = Client(d.sock)
        self.assertEqual(c.hello(name)["type"], "welcome")
        for s in range(steps):
            c.send(step_msg(s + 1, s, extra={"time": time_of(s)} if time_of else None))
        c.wait_ack(steps, timeout=60)
        return c, d.query("SELECT id FROM runs WHERE name = ?", (name,))[0][0]

    def blocks_below(self, d, rid, block):
        # sealed blocks of both layouts (schema/storage.md, "Blocks"): a block
        # of block_chunks counted by its chunk 0 (id = base << 26 | block)
        return d.query("SELECT count(*) FROM (SELECT metric_id, block FROM blocks UNION ALL "
                       "SELECT s.metric_id, c.id & 67108863 FROM block_chunks c JOIN block_series s "
                       "ON c.id >> 26 = s.base) b JOIN metrics m ON m.id = b.metric_id "
                       "WHERE m.run_id = ? AND b.block < ?", (rid, block))[0][0]

    def test_retain_raw_steps_keeps_rollups_and_says_the_resolution(self):
        d = self.start(["--retain-raw", "200"])
        c, rid = self.stream(d, "kept", 1000)
        # steps 800..999 are the window: blocks 0..11 (steps < 768) go, 12 on stay
        wait_for(lambda: self.blocks_below(d, rid, 12) == 0, timeout=60, what="raw frames past the window deleted")
        self.assertGreater(self.blocks_below(d, rid, 15), 0)
        self.assertEqual(d.query("SELECT count(*) FROM rollups r JOIN metrics m ON m.id = r.metric_id "
                                 "WHERE m.run_id = ? AND m.name = 'loss' AND r.level = 1", (rid,))[0][0], 15)
        st, sr = d.get("/api/runs/%d/series?metric=loss&points=1000" % rid)
        self.assertEqual(st, 200, sr)
        self.assertEqual((sr["resolution"], sr["raw_from"], sr["width"]), (64, 768, 64))
        self.assertEqual(sr["step"][:2], [0, 64])
        self.assertEqual(sr["count"][0], 64)
        # exact: the rollups' mean of steps 0..63, as stored (float32 values)
        mean0 = sum(struct.unpack("<f", struct.pack("<f", 3.0 - s * 0.001))[0] for s in range(64)) / 64
        self.assertAlmostEqual(sr["mean"][0], mean0, places=9)
        # inside the window the steps are raw, one a point
        st, sr = d.get("/api/runs/%d/series?metric=entropy&layer=1&head=2&from=800&to=999&points=1000" % rid)
        self.assertEqual((sr["resolution"], sr["width"], len(sr["step"])), (1, 1, 200))
        self.assertAlmostEqual(sr["mean"][0], head_value(800, 1, 2), places=5)
        # a frame before the window is gone; the newest is there
        self.assertEqual(d.get("/api/runs/%d/frame?metric=entropy&step=100" % rid)[0], 404)
        self.assertEqual(d.get("/api/runs/%d/frame?metric=entropy" % rid)[1]["step"], 999)
        c.close()

    def test_lossy_bits_rounds_sealed_frames_only(self):
        def f32_bits(x):
            return struct.unpack("<I", struct.pack("<f", x))[0]

        def rounded(x, bits):
            # to nearest, ties to even, on the float32's bits (finite values)
            u, drop = f32_bits(x), 23 - bits
            keep = u >> drop
            rest = u & ((1 << drop) - 1)
            half = 1 << (drop - 1)
            if rest > half or (rest == half and keep & 1):
                keep += 1
            return struct.unpack("<f", struct.pack("<I", keep << drop))[0]

        d = self.start(["--lossy-bits", "10"])
        c, rid = self.stream(d, "lossy", 100)  # block 0 (steps 0..63) sealed, 64..99 open
        changed = 0
        for step, sealed in ((5, True), (63, True), (64, False), (99, False)):
            st, fr = d.get("/api/runs/%d/frame?metric=entropy&step=%d" % (rid, step))
            self.assertEqual((st, fr["step"]), (200, step))
            for l, row in enumerate(fr["values"]):
                for h, v in enumerate(row):
                    exact = struct.unpack("<f", struct.pack("<f", head_value(step, l, h)))[0]
                    want = rounded(exact, 10) if sealed else exact
                    self.assertEqual(f32_bits(v), f32_bits(want), (step, l, h, v, want))
                    changed += sealed and want != exact
        self.assertGreater(changed, 0)  # the rounding did something
        # the rollups are of the exact values: block 0's max of cell (0, 0) is the exact 9.9 of step 43
        st, sr = d.get("/api/runs/%d/series?metric=entropy&layer=0&head=0&from=0&to=63&points=1" % rid)
        self.assertEqual(st, 200, sr)
        top = max(struct.unpack("<f", struct.pack("<f", head_value(s, 0, 0)))[0] for s in range(64))
        self.assertEqual(f32_bits(sr["max"][0]), f32_bits(top))
        c.close()
        for args, says in ((["--lossy-bits", "23"], "[1, 22]"), (["--lossy-bf16", "--lossy-bits", "12"], "--lossy-bits 7")):
            p = subprocess.run([ENTROPYD, "--data", d.data] + args, capture_output=True, timeout=30)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(says, p.stderr.decode())

    def test_retain_raw_duration_uses_the_steps_times(self):
        d = self.start(["--retain-raw", "300s"])
        now = time.time()
        # steps 0..699 are hours old, 700..999 from the last second
        c, rid = self.stream(d, "timed", 1000,
                             time_of=lambda s: now - 10000 + s if s < 700 else now - 1 + (s - 700) * 0.001)
        wait_for(lambda: self.blocks_below(d, rid, 10) == 0, timeout=60, what="old raw frames deleted")
        self.assertGreater(self.blocks_below(d, rid, 11), 0)  # block 10 holds step 700
        st, sr = d.get("/api/runs/%d/series?metric=loss&points=100" % rid)
        self.assertEqual((sr["resolution"], sr["raw_from"]), (64, 640))
        self.assertEqual(sum(sr["count"]), 1000)
        c.close()
    def test_series_over_sparse_and_huge_steps_is_exact(self):
        """Steps every 1,000, {1, 10^6}, {1, 262208} and a
        random set (gaps up to 2^45, steps up to 2^53, rollbacks), each
        series over HTTP bucket by bucket what the values sent give. The
        values are multiples of 1/8 (or null): their sums are exact in a
        double, so the mean is the brute force's to the 12 digits printed."""
        d = self.start()
        rnd = random.Random(36)
        top = 1 << 53
        cases = {"x1000": [s * 1000 for s in range(1000)], "two": [1, 10 ** 6], "edge": [1, 262208],
                 "huge": [0, top - 1, top]}
        steps, s = [], 7
        while len(steps) < 300 and s <= top:
            steps.append(s)
            s += 1 + rnd.randrange(1 << rnd.randrange(46))
            if len(steps) > 3 and rnd.random() < 0.05:
                s = rnd.choice(steps)  # a rollback, or a step again
        cases["random"] = steps
        L, H = 2, 3
        for name, steps in cases.items():
            c = Client(d.sock)
            self.assertEqual(c.hello(name, layers=L, heads=H)["type"], "welcome")
            kept = {}  # step -> (loss, [[entropy] x H] x L) of the branch that continued
            for seq, s in enumerate(steps, 1):
                for old in [k for k in kept if k >= s]:
                    del kept[old]
                v = lambda: None if rnd.random() < 0.06 else rnd.randrange(-8192, 8192) / 8  # noqa: E731
                kept[s] = (v(), [[v() for _ in range(H)] for _ in range(L)])
                c.send({"type": "step", "seq": seq, "step": s, "scalars": {"loss": kept[s][0]},
                        "heads": {"entropy": kept[s][1]}})
            c.wait_ack(len(steps), timeout=60)
            c.close()
            rid = d.query("SELECT id FROM runs WHERE name = ?", (name,))[0][0]
            order = sorted(kept)
            windows = [None, (order[0], order[-1]), (order[0] + 1, order[-1] - 1)]
            for _ in range(4):
                a, b = sorted(rnd.choice(order) + rnd.randrange(-300, 300) for _ in range(2))
                windows.append((max(a, 0), max(b, 0)))
            for win in windows:
                for points in (1, 7, 1000, 100000) if win is None else (rnd.randrange(1, 2000),):
                    q = "" if win is None else "&from=%d&to=%d" % win
                    q += "" if win is None and points == 1000 else "&points=%d" % points  # the default view too
                    for sel, pick in (("metric=loss", lambda f: [f[0]]),
                                      ("metric=entropy", lambda f: [x for row in f[1] for x in row]),
                                      ("metric=entropy&layer=1&head=2", lambda f: [f[1][1][2]])):
                        path = "/api/runs/%d/series?%s%s" % (rid, sel, q)
                        st, sr = d.get(path)
                        self.assertEqual(st, 200, (path, sr))
                        self.check_series(sr, kept, order, pick, path)

    def check_series(self, sr, kept, order, pick, path):
        """Every bucket of the answer sr is what the values pick(kept[step])
        of its steps give; the buckets hold every step of the range."""
        lo, hi = max(sr["from"], order[0]), min(sr["to"], order[-1])
        seen = 0
        for i, (s0, s1) in enumerate(zip(sr["step"], sr["end"])):
            vals = [x for s in order[bisect.bisect_left(order, s0):bisect.bisect_right(order, s1)]
                    for x in pick(kept[s])]
            seen += len(vals) // len(pick(kept[order[0]]))
            fin = [x for x in vals if x is not None]
            at = "%s bucket %d..%d" % (path, s0, s1)
            self.assertTrue(vals, at + " listed without a step")
            self.assertEqual((sr["count"][i], sr["nonfinite"][i]), (len(fin), len(vals) - len(fin)), at)
            if not fin:
                self.assertEqual((sr["min"][i], sr["max"][i], sr["mean"][i]), (None, None, None), at)
                continue
            self.assertEqual((sr["min"][i], sr["max"][i]), (min(fin), max(fin)), at)
            mean = sum(fin) / len(fin)
            self.assertLessEqual(abs(sr["mean"][i] - mean), abs(mean) * 1e-11, at)
        self.assertEqual(seen, sum(lo <= s <= hi for s in order), path + ": steps of the range left out")
        self.assertLessEqual(len(sr["step"]), 100000)

if __name__ == "__main__":
    unittest.main(verbosity=2)
