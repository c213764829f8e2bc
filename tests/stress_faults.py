"""make stress, part "families": one fault script per
family of faults nobody chose, each the project's own test of it, run
against the release build; prints a line per family with its result and
time, writes FAULTS_JSON (a list of {family, result, seconds, test}) and
exits 1 unless every family passed. A family whose test is not in the tree
is reported MISSING (a failure: the family is not covered).

  spool damage       tests/e2e_spool*.py (the spool helper's: torn, garbage,
                     invalid UTF-8, duplicate-seq records)
  bit flips          tests/e2e_integrity.py (block, rollup, random bytes)
  sparse steps       e2e_long's sparse and huge step numbers; test_rollup
  hung receivers     e2e_alertmanager's hung webhook beside Alertmanager
  full disk          e2e_ingest FullDiskTest (a small tmpfs)
  fd exhaustion      e2e_ingest OutOfDescriptorsTest (RLIMIT_NOFILE 96)
  WAL truncation     e2e_faults LostWalTest (a WAL cut to 0 under the daemon)
  every HTTP slot    e2e_faults ReservedSlotTest (512 streams, /healthz)
  wide runs          e2e_faults CellCapLineTest, MemoryBoundTest

FAMILIES=WORD runs the families whose name holds WORD. Not run by make
test (no e2e_ prefix). python3 stdlib only."""
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", "build")
PY = [sys.executable, "-W", "ignore"]


def unit(path, *names):
    return PY + [os.path.join(ROOT, "tests", path)] + list(names)


def families():
    spool = sorted(glob.glob(os.path.join(ROOT, "tests", "e2e_spool*.py")))
    return [
        ("spool damage", [PY + [p] for p in spool], "tests/e2e_spool*.py"),
        ("bit flips", [unit("e2e_integrity.py")], "e2e_integrity"),
        ("sparse steps", [unit("e2e_long.py", "LongRunsTest.test_series_over_sparse_and_huge_steps_is_exact"),
                          [os.path.join(ROOT, BUILD, "tests", "test_rollup")]], "e2e_long sparse, test_rollup"),
        ("hung receivers", [unit("e2e_alertmanager.py", "AlertmanagerE2E.test_hung_webhook_delays_only_itself")],
         "e2e_alertmanager hung webhook"),
        ("full disk", [unit("e2e_ingest.py", "FullDiskTest")], "e2e_ingest FullDiskTest"),
        ("fd exhaustion", [unit("e2e_ingest.py", "OutOfDescriptorsTest")], "e2e_ingest OutOfDescriptorsTest"),
        ("WAL truncation", [unit("e2e_faults.py", "LostWalTest")], "e2e_faults LostWalTest"),
        ("every HTTP slot", [unit("e2e_faults.py", "ReservedSlotTest")], "e2e_faults ReservedSlotTest"),
        ("wide runs", [unit("e2e_faults.py", "CellCapLineTest", "MemoryBoundTest")],
         "e2e_faults CellCapLineTest, MemoryBoundTest"),
    ]


def main():
    want = os.environ.get("FAMILIES", "")
    out_dir = os.path.join(ROOT, BUILD, "stress")
    os.makedirs(out_dir, exist_ok=True)
    rows, ok = [], True
    for name, cmds, what in families():
        if want and want not in name:
            continue
        t0 = time.time()
        if not cmds:
            result = "MISSING"
        else:
            result = "ok"
            log = os.path.join(out_dir, "fault-%s.log" % name.replace(" ", "_"))
            with open(log, "w") as f:
                for cmd in cmds:
                    try:
                        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=600, cwd=ROOT).returncode
                    except subprocess.TimeoutExpired:
                        rc = "timeout"
                    if rc != 0:
                        result = "FAIL (log %s)" % os.path.relpath(log, ROOT)
                        break
        secs = time.time() - t0
        ok = ok and result == "ok"
        rows.append({"family": name, "result": result, "seconds": round(secs, 1), "test": what})
        print("fault %-16s %-8s %5.1f s  (%s)" % (name, result, secs, what), flush=True)
    if os.environ.get("FAULTS_JSON"):
        with open(os.environ["FAULTS_JSON"], "w") as f:
            json.dump(rows, f)
    print("fault families: %d of %d passed" % (sum(r["result"] == "ok" for r in rows), len(rows)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
