#!/usr/bin/env python3
"""Bit flips in the stored database: the real daemon
writes a run, stops; bytes of the SQLite file are flipped (a block chunk's
payload, a rollup row's payload, 32 random bytes mid-file); the daemon
restarts. Property: no HTTP 200 answer carries other data than before the
damage; a damaged block or rollup answers 500 naming run, metric and steps,
counts on /metrics and turns /healthz to db_corrupt; `entropyd --check`
names the damaged rows and exits 1 (0 on the clean database)."""
import os
import random
import re
import sqlite3
import subprocess
import sys
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import ENTROPYD, Client, Daemon, step_msg  # noqa: E402

# 12 x 12 heads (9 chunks a block): block chunks and rollups are most of the file
LAYERS, HEADS, STEPS = 12, 12, 3000
# what is read back: whole-run series of every cell (rollups), a fine one
# (blocks), one head's, frames in sealed blocks and in the open one, the export
PATHS = ["/api/runs/1/series?metric=entropy&points=10",
         "/api/runs/1/series?metric=entropy&points=1000",
         "/api/runs/1/series?metric=entropy&layer=1&head=2&points=50",
         "/api/runs/1/series?metric=loss&points=100",
         "/api/runs/1/frame?metric=entropy&step=70",
         "/api/runs/1/frame?metric=entropy&step=1500",
         "/api/runs/1/export?format=jsonl"]


def fetch(d, path):
    """(status, body bytes); a stream that breaks off mid-way is (None, b'')."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (d.http_port, path), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception:  # a chunked body cut by the daemon (the export met damage)
        return None, b""


def check(db_dir):
    r = subprocess.run([ENTROPYD, "--check", db_dir], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def metric(text, name):
    m = re.search(r"^%s (\S+)$" % name, text, re.M)
    return float(m.group(1)) if m else None


class Integrity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(http=True).start()
        c = Client(cls.d.sock)
        c.hello("flip", layers=LAYERS, heads=HEADS)
        for s in range(1, STEPS + 1):
            c.send(step_msg(s, s - 1, LAYERS, HEADS))
        c.wait_ack(STEPS, timeout=60)
        c.close()
        cls.base = {p: fetch(cls.d, p) for p in PATHS}
        for p, (st, body) in cls.base.items():
            assert st == 200 and body, (p, st, body[:200])
        assert cls.d.stop() == 0
        # VACUUM: no free pages (sealing deletes raw frames), so that bytes
        # written mid-file land in live rows, and each blob is in the file once
        con = sqlite3.connect(cls.d.db)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("VACUUM")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()
        with open(cls.d.db, "rb") as f:
            cls.clean = f.read()

    @classmethod
    def tearDownClass(cls):
        cls.d.cleanup()

    def setUp(self):
        with open(self.d.db, "wb") as f:
            f.write(self.clean)
        for ext in ("-wal", "-shm"):
            if os.path.exists(self.d.db + ext):
                os.unlink(self.d.db + ext)

    def damage(self, off, data):
        with open(self.d.db, "r+b") as f:
            f.seek(off)
            f.write(data)

    def flip_in_blob(self, sql):
        """Flips a byte in the middle of the blob `sql` selects, where it
        lies in the file (found by its bytes)."""
        con = sqlite3.connect(self.d.db)
        blob = con.execute(sql).fetchone()[0]
        con.close()
        self.assertGreater(len(blob), 8)
        # periodic values make some chunks alike: every copy is flipped
        at = [m.start() for m in re.finditer(re.escape(blob), self.clean)]
        self.assertTrue(at, "the blob is not in the file")
        for start in at:
            off = start + len(blob) // 2
            self.damage(off, bytes([self.clean[off] ^ 0x10]))

    def serve(self):
        """Starts the daemon on the damaged file; every answer that is 200 is
        the one from before the damage. Returns {path: (status, body)}."""
        self.d.start()
        got = {p: fetch(self.d, p) for p in PATHS}
        for p, (st, body) in got.items():
            if st == 200:
                self.assertEqual(body, self.base[p][1], "200 with other data: " + p)
        return got

    def assert_reported(self, got, path, steps):
        st, body = got[path]
        self.assertEqual(st, 500, (path, body[:300]))
        text = body.decode()
        self.assertIn('run 1, metric \\"entropy\\"', text)
        self.assertIn("steps " + steps, text)
        self.assertIn("checksum", text)
        self.assertIn("steps " + steps, self.d.log())
        _, metrics = self.d.get("/metrics")
        self.assertGreaterEqual(metric(metrics, "entropyd_integrity_errors_total"), 1)
        st, health = self.d.get("/healthz")
        self.assertEqual(st, 503)
        self.assertEqual(health["status"], "db_corrupt")
        self.assertGreaterEqual(health["integrity_errors"], 1)

    def test_clean_database_checks_clean_and_is_healthy(self):
        rc, out = check(self.d.data)
        self.assertEqual(rc, 0, out)
        self.assertIn("no damage", out)
        self.d.start()
        try:
            st, health = self.d.get("/healthz")
            self.assertEqual((st, health["status"], health["integrity_errors"]), (200, "ok", 0))
        finally:
            self.d.stop()

    def test_flipped_block_payload(self):
        # block 1 (steps 64..127) of the entropy metric, chunk 0
        self.flip_in_blob("SELECT c.data FROM block_chunks c JOIN block_series s ON c.id >> 26 = s.base "
                          "JOIN metrics m ON m.id = s.metric_id WHERE m.name = 'entropy' AND c.id & 67108863 = 1")
        try:
            got = self.serve()
            self.assert_reported(got, "/api/runs/1/frame?metric=entropy&step=70", "64..127")
            self.assert_reported(got, "/api/runs/1/series?metric=entropy&points=1000", "64..127")
            self.assertNotEqual(got["/api/runs/1/export?format=jsonl"][0], 200)
        finally:
            self.d.stop()
        rc, out = check(self.d.data)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r'damaged: run 1 "flip" metric "entropy" steps 64\.\.127: block chunk 0 .*checksum mismatch')

    def test_flipped_rollup_payload(self):
        # the level-1 rollup of block 2 (steps 128..191) of the entropy metric
        self.flip_in_blob("SELECT r.data FROM rollups r JOIN metrics m ON m.id = r.metric_id "
                          "WHERE m.name = 'entropy' AND r.level = 1 AND r.block = 2")
        try:
            got = self.serve()
            self.assert_reported(got, "/api/runs/1/series?metric=entropy&layer=1&head=2&points=50", "128..191")
        finally:
            self.d.stop()
        rc, out = check(self.d.data)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r'damaged: run 1 "flip" metric "entropy" steps 128\.\.191: level-1 rollup, chunk 0: '
                              r'checksum mismatch')

    def test_random_bytes_mid_file(self):
        size = len(self.clean)
        found = 0
        for seed in range(6):
            with self.subTest(seed=seed):
                self.setUp()
                rnd = random.Random(seed)
                off = size // 2 + rnd.randrange(-size // 4, size // 4)
                self.damage(off, bytes(rnd.randrange(256) for _ in range(32)))
                try:
                    got = self.serve()  # asserts: no 200 with other data
                finally:
                    self.d.stop()
                rc, out = check(self.d.data)
                failed = [p for p, (st, _) in got.items() if st != 200]
                if failed:  # what the daemon refused, --check names
                    self.assertEqual(rc, 1, (failed, out))
                self.assertIn(rc, (0, 1), out)
                found += rc == 1
                print("seed %d: 32 bytes at %d of %d: %d of %d reads refused, --check %d: %s" %
                      (seed, off, size, len(failed), len(PATHS), rc,
                       (out.splitlines() or [""])[0][:160]), file=sys.stderr)
        # bytes in a page's free space change nothing; most land in rows
        self.assertGreaterEqual(found, 3, "--check found too few of the damages")

    def test_check_usage_and_missing(self):
        rc, out = check(os.path.join(self.d.data, "nope"))
        self.assertEqual(rc, 2, out)


if __name__ == "__main__":
    unittest.main()
