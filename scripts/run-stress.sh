#!/usr/bin/env bash
# make stress: the long reliability runs, then one table.
#   1. tests/e2e_reliability.py with STRESS=1: 20 kill -9 rounds of a
#      streaming load, 200 trainers + 100 SSE clients for 60 s, the
#      security checks;
#   2. build/tests/test_faults: every allocation of a trainer session
#      failing once, SQLITE_IOERR/FULL/BUSY while a trainer streams;
#   3. build/tests/test_telemetry_frozen with FROZEN_STEPS=5000: a trainer
#      whose daemon runs / is frozen (SIGSTOP) / resumes loses nothing (its
#      timings are in make bench: bench/telemetry_frozen.sh);
#   4. the fuzzers, FUZZ_SECONDS each (default 60);
#   5. tests/stress_attacks.py: the hostile loads (floods of
#      unfinished lines, connection churn, idle sockets, DNS rebinding and
#      cross-site DELETE, stream churn, idle HTTP sockets), ATTACK_SECONDS
#      each (default 20), while a real trainer streams: a table per attack,
#      each figure beside its bound with pass or FAIL;
#   6. tests/stress_faults.py: one fault script per family
#      (spool damage, bit flips, sparse steps, hung receivers, full disk,
#      fd exhaustion, WAL truncation, every HTTP slot taken, wide runs),
#      a line per family with its result.
# Logs in build/stress/. Exit status 0 only if every part passed and no
# data was lost. STRESS_TABLE=1 prints the last run's table again.
# About 8 minutes on the 2-core build machine.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export ENTROPYD=${ENTROPYD:-$PWD/$BUILD/entropyd}
out=$BUILD/stress
mkdir -p "$out"
rc=0
step() { # name, command...
  local name=$1; shift
  local t0=$(date +%s)
  if "$@" >"$out/$name.log" 2>&1; then
    printf "stress %-18s ok   %4ds\n" "$name" $(( $(date +%s) - t0 ))
  else
    rc=1
    printf "stress %-18s FAIL %4ds (log %s)\n" "$name" $(( $(date +%s) - t0 )) "$out/$name.log"
    tail -n 30 "$out/$name.log" | sed 's/^/    /'
  fi
}
# STRESS_TABLE=1: print the table of the last run again, run nothing
if [ -z "${STRESS_TABLE:-}" ]; then
rm -f "$out/reliability.json"
step reliability env STRESS=1 RELIABILITY_JSON="$out/reliability.json" python3 -W ignore tests/e2e_reliability.py
step faults "$BUILD/tests/test_faults"
step frozen env FROZEN_STEPS=5000 "$BUILD/tests/test_telemetry_frozen"
step fuzz env FUZZ_SECONDS="${FUZZ_SECONDS:-60}" scripts/run-fuzz.sh
rm -f "$out/attacks.json"
step attacks env ATTACKS_JSON="$out/attacks.json" ATTACK_SECONDS="${ATTACK_SECONDS:-20}" python3 -W ignore tests/stress_attacks.py
rm -f "$out/faults.json"
step families env BUILD="$BUILD" FAULTS_JSON="$out/faults.json" python3 -W ignore tests/stress_faults.py
fi

python3 - "$out" "$rc" <<'EOF'
import json, os, re, sys
out, rc = sys.argv[1], int(sys.argv[2])
def read(name):
    try:
        return open(os.path.join(out, name)).read()
    except OSError:
        return ""
try:
    r = json.load(open(os.path.join(out, "reliability.json")))
except (OSError, ValueError):
    r = {}
faults, frozen, fuzz = read("faults.log"), read("frozen.log"), read("fuzz.log")
m = re.search(r"allocation failures: (\d+) injected \(allocations 1\.\.(\d+)", faults)
alloc = "%s (allocations 1..%s of a session)" % m.groups() if m else "?"
vfs = re.search(r"injected (\d+) VFS errors; (\d+) steps sent and acked", faults)
phases = re.findall(r"^(SQLITE_\w+)\s+(\d+) ms: writer retries (\d+)", faults, re.M)
fz = re.findall(r"^fuzz (\S+)\s+ok\s+\S+\s+runs (\d+)", fuzz, re.M)
fz_total = sum(int(n) for _, n in fz)
frozen_ok = re.search(r"^\[  PASSED  \]", frozen, re.M) is not None
lost = None
if r:
    lost = (r.get("load_sent", 0) - r.get("load_stored", 0)) + r.get("kill_lost", 0)
rows = [
    ("load held", "%s trainers (12x12, 8 head metrics) + %s SSE clients, %s s: %s steps/s = %.2fM values/s, "
     "%s errors, %s SSE resets, RSS max %s MiB (first half %s, second half %s)"
     % (r.get("load_trainers", "?"), r.get("load_sse", "?"), r.get("load_seconds", "?"), r.get("load_steps_per_s", "?"),
        r.get("load_values_per_s", 0) / 1e6, r.get("load_errors", "?"), r.get("load_resets", "?"),
        r.get("load_rss_max_mib", "?"), r.get("load_rss_first_half_mib", "?"), r.get("load_rss_second_half_mib", "?"))),
    ("faults survived", "kill -9: %s rounds (%s trainers, %s steps); allocation failures: %s; SQLite: %s (%s VFS errors)"
     % (r.get("kill_rounds", "?"), r.get("kill_trainers", "?"), r.get("kill_steps", "?"), alloc,
        ", ".join("%s %s ms/%s retries" % p for p in phases) or "?", vfs.group(1) if vfs else "?")),
    ("frozen daemon", "sigmatrain %s steps/s with its daemon running, %s frozen (%s alternating blocks of %s s); "
     "a trainer whose daemon is frozen and resumed: %s (timings: make bench, bench/telemetry_frozen.sh)"
     % (r.get("sgt_running_steps_s", "?"), r.get("sgt_frozen_steps_s", "?"), r.get("sgt_blocks", "?"),
        r.get("sgt_block_s", "?"), "nothing lost" if frozen_ok else "FAILED (frozen.log)")),
    ("bad inputs tried", "%d fuzz executions (%s); + the security and protocol inputs of the e2e tests"
     % (fz_total, ", ".join("%s %s" % f for f in fz) or "?")),
    ("data lost", "%s (load: %s sent, %s stored; kill -9: every acked step present once)"
     % ("?" if lost is None else lost, r.get("load_sent", "?"), r.get("load_stored", "?"))),
]
try:
    attacks = json.load(open(os.path.join(out, "attacks.json")))
except (OSError, ValueError):
    attacks = []
attack_lost = sum(a.get("lost", 0) for a in attacks)
if lost is not None:
    lost += attack_lost
rows.append(("attacks held", "%d of %d (each bound below)" % (sum(1 for a in attacks if a.get("held")), len(attacks))
             if attacks else "?"))
print()
print("| %-16s | %s |" % ("stress", "result"))
print("|%s|%s|" % ("-" * 18, "-" * 60))
for k, v in rows:
    print("| %-16s | %s |" % (k, v))
# each attack: its figures beside the bar's bounds, with pass or FAIL
labels = [("rss", "daemon RSS peak"), ("welcome", "slowest trainer welcome"), ("healthz", "/healthz p99"),
          ("lost", "acked steps lost"), ("alive", "daemon"), ("answer", "attack's answers")]
for a in attacks:
    print()
    print("attack: %s, %s s at load %s: %s; %s" % (a["attack"], a.get("seconds"), a.get("load"), a["result"],
                                                 "held" if a.get("held") else "NOT HELD"))
    print("| %-24s | %-50s | %-26s | %-4s |" % ("bound", "figure", "bar", ""))
    print("|%s|%s|%s|%s|" % ("-" * 26, "-" * 52, "-" * 28, "-" * 6))
    for key, label in labels:
        c = a.get("checks", {}).get(key)
        if not c:
            continue
        fig = c[0]
        if key == "healthz":  # the machine's own latency beside it
            fig += " (median %s, max %s; quiet p99 %s)" % (a.get("healthz_median_ms"), a.get("healthz_max_ms"),
                                                           a.get("quiet_healthz_p99_ms"))
        print("| %-24s | %-50s | %-26s | %-4s |" % (label, fig, c[1], "pass" if c[2] else "FAIL"))
try:
    fams = json.load(open(os.path.join(out, "faults.json")))
except (OSError, ValueError):
    fams = []
print()
print("| %-16s | %-28s | %7s | %s |" % ("fault family", "result", "seconds", "test"))
print("|%s|%s|%s|%s|" % ("-" * 18, "-" * 30, "-" * 9, "-" * 40))
for f in fams:
    print("| %-16s | %-28s | %7s | %s |" % (f["family"], f["result"], f["seconds"], f["test"]))
ok = (rc == 0 and lost == 0 and bool(attacks) and all(a.get("held") for a in attacks) and bool(fams)
      and all(f["result"] == "ok" for f in fams))
print()
print("stress: %s" % ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
EOF
