#!/usr/bin/env python3
"""End-to-end tests of the sigmatrain binary (env SIGMATRAIN): resume is bit
exact, the synthetic loss falls far below its start, divergence ends with
status 3 (or continues with --continue-on-nan), bad flags are refused,
--data FILE trains a byte-level model.  Python standard library only."""
import os, re, subprocess, sys, tempfile

BIN = os.environ.get("SIGMATRAIN", os.path.join(os.path.dirname(__file__), "..", "build", "sigmatrain"))
SMALL = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq-len", "32", "--batch", "4",
         "--threads", "2", "--eval-every", "0", "--eval-batches", "2"]
failures = []

def run(args, expect=0):
    p = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=300)
    if p.returncode != expect:
        raise AssertionError("exit %d (want %d) for %s\nstdout:\n%s\nstderr:\n%s"
                             % (p.returncode, expect, " ".join(args), p.stdout, p.stderr))
    return p

def check(name, fn):
    try:
        fn()
        print("ok   %s" % name)
    except Exception as e:  # report every failure, then fail
        print("FAIL %s: %s" % (name, e))
        failures.append(name)

def test_resume_bit_exact():
    with tempfile.TemporaryDirectory() as d:
        for extra in (["--reparam", "sigma", "--optimizer", "adamw"],
                      ["--reparam", "spectral", "--optimizer", "momentum", "--norm", "post"],
                      ["--reparam", "none", "--optimizer", "adam", "--norm", "none"]):
            base = SMALL + extra + ["--steps", "12", "--warmup", "3", "--lr", "3e-3"]
            run(base + ["--save", os.path.join(d, "a_{step}.ckpt"), "--save-every", "6"])
            a = open(os.path.join(d, "a_12.ckpt"), "rb").read()
            p = run(["--resume", os.path.join(d, "a_6.ckpt"), "--save", os.path.join(d, "b.ckpt"),
                     "--threads", "2", "--eval-every", "0", "--eval-batches", "2"])
            assert "resumed from" in p.stdout, p.stdout
            b = open(os.path.join(d, "b.ckpt"), "rb").read()
            assert a[:4] == b"SGTR", "bad magic"
            assert a == b, "resumed checkpoint differs from the uninterrupted run (%s)" % extra
            print("     resume %s: %d bytes identical" % (" ".join(extra), len(a)))
        # --steps extends a finished run; run-defining flags are refused with a warning
        p = run(["--resume", os.path.join(d, "a_12.ckpt"), "--steps", "15", "--lr", "9",
                 "--eval-every", "0", "--eval-batches", "1"])
        assert "summary: steps 15 " in p.stdout, p.stdout
        assert "--lr is ignored" in p.stderr, p.stderr
        with open(os.path.join(d, "junk.ckpt"), "wb") as f:
            f.write(b"not a checkpoint at all")
        p = run(["--resume", os.path.join(d, "junk.ckpt")], expect=1)
        assert "not a sigmatrain checkpoint" in p.stderr, p.stderr
        trunc = os.path.join(d, "trunc.ckpt")
        with open(trunc, "wb") as f:
            f.write(a[: len(a) // 2])
        p = run(["--resume", trunc], expect=1)
        assert "resume" in p.stderr, p.stderr

def test_loss_falls():
    p = run(["--layers", "2", "--dim", "64", "--heads", "4", "--seq-len", "64", "--batch", "16",
             "--steps", "500", "--lr", "3e-3", "--warmup", "20", "--print-every", "1",
             "--eval-every", "0"])
    losses = [float(x) for x in re.findall(r"^step\s+\d+/\d+ \| loss ([0-9.]+)", p.stdout, re.M)]
    val = float(re.search(r"summary:.*val loss ([0-9.]+)", p.stdout).group(1))
    first = losses[0]
    print("     first step loss %.4f, final val loss %.4f (ratio %.2f)" % (first, val, val / first))
    assert first > 3.5, "unexpected start %f" % first
    assert val < 0.6 * first, "val loss %.4f not far below the start %.4f" % (val, first)

def test_divergence():
    p = run(SMALL + ["--steps", "20", "--optimizer", "sgd", "--lr", "1e30", "--clip", "0"], expect=3)
    assert "diverged" in p.stderr, p.stderr
    p = run(SMALL + ["--steps", "20", "--optimizer", "sgd", "--lr", "1e30", "--clip", "0",
                     "--continue-on-nan", "--print-every", "5"], expect=3)
    assert "step     20/20" in p.stdout, p.stdout  # ran to the end
    assert re.search(r"nan steps [1-9]", p.stdout), p.stdout

def test_bad_flags():
    for args, msg in ((["--reparam", "bogus"], "unknown value"), (["--layers", "x"], "integer"),
                      (["--frobnicate", "1"], "unknown flag"), (["--heads", "3"], "divisible"),
                      (["--lr"], "needs a value"), (["--resume", "/nonexistent/ckpt"], "resume")):
        p = run(args, expect=1)
        assert msg in p.stderr, (args, p.stderr)
    p = run(["--help"])
    assert "--reparam" in p.stdout and "--gamma-init" in p.stdout

def test_data_file():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "text.txt")
        with open(path, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog. " * 400)
        p = run(SMALL + ["--data", path, "--steps", "100", "--lr", "3e-3", "--save",
                         os.path.join(d, "f.ckpt")])
        assert "vocab=256" in p.stdout, p.stdout
        val = float(re.search(r"summary:.*val loss ([0-9.]+)", p.stdout).group(1))
        assert val < 4.4, "byte model did not learn: %f" % val  # log 256 = 5.55
        # resuming needs the same data
        run(["--resume", os.path.join(d, "f.ckpt")], expect=1)

check("resume is bit exact", test_resume_bit_exact)
check("synthetic loss falls", test_loss_falls)
check("divergence", test_divergence)
check("bad flags", test_bad_flags)
check("--data FILE", test_data_file)
sys.exit(1 if failures else 0)
