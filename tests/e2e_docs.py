"""The documentation tells the truth:
- README.md stays short (at most 300 lines) and shows the screenshot;
- no link in README.md or docs/ points outside the repository, and every
  relative link names a file that exists;
- every `curl` line in a ```sh block of README.md and docs/*.md runs as
  written against a daemon serving a real demo's database, with an HTTP
  status below 400 (`localhost:8080` in the example becomes the test
  daemon's address; each file gets a fresh copy of the database, so a
  DELETE example changes nothing for the next file).
python3 stdlib only."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import ENTROPYD, ROOT, Daemon  # noqa: E402

SIGMATRAIN = os.environ.get("SIGMATRAIN") or os.path.join(ROOT, "build", "sigmatrain")
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<(https?://[^>]+)>")
HOSTS = re.compile(r"(?:https?://)?(?:localhost|127\.0\.0\.1):8080")


def rel(path):
    return os.path.relpath(path, ROOT)


def prose(text):
    """The text outside fenced code blocks (links inside code are examples)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def curl_examples(text):
    """The curl commands of the ```sh blocks, continuation lines joined."""
    out = []
    for block in re.findall(r"^```(?:sh|bash|shell)\n(.*?)^```", text, flags=re.S | re.M):
        block = block.replace("\\\n", " ")
        for line in block.splitlines():
            line = line.strip()
            if line.startswith("curl "):
                out.append(line)
    return out


class Docs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="e2e-docs-")
        cls.demo = os.path.join(cls.tmp, "demo")
        env = dict(os.environ, ENTROPYD=ENTROPYD, SIGMATRAIN=SIGMATRAIN, DEMO_DATA=cls.demo,
                   DEMO_HOLD="0", DEMO_PORT="0", DEMO_STEPS="60")
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "demo.sh")], env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, "the demo failed:\n" + r.stdout[-2000:] + r.stderr[-2000:]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_readme_is_short_and_shows_the_dashboard(self):
        with open(DOCS[0]) as f:
            text = f.read()
        n = text.count("\n")
        self.assertLessEqual(n, 300, "README.md has %d lines" % n)
        shots = [t for t, _ in LINK.findall(prose(text)) if t.endswith(".png")]
        self.assertTrue(shots, "README.md shows no picture")
        for s in shots:
            self.assertTrue(os.path.isfile(os.path.join(ROOT, s)), s)

    def test_demo_runs_have_the_ids_the_docs_use(self):
        """The examples say run 1 is demo-baseline and run 2 its twin: the demo
        starts the twin only after the baseline's hello."""
        import sqlite3
        con = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.demo, "entropyd.db"), uri=True)
        try:
            ids = dict(con.execute("SELECT name, id FROM runs").fetchall())
        finally:
            con.close()
        self.assertEqual(ids, {"demo-baseline": 1, "demo-sigmareparam": 2})

    def test_links_stay_in_the_repository(self):
        bad = []
        for doc in DOCS:
            with open(doc) as f:
                text = prose(f.read())
            for target, auto in LINK.findall(text):
                target = target or auto
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    bad.append("%s: %s (outside the repository)" % (rel(doc), target))
                    continue
                path = target.split("#", 1)[0]
                if not path:
                    continue
                full = os.path.realpath(os.path.join(os.path.dirname(doc), path))
                if not full.startswith(os.path.realpath(ROOT) + os.sep):
                    bad.append("%s: %s (leaves the repository)" % (rel(doc), target))
                elif not os.path.exists(full):
                    bad.append("%s: %s (no such file)" % (rel(doc), target))
        self.assertEqual(bad, [], "\n".join(bad))

    def test_documented_curl_examples_run(self):
        total, failures = 0, []
        for doc in DOCS:
            with open(doc) as f:
                examples = curl_examples(f.read())
            if not examples:
                continue
            data = os.path.join(self.tmp, "copy-" + os.path.basename(doc))
            shutil.copytree(self.demo, data, ignore=shutil.ignore_patterns("*.sock"))
            d = Daemon(data=data, http=True)
            try:
                d.start()
                for cmd in examples:
                    total += 1
                    run = HOSTS.sub("http://127.0.0.1:%d" % d.http_port, cmd)
                    # curl as written, but a status >= 400 is an error; a stream ends after 3 s
                    wrapped = ('curl() { command curl --fail-with-body --max-time 3 "$@"; }; ' + run)
                    r = subprocess.run(["bash", "-c", wrapped], stdin=subprocess.DEVNULL,
                                       capture_output=True, text=True, timeout=30, cwd=data)
                    streaming = "/api/stream" in cmd and r.returncode == 28 and r.stdout
                    ok = (r.returncode == 0 or streaming) and (r.stdout.strip() or " -o " in cmd)
                    print("%s %s: %s" % ("ok  " if ok else "FAIL", rel(doc), cmd))
                    if not ok:
                        failures.append("%s: %s\n  exit %d: %s %s" % (rel(doc), cmd, r.returncode,
                                                                    r.stdout[:300], r.stderr[:300]))
            finally:
                d.stop()
        print("%d curl examples run" % total)
        self.assertGreater(total, 5, "the docs should show the HTTP API by example")
        self.assertEqual(failures, [], "\n".join(failures))


if __name__ == "__main__":
    unittest.main(verbosity=2)
