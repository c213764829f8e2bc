#!/usr/bin/env python3
"""End-to-end test of a damaged spool: for each kind of
damage, `sigmatrain --upload-spool` and a live client's background uploader
deliver every intact step exactly once (read back over the daemon's HTTP
API), name the damage (file, byte offset, what) and make at most 10
connections (the daemon's /metrics entropyd_connections_total).

A spool of STEPS steps (and the run's events and `end`) is written once by
sigmatrain with no daemon, then copied and damaged per case:
  garbage line, torn last record, a line of invalid UTF-8, a duplicate seq
  (a record copied further on), 32 random bytes written over the middle,
  a changed digit (caught by the record's CRC32C), and an old unframed
  (version 1) spool with a garbage line.
Expected: `--upload-spool` exits 6 (every intact record delivered, some
damaged), or 0 when nothing was lost; a step whose record was damaged is
absent, never stored with other numbers (each stored loss is checked). A
live sigmatrain whose spool directory holds a damaged run uploads it in the
background the same way, and `python3 -m entropyd upload` exits with the
same statuses and names the damage the same way (skipped under SANITIZE:
ctypes cannot load the instrumented library).

Env: ENTROPYD, SIGMATRAIN, BUILD.  python3 standard library only."""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import BUILD, ROOT, Daemon  # noqa: E402

SIGMATRAIN = os.environ.get("SIGMATRAIN") or os.path.join(BUILD, "sigmatrain")
STEPS = 300
MAX_CONNECTIONS = 10
SANITIZE = os.environ.get("SANITIZE", "")
MAGIC = b"entropyd-spool 2\n"

TINY = ["--layers", "2", "--heads", "2", "--dim", "16", "--seq-len", "16", "--batch", "2", "--threads", "1",
        "--eval-every", "0", "--print-every", "1000"]


def records(path):
    """[(offset, line bytes with newline, step or None)] of a framed segment."""
    out, off = [], 0
    with open(path, "rb") as f:
        data = f.read()
    for line in data.splitlines(keepends=True):
        m = re.search(rb'"step":(\d+)', line)
        out.append((off, line, int(m.group(1)) if m and line.startswith(b"#") else None))
        off += len(line)
    return out


class SpoolDamage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="e2e-spool-")
        cls.pristine = os.path.join(cls.tmp, "pristine")
        gen = subprocess.run([SIGMATRAIN] + TINY + ["--steps", str(STEPS), "--daemon",
                              "unix:" + os.path.join(cls.tmp, "none.sock"), "--run", "base", "--spool", cls.pristine,
                              "--end-grace", "0", "--telemetry-queue", "4096"], capture_output=True, text=True,
                             timeout=300)
        assert gen.returncode == 0, gen.stdout + gen.stderr
        segs = sorted(f for f in os.listdir(os.path.join(cls.pristine, "base")) if f.startswith("seg-"))
        assert len(segs) == 1, segs
        cls.seg_name = segs[0]
        cls.recs = records(os.path.join(cls.pristine, "base", cls.seg_name))
        cls.loss = {r[2]: float(re.search(rb'"loss":([-0-9.e+]+)', r[1]).group(1)) for r in cls.recs if r[2] is not None}
        assert cls.recs[0][1] == MAGIC and len(cls.loss) == STEPS, (cls.recs[:2], len(cls.loss))
        cls.d = Daemon(http=True)
        cls.d.start()

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        cls.d.cleanup()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    # ---- helpers

    def spool_copy(self, name):
        """A copy of the pristine spool as run `name`: (spool dir, its segment's path)."""
        root = os.path.join(self.tmp, name)
        shutil.copytree(os.path.join(self.pristine, "base"), os.path.join(root, name))
        hp = os.path.join(root, name, "hello.json")
        with open(hp) as f:
            h = json.load(f)
        h["run"] = name
        with open(hp, "w") as f:
            json.dump(h, f)
        return root, os.path.join(root, name, self.seg_name)

    def connections(self):
        st, text = self.d.get("/metrics")
        self.assertEqual(st, 200)
        return int(float(re.search(r"^entropyd_connections_total (\S+)", text, re.M).group(1)))

    def stored_steps(self, name):
        """{step: how many times stored} of the run's loss, over HTTP."""
        st, runs = self.d.get("/api/runs")
        self.assertEqual(st, 200, runs)
        runs = runs["runs"] if isinstance(runs, dict) else runs
        rid = [r["id"] for r in runs if r["name"] == name]
        self.assertEqual(len(rid), 1, runs)
        st, ser = self.d.get("/api/runs/%d/series?metric=loss&points=100000&from=0&to=%d" % (rid[0], max(self.loss)))
        self.assertEqual(st, 200, ser)
        got = {}
        for s, e, c, mn in zip(ser["step"], ser["end"], ser["count"], ser["min"]):
            if c:
                self.assertEqual(s, e, "a bucket wider than one step")
                self.assertAlmostEqual(mn, self.loss[s], places=4, msg="step %d stored with another value" % s)
                got[s] = c
        return got

    def upload(self, name, root, want_rc, lost, named, python=False):
        """Uploads run name from root (python: with `python3 -m entropyd
        upload`, else sigmatrain --upload-spool); checks exit status, the
        steps stored, the damage named and the connections made."""
        c0 = self.connections()
        if python:
            u = subprocess.run([sys.executable, "-m", "entropyd", "upload", root, "--run", name,
                                "--daemon", "unix:" + self.d.sock], capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"),
                                        ENTROPYD_TELEMETRY_LIB=os.path.join(BUILD, "libentropyd_telemetry.so")))
        else:
            u = subprocess.run([SIGMATRAIN, "--upload-spool", "--daemon", "unix:" + self.d.sock, "--run", name,
                                "--spool", root], capture_output=True, text=True, timeout=120)
        out = u.stdout + u.stderr
        self.assertEqual(u.returncode, want_rc, out)
        conns = self.connections() - c0
        self.assertLessEqual(conns, MAX_CONNECTIONS, out)
        got = self.stored_steps(name)
        want = {s: 1 for s in self.loss if s not in lost}
        self.assertEqual(got, want, "lost %r\n%s" % (sorted(set(want) - set(got)), out))
        for what, off in named:
            self.assertRegex(out, r"damaged: run %s: \S+%s byte %d: %s" % (name, re.escape(self.seg_name), off,
                                                                          re.escape(what)), out)
        print("%s: %d steps stored once, %d lost, exit %d, %d connection(s); %s" % (
            name, len(got), len(lost), u.returncode, conns,
            "; ".join(l for l in out.splitlines() if "damaged:" in l)[:300]))
        return out

    def rewrite(self, path, recs):
        with open(path, "wb") as f:
            f.write(b"".join(r[1] for r in recs))

    def at_step(self, step):
        return [i for i, r in enumerate(self.recs) if r[2] == step][0]

    # ---- the damage kinds

    def with_line(self, name, step, line):
        """A copy as run name with line inserted before step's record:
        (spool dir, the line's offset)."""
        root, seg = self.spool_copy(name)
        i = self.at_step(step)
        recs = list(self.recs)
        recs.insert(i, (0, line, None))
        self.rewrite(seg, recs)
        return root, self.recs[i][0]

    def test_garbage_line(self):
        root, off = self.with_line("garbage", 150, b"this is not a spool record\n")
        self.upload("garbage", root, 6, set(), [("garbage", off)])

    def test_torn_last_record(self):
        root, seg = self.spool_copy("torn")
        with open(seg, "rb+") as f:
            last_off, last = self.recs[-1][0], self.recs[-1][1]
            f.truncate(last_off + len(last) // 2)  # the end, cut in the middle
        self.upload("torn", root, 6, set(), [("torn record", last_off)])

    def test_invalid_utf8_line(self):
        root, off = self.with_line("utf8", 150, b'{"seq":151,"type":"event","level":"info","text":"\xff\xfe"}\n')
        self.upload("utf8", root, 6, set(), [("invalid UTF-8", off)])

    def test_duplicate_seq(self):
        root, seg = self.spool_copy("dup")
        i, j = self.at_step(150), self.at_step(160)
        recs = list(self.recs)
        recs.insert(j, self.recs[i])
        self.rewrite(seg, recs)
        self.upload("dup", root, 6, set(), [("duplicate seq", self.recs[j][0])])

    def test_random_bytes_mid_file(self):
        root, seg = self.spool_copy("random")
        size = os.path.getsize(seg)
        off = size // 2
        junk = bytes(random.Random(36).randrange(256) for _ in range(32))
        with open(seg, "rb+") as f:
            f.seek(off)
            f.write(junk)
        hit = [r for r in self.recs if r[0] < off + 32 and r[0] + len(r[1]) > off]
        lost = {r[2] for r in hit if r[2] is not None}
        self.assertTrue(lost)
        self.upload("random", root, 6, lost, [("", hit[0][0])])

    def test_changed_digit(self):
        root, seg = self.spool_copy("digit")
        i = self.at_step(150)
        off, line, _ = self.recs[i]
        k = line.index(b'"loss":') + len(b'"loss":')
        k = line.index(b".", k) + 1  # the loss's first decimal
        digit = b"%d" % ((line[k] - 48 + 1) % 10)
        with open(seg, "rb+") as f:
            f.seek(off + k)
            f.write(digit)
        self.upload("digit", root, 6, {150}, [("bad checksum", off)])

    @unittest.skipIf(SANITIZE, "ctypes cannot load a sanitizer-instrumented library")
    def test_python_upload_exits_6_naming_the_damage(self):
        # python3 -m entropyd upload: the same status and lines as sigmatrain
        # --upload-spool for a garbage line (nothing lost) and a changed digit
        root, off = self.with_line("py-garbage", 100, b"garbage\n")
        out = self.upload("py-garbage", root, 6, set(), [("garbage", off)], python=True)
        self.assertIn("entropyd upload: every run acknowledged; 1 damaged spool record(s) skipped", out)
        root, seg = self.spool_copy("py-digit")
        i = self.at_step(150)
        off, line, _ = self.recs[i]
        k = line.index(b".", line.index(b'"loss":')) + 1
        with open(seg, "rb+") as f:
            f.seek(off + k)
            f.write(b"%d" % ((line[k] - 48 + 1) % 10))
        self.upload("py-digit", root, 6, {150}, [("bad checksum", off)], python=True)

    @unittest.skipIf(SANITIZE, "ctypes cannot load a sanitizer-instrumented library")
    def test_python_upload_clean_exits_0(self):
        root, _ = self.spool_copy("py-clean")
        out = self.upload("py-clean", root, 0, set(), [], python=True)
        self.assertNotIn("damaged", out)
        self.assertIn("entropyd upload: every run acknowledged", out)

    def test_unframed_version_1(self):
        # a spool as clients before the framing wrote it: bare lines, no version line
        root, seg = self.spool_copy("v1")
        lines = [r[1].split(b" ", 2)[2] for r in self.recs[1:]]
        lines.insert(150, b"garbage in an old spool\n")
        with open(seg, "wb") as f:
            f.write(b"".join(lines))
        off = sum(len(x) for x in lines[:150])
        self.upload("v1", root, 6, set(), [("garbage", off)])

    def test_clean_spool_exits_0(self):
        root, _ = self.spool_copy("clean")
        out = self.upload("clean", root, 0, set(), [])
        self.assertNotIn("damaged", out)

    def test_live_client_uploads_damaged_run(self):
        # a live client whose spool directory holds a damaged run uploads it in
        # the background: no connection storm, the damage in its inbox
        root, off = self.with_line("bg", 100, b"garbage\n")
        c0 = self.connections()
        live = subprocess.run([SIGMATRAIN] + TINY + ["--steps", "5", "--daemon", "unix:" + self.d.sock, "--run", "live",
                               "--spool", root, "--end-grace", "60"], capture_output=True, text=True, timeout=120)
        out = live.stdout + live.stderr
        self.assertEqual(live.returncode, 0, out)
        conns = self.connections() - c0
        self.assertLessEqual(conns, MAX_CONNECTIONS, out)
        self.assertEqual(self.stored_steps("bg"), {s: 1 for s in self.loss})
        damage = [l for l in out.splitlines() if "spool_damage" in l]
        self.assertEqual(len(damage), 1, out)  # named once, by the live trainer
        self.assertIn("byte %d: garbage" % off, damage[0])
        print("live sigmatrain + damaged run in its spool: %d connection(s); %s" % (conns, damage[0][:300]))

if __name__ == "__main__":
    unittest.main(verbosity=2)
