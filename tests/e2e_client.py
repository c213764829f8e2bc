#!/usr/bin/env python3
"""End-to-end tests of libentropyd_telemetry (telemetry/) as a program outside
the repository uses it, and of two faults it once had (2 and 3).

1. `make install PREFIX=tmp`, then examples/stream_steps.c compiled by `cc`
   with nothing but `pkg-config entropyd_telemetry` from that prefix, run
   against a real entropyd with no LD_LIBRARY_PATH (the .pc's rpath): its
   steps are stored, the NaN as NaN; linked statically too.  The Python
   package imports from a fresh shell (env -i) with the environment make
   install printed, with Debian's /usr/bin/python3, and finds the
   installed library.
2. Grace period: the client finishes while no daemon is up; it keeps
   reconnecting (progress lines), the daemon starts after its first
   progress line, and everything is acknowledged before it exits.
3. Spool upload: sigmatrain runs left unacknowledged in a spool directory
   are uploaded in the background by the next client started on it, and by
   `sigmatrain --upload-spool --spool DIR` (no --run: every run).

Env: ENTROPYD, SIGMATRAIN, BUILD, SANITIZE.  python3 standard library only."""
import glob
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import BUILD, Daemon, ROOT, floats, wait_for  # noqa: E402

SIGMATRAIN = os.environ.get("SIGMATRAIN") or os.path.join(BUILD, "sigmatrain")
SANITIZE = os.environ.get("SANITIZE", "")
TINY = ["--layers", "2", "--heads", "2", "--dim", "16", "--seq-len", "16", "--batch", "2", "--threads", "1",
        "--eval-every", "0", "--print-every", "1000"]


def steps_of(d, run):
    rows = d.query("SELECT s.step FROM steps s JOIN runs r ON r.id = s.run_id WHERE r.name = ? ORDER BY s.step",
                   (run,))
    return [r[0] for r in rows]


class ClientLibraryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="entropyd-client-e2e-")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        r = subprocess.run(["make", "-s", "--no-print-directory", "install", "PREFIX=" + cls.prefix,
                            "BUILD=" + BUILD, "SANITIZE=" + SANITIZE], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, "make install failed:\n" + r.stdout + r.stderr
        cls.install_out = r.stdout
        # a program outside the repository: copy the example out, build it with pkg-config only
        src = os.path.join(cls.tmp, "outside", "stream_steps.c")
        os.makedirs(os.path.dirname(src))
        shutil.copy(os.path.join(ROOT, "examples", "stream_steps.c"), src)
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(cls.prefix, "lib", "pkgconfig"))
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "entropyd_telemetry"], env=env,
                               capture_output=True, text=True)
        assert flags.returncode == 0, "pkg-config: " + flags.stderr
        assert cls.prefix in flags.stdout, flags.stdout
        cls.exe = os.path.join(cls.tmp, "outside", "stream_steps")
        san = ["-fsanitize=" + SANITIZE] if SANITIZE else []
        cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", src, "-o", cls.exe] + san + flags.stdout.split(),
                            cwd=os.path.dirname(src), capture_output=True, text=True)
        assert cc.returncode == 0, "cc: " + cc.stderr
        cls.env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        # docs/client.md, "Linking": the static archive, no rpath needed
        cls.static_exe = os.path.join(cls.tmp, "outside", "stream_steps_static")
        cjson = subprocess.run(["pkg-config", "--libs", "libcjson"], capture_output=True, text=True).stdout.split()
        cc = subprocess.run(["cc", "-std=c11", src, "-I" + os.path.join(cls.prefix, "include"),
                             os.path.join(cls.prefix, "lib", "libentropyd_telemetry.a"), "-o", cls.static_exe]
                            + san + cjson + ["-lpthread", "-lm"], capture_output=True, text=True)
        assert cc.returncode == 0, "cc (static): " + cc.stderr

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_installed_files(self):
        for f in ("lib/libentropyd_telemetry.a", "lib/libentropyd_telemetry.so", "lib/libentropyd_telemetry.so.1",
                  "include/entropyd/telemetry.h", "lib/pkgconfig/entropyd_telemetry.pc"):
            self.assertTrue(os.path.exists(os.path.join(self.prefix, f)), f)
        # the program is dynamically linked to the installed library
        ldd = subprocess.run(["ldd", self.exe], env=self.env, capture_output=True, text=True).stdout
        self.assertIn(os.path.join(self.prefix, "lib", "libentropyd_telemetry.so.1"), ldd)

    def test_static_link_needs_no_shared_library(self):
        ldd = subprocess.run(["ldd", self.static_exe], env=self.env, capture_output=True, text=True).stdout
        self.assertNotIn("libentropyd_telemetry", ldd)
        d = Daemon().start()
        try:
            r = subprocess.run([self.static_exe, "unix:" + d.sock, "static-run", "3"], env=self.env,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(steps_of(d, "static-run"), [0, 1, 2])
        finally:
            d.cleanup()

    @unittest.skipIf(SANITIZE, "ctypes cannot load a sanitizer-instrumented library")
    def test_python_package_imports_from_a_fresh_shell(self):
        """What make install printed is all a new shell needs: Debian's
        python3 imports the package from PREFIX and loads PREFIX's library."""
        if not os.path.exists("/usr/bin/python3"):
            self.skipTest("no /usr/bin/python3")
        line = [l for l in self.install_out.splitlines() if "Python package installed in" in l]
        self.assertEqual(len(line), 1, self.install_out)
        self.assertIn("export PYTHONPATH=" + self.prefix, line[0])
        site = line[0].split("export PYTHONPATH=")[1].split()[0]
        self.assertTrue(os.path.exists(os.path.join(site, "entropyd", "__init__.py")), site)
        d = Daemon().start()
        try:
            code = ("import entropyd; print(entropyd._LIBPATH)\n"
                    "r = entropyd.init('fresh-shell', layers=1, heads=1, seq_len=4, daemon=%r)\n"
                    "r.log(0, scalars={'loss': 1.0}); assert r.finish()\n" % ("unix:" + d.sock))
            r = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "HOME=" + self.tmp, "PYTHONPATH=" + site,
                                "/usr/bin/python3", "-c", code], cwd=self.tmp, capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(r.stdout.split()[0], os.path.join(self.prefix, "lib", "libentropyd_telemetry.so.1"))
            self.assertEqual(steps_of(d, "fresh-shell"), [0])
            # and without PYTHONPATH the package is not found: the message is needed
            r = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "/usr/bin/python3", "-c", "import entropyd"],
                               cwd=self.tmp, capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0)
        finally:
            d.cleanup()

    def test_example_streams_through_pkg_config(self):
        d = Daemon().start()
        try:
            r = subprocess.run([self.exe, "unix:" + d.sock, "pkgconfig-run", "6"], env=self.env,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("all acknowledged", r.stdout)
            self.assertEqual(steps_of(d, "pkgconfig-run"), list(range(6)))
            st = d.query("SELECT status FROM runs WHERE name = 'pkgconfig-run'")
            self.assertEqual(st, [("finished",)])
            blob = d.query("SELECT f.data FROM frames f JOIN metrics m ON m.id = f.metric_id "
                           "WHERE m.name = 'entropy' AND f.step = 1")[0][0]
            v = floats(blob)
            self.assertEqual(len(v), 4)
            self.assertTrue(math.isnan(v[3]), v)  # sent as null, stored as NaN
            self.assertAlmostEqual(v[2], 0.9, places=6)
        finally:
            d.cleanup()

    def test_grace_period_reconnects_to_a_daemon_that_comes_back(self):
        d = Daemon()
        os.makedirs(d.data, exist_ok=True)
        p = subprocess.Popen([self.exe, "unix:" + d.sock, "grace-run", "20"], env=self.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = p.stderr.readline()  # the first progress line: the client is waiting
            self.assertIn("waiting up to", first)
            self.assertIn("reconnecting", first)
            d.start()
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0, first + out + err)
            self.assertEqual(steps_of(d, "grace-run"), list(range(20)))
            self.assertEqual(d.query("SELECT status FROM runs WHERE name = 'grace-run'"), [("finished",)])
        finally:
            if p.poll() is None:
                p.kill()
            d.cleanup()

    def test_spool_runs_are_uploaded(self):
        if not os.access(SIGMATRAIN, os.X_OK):
            self.skipTest("no sigmatrain")
        spool = os.path.join(self.tmp, "spool")
        nobody = "unix:" + os.path.join(self.tmp, "nobody.sock")
        for run in ("left-a", "left-b"):  # two runs whose daemon never came
            r = subprocess.run([SIGMATRAIN] + TINY + ["--steps", "30", "--daemon", nobody, "--run", run,
                                                      "--spool", spool, "--end-grace", "0",
                                                      "--telemetry-queue", "4096"],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("not everything was acknowledged", r.stdout + r.stderr)
            self.assertTrue(os.path.exists(os.path.join(spool, run, "hello.json")))
        d = Daemon().start()
        try:
            # (b) a new run on the same spool directory uploads both in the background
            r = subprocess.run([SIGMATRAIN] + TINY + ["--steps", "5", "--daemon", "unix:" + d.sock, "--run", "new-c",
                                                      "--spool", spool], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            wait_for(lambda: len(steps_of(d, "left-a")) == 30 and len(steps_of(d, "left-b")) == 30, 60,
                     "the background upload of left-a and left-b")
            self.assertEqual(steps_of(d, "left-a"), list(range(1, 31)))
            self.assertEqual(d.query("SELECT status FROM runs WHERE name = 'left-a'"), [("finished",)])
            # acknowledged spools are compacted: nothing left to upload
            for run in ("left-a", "left-b", "new-c"):
                segs = glob.glob(os.path.join(spool, run, "seg-*.log"))
                self.assertEqual([os.path.getsize(s) for s in segs], [0], run)
            # the upload-all command
            r = subprocess.run([SIGMATRAIN] + TINY + ["--steps", "12", "--daemon", nobody, "--run", "left-d",
                                                      "--spool", spool, "--end-grace", "0",
                                                      "--telemetry-queue", "4096"],
                               capture_output=True, text=True, timeout=120)
            u = subprocess.run([SIGMATRAIN, "--upload-spool", "--daemon", "unix:" + d.sock, "--spool", spool],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(u.returncode, 0, u.stdout + u.stderr)
            self.assertIn("run left-d: spool uploaded", u.stdout)
            self.assertIn("every run acknowledged", u.stdout)
            self.assertEqual(steps_of(d, "left-d"), list(range(1, 13)))
            self.assertEqual(steps_of(d, "left-a"), list(range(1, 31)))  # nothing uploaded twice
        finally:
            d.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
