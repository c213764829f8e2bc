#!/usr/bin/env bash
# make test: runs every test program and prints one closing line
# "tests: N passed, N failed". Each program's output goes to
# $BUILD/test-logs/NAME.log and is printed in full when it fails.
#   unit:    $BUILD/tests/test_*        (cmocka, one per module)
#   e2e:     tests/e2e_*.py             (start the real programs; python3 stdlib)
#   browser: tests/browser/*.test.mjs   (playwright-core + Debian chromium)
#   fuzz:    tests/fuzz/fuzz_*.c         (libFuzzer, FUZZ_TEST_SECONDS each, default 30)
#   format:  scripts/check-format.sh     (every C file against .clang-format)
#   house:   scripts/check-house.sh      (no file over 1,000 lines, no function over 120, no "issue N")
# ONLY=pattern runs the matching ones.
set -u
BUILD=${BUILD:-build}
logs=$BUILD/test-logs
mkdir -p "$logs"
export BUILD ENTROPYD=$PWD/$BUILD/entropyd SIGMATRAIN=$PWD/$BUILD/sigmatrain
# Unit tests call OpenBLAS directly; its default of one spinning thread per
# core made test_sreparam take 80 s instead of 0.2 s on a loaded machine.
# sigmatrain sets its own thread count, so this only changes the tests' calls.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
pass=0; fail=0; failed=()
run() { # name, timeout seconds, command...
  local name=$1 t=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ $name != *$ONLY* ]]; then return; fi
  local start=$(date +%s%N)
  if timeout -k 10 "$t" "$@" </dev/null >"$logs/$name.log" 2>&1; then
    pass=$((pass+1)); local ms=$(( ($(date +%s%N) - start) / 1000000 )); printf "PASS %-32s %4d.%01ds\n" "$name" $((ms/1000)) $((ms%1000/100))
  else
    fail=$((fail+1)); failed+=("$name")
    printf "FAIL %-32s (log: %s)\n" "$name" "$logs/$name.log"
    tail -n 60 "$logs/$name.log" | sed 's/^/    /'
  fi
}
run format 120 scripts/check-format.sh
run house 60 scripts/check-house.sh
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  case $t in *.o|*.d) continue;; esac
  run "$(basename "$t")" 600 "$t"
done
for t in tests/e2e_*.py; do
  [ -f "$t" ] || continue
  run "$(basename "$t" .py)" 900 python3 "$t"
done
for t in tests/browser/*.test.mjs; do
  [ -f "$t" ] || continue
  [ -n "${SANITIZE:-}" ] && [ "${BROWSER_UNDER_SANITIZE:-1}" = 0 ] && continue
  run "browser_$(basename "$t" .test.mjs)" 600 node "$t"
done
for t in tests/fuzz/fuzz_*.c; do
  [ -f "$t" ] || continue
  run "$(basename "$t" .c)" 400 env FUZZ_SECONDS="${FUZZ_TEST_SECONDS:-30}" scripts/run-fuzz.sh "$(basename "$t" .c)"
done
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "tests: $pass passed, $fail failed"
[ "$fail" = 0 ]
