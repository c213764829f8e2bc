#!/usr/bin/env bash
# Runs every libFuzzer harness (build/fuzz/fuzz_*, sources tests/fuzz/fuzz_*.c)
# for FUZZ_SECONDS each (default 60) on its seed corpus
# tests/fuzz/corpus/NAME/, one after the other (the machine is shared).
# New inputs go to build/fuzz/corpus/NAME/ (the seeds stay as committed);
# a crash, leak or sanitizer report fails the run and leaves the input in
# build/fuzz/artifacts/. Prints one line per harness: runs, execs/s, coverage.
#   FUZZ_SECONDS=30 scripts/run-fuzz.sh [NAME...]
set -u
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-60}
make --no-print-directory -s fuzz-build SANITIZE= BUILD=build >/dev/null || { echo "fuzz: build failed"; exit 1; }
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for s in tests/fuzz/fuzz_*.c; do names+=("$(basename "$s" .c)"); done
fi
mkdir -p build/fuzz/artifacts build/fuzz/logs
rc=0
for n in "${names[@]}"; do
  mkdir -p "build/fuzz/corpus/$n"
  log=build/fuzz/logs/$n.log
  # -rss_limit_mb: the parsers take at most a 4 MiB line; -max_len keeps
  # inputs near the sizes the protocol and the rules files use.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  timeout -k 10 $((secs + 60)) "build/fuzz/$n" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 \
      -timeout=10 -print_final_stats=1 -artifact_prefix="build/fuzz/artifacts/$n-" \
      "build/fuzz/corpus/$n" "tests/fuzz/corpus/$n" >"$log" 2>&1
  r=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $r -eq 0 ] && ! grep -q 'ERROR: \(Address\|Leak\|Undefined\)Sanitizer\|runtime error:' "$log"; then
    printf "fuzz %-18s ok   %6ss  runs %-10s %8s exec/s  %s\n" "$n" "$secs" "${runs:-?}" "${eps:-?}" "${cov:-}"
  else
    rc=1
    printf "fuzz %-18s FAIL (exit %d, log %s)\n" "$n" "$r" "$log"
    grep -m1 -A25 'ERROR:\|runtime error:\|contract broken' "$log" | sed 's/^/    /'
  fi
done
exit $rc
