"""A fresh machine's first `make demo`: the packages are installed before the
build reads its flags from pkg-config, even with -j.

A fresh Debian has no pkg-config and no libraries when make starts; a
Makefile that expands `pkg-config --cflags` while it parses builds without
them and fails (the first `make demo` once stopped on "cJSON.h: No such
file").  Here that machine is imitated: PKG_CONFIG is a script that fails
until a marker file exists, and DEPS, the package step, is a script that
records its profile and creates the marker.  python3 stdlib only."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FirstRun(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="e2e-first-run-")
        self.dir = self.tmp.name
        self.marker = os.path.join(self.dir, "packages-installed")
        self.profiles = os.path.join(self.dir, "profiles")
        self.pkg_config = self.script("pkg-config", f"""
[ -f {self.marker} ] || {{ echo "fake pkg-config: no packages yet" >&2; exit 1; }}
exec pkg-config "$@"
""")

    def tearDown(self):
        self.tmp.cleanup()

    def script(self, name, body):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(path, 0o755)
        return path

    def make(self, *args, deps, env=None):
        e = dict(os.environ, **(env or {}))
        for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
            e.pop(k, None)
        return subprocess.run(["make", "-C", ROOT, "-j4", *args,
                               "BUILD=" + os.path.join(self.dir, "build"),
                               "PKG_CONFIG=" + self.pkg_config, "DEPS=" + deps],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              env=e, timeout=600)

    def recorded(self):
        with open(self.profiles) as f:
            return f.read().split()

    def test_build_without_packages_fails_clearly(self):
        """The control: without the package step, the fake pkg-config bites."""
        r = self.make("programs", deps="/bin/false")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("missing build dependencies", r.stderr)
        self.assertIn("make deps", r.stderr)

    def test_each_goal_installs_before_it_builds(self):
        """deps runs first, with the goal's own profile, and nothing is
        compiled before it (here it stops the goal at once)."""
        stop = self.script("deps-stop", f'echo "$1" >> {self.profiles}; exit 7\n')
        for goal in ("demo", "test", "bench", "experiments"):
            r = self.make(goal, deps=stop)
            self.assertNotEqual(r.returncode, 0, goal)
            self.assertEqual(self.recorded()[-1], goal)
            self.assertFalse(os.path.exists(os.path.join(self.dir, "build")),
                             f"make {goal} compiled before its packages were installed")

    def test_profiles_ask_only_for_what_their_goal_needs(self):
        """As a user without root on a machine that has nothing, each goal's
        apt-get line names what it needs: the demo no browser, plotter or MPI."""
        shim = os.path.join(self.dir, "shim")
        os.mkdir(shim)
        os.chmod(self.dir, 0o755)   # the unprivileged user runs the shim from here
        with open(os.path.join(shim, "dpkg-query"), "w") as f:
            f.write("#!/bin/sh\nexit 1\n")          # nothing is installed
        os.chmod(os.path.join(shim, "dpkg-query"), 0o755)
        env = dict(os.environ, PATH=shim + ":" + os.environ["PATH"])
        # the unprivileged user may not read the checkout (a clone in a 0700 temp dir): a copy here
        deps = os.path.join(self.dir, "deps.sh")
        shutil.copy(os.path.join(ROOT, "scripts", "deps.sh"), deps)
        os.chmod(deps, 0o755)
        asked = {}
        for profile in ("demo", "experiments", "test"):
            r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                "bash", deps, profile],
                               cwd=self.dir, env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            line = [x for x in r.stderr.splitlines() if "apt-get install" in x]
            self.assertTrue(line, r.stderr)
            asked[profile] = set(line[0].split()[3:])
        for p in ("libcjson-dev", "libmicrohttpd-dev", "pkg-config", "build-essential"):
            self.assertIn(p, asked["demo"])
        for p in ("chromium", "gnuplot-nox", "libopenmpi-dev", "openmpi-bin", "libcmocka-dev", "clang"):
            self.assertNotIn(p, asked["demo"])
        self.assertEqual(asked["experiments"] - asked["demo"], {"gnuplot-nox"})
        for p in ("chromium", "libcmocka-dev", "libopenmpi-dev", "curl", "jq"):
            self.assertIn(p, asked["test"])

    def test_deps_installs_the_pinned_browser_driver(self):
        """With no node_modules (a fresh clone), `deps.sh test` installs the
        pinned playwright-core, and this machine's node can load it."""
        browser = os.path.join(self.dir, "tests", "browser")
        os.makedirs(browser)
        for f in ("package.json", "package-lock.json"):
            shutil.copy(os.path.join(ROOT, "tests", "browser", f), browser)
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "deps.sh"), "test"], cwd=self.dir,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(browser, "package.json")) as f:
            want = json.load(f)["dependencies"]["playwright-core"]
        with open(os.path.join(browser, "node_modules", "playwright-core", "package.json")) as f:
            self.assertEqual(json.load(f)["version"], want)
        r = subprocess.run(["node", "--input-type=module", "-e",
                            "import {chromium} from 'playwright-core'; console.log(typeof chromium.launch)"],
                           cwd=browser, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.stdout.strip(), "function", r.stderr)

    def test_demo_on_a_fresh_machine(self):
        """`make -j4 demo` with no packages until deps has run: it builds and
        runs the demo to its summary."""
        deps = self.script("deps", f'echo "$1" >> {self.profiles}; touch {self.marker}\n')
        r = self.make("demo", deps=deps, env={
            "DEMO_STEPS": "3", "DEMO_PORT": "0", "DEMO_HOLD": "0",
            "DEMO_DATA": os.path.join(self.dir, "demo-data")})
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertEqual(self.recorded(), ["demo"])
        self.assertIn("demo: both runs finished", r.stdout)
        self.assertIn("demo: alerts raised", r.stdout)
        self.assertTrue(os.access(os.path.join(self.dir, "build", "entropyd"), os.X_OK))
        # the demo needs no MPI: the package profile has none, so neither does the build
        self.assertFalse(os.path.exists(os.path.join(self.dir, "build", "sigmatrain-mpi")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
