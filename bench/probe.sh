#!/usr/bin/env bash
# bench/probe.sh: probe_compute now against older probes, A/B in one process
# (bench_probe runs both on the same forward of every step, alternating
# their order), at head widths d = 12 (H=8, C=96) and d = 32 (H=4, C=128).
#
# Each older probe is trainer/probe.{c,h} of a git revision, compiled here
# with the trainer's flags and its symbols renamed probe_base_*.  Defaults:
# 8f66717 (the last probe with power-iteration norms, before they were
# certified) and 18a3199 (the first certified one, +45% CPU).
# Env: BASES (revisions), REPS (steps measured, default 15), CONFIGS
# ("heads dim" pairs), THREADS (default 1: the thread-CPU figure then covers
# the whole probe).
set -u
BUILD=${BUILD:-build}
BASES=${BASES:-"8f66717 18a3199"}
REPS=${REPS:-15}
CONFIGS=${CONFIGS:-"8:96 4:128"}
THREADS=${THREADS:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
[ -f "$BUILD/bench/bench_probe.o" ] || { echo "probe: $BUILD/bench/bench_probe.o not built (make all)"; exit 1; }
cflags="-std=c11 -O2 -O3 -march=native -g -D_GNU_SOURCE -pthread -Itrainer -Idaemon $(pkg-config --cflags openblas)"
libs="$(pkg-config --libs openblas) -llapacke -lpthread -lm"
export OPENBLAS_NUM_THREADS=1
rc=0
for rev in $BASES; do
  dir=$BUILD/bench/probe_base/$rev
  mkdir -p "$dir"
  if ! git show "$rev:trainer/probe.c" >"$dir/probe.c" 2>/dev/null || ! git show "$rev:trainer/probe.h" >"$dir/probe.h"; then
    echo "probe: revision $rev has no trainer/probe.c (shallow clone?); skipped"
    continue
  fi
  # the base keeps its own probe.h (the quotes search its directory first)
  if ! cc $cflags -c "$dir/probe.c" -o "$dir/probe.o"; then echo "probe: $rev does not compile"; rc=1; continue; fi
  ren=()
  for s in $(nm --defined-only -g "$dir/probe.o" | awk '{print $3}'); do ren+=(--redefine-sym "$s=${s/probe_/probe_base_}"); done
  objcopy "${ren[@]}" "$dir/probe.o" "$dir/probe_base.o"
  cc "$BUILD/bench/bench_probe.o" "$dir/probe_base.o" "$BUILD/libtrainer.a" $libs -o "$dir/bench_probe_ab" || { rc=1; continue; }
  for hc in $CONFIGS; do
    echo "-- base $rev ($(git log -1 --format=%cs "$rev")), now $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- trainer/probe.c || echo '+changes'), load $(cut -d' ' -f1-3 /proc/loadavg)"
    "$dir/bench_probe_ab" "$REPS" "$THREADS" sigma "${hc%%:*}" "${hc##*:}" 4 || rc=1
  done
done
exit $rc
