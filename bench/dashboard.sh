#!/usr/bin/env bash
# Dashboard benchmark: time to the first complete render of a run with
# 12 x 12 heads and 100,000 steps (target <= 1 s), the page's JS heap,
# scrubbing and zoom latency, then the same page for a 32 x 32-head run and
# for a run of 1,000,000 steps.
# The runs are written straight into a database by build/bench/bench_dashboard_seed
# (the store API; ~1.5 min for the 1M-step one on a loaded machine) and cached under build/bench-data/
# (FRESH=1 re-seeds; CASE=NAME runs one case); entropyd then serves it and
# Debian's chromium loads it.
set -euo pipefail
BUILD=${BUILD:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
seed="$root/$BUILD/bench/bench_dashboard_seed"
export ENTROPYD=${ENTROPYD:-$root/$BUILD/entropyd}
[ -x "$seed" ] || { echo "dashboard: $seed is missing (make all)"; exit 1; }
[ -d "$root/tests/browser/node_modules/playwright-core" ] || (cd "$root/tests/browser" && npm install --no-audit --no-fund --silent)
cache="$root/$BUILD/bench-data"
mkdir -p "$cache"
# name layers heads steps head-metrics
run_case() {
  local name=$1 L=$2 H=$3 steps=$4 hm=$5 label=$6
  if [ -n "${CASE:-}" ] && [ "$CASE" != "$name" ]; then return 0; fi
  local db="$cache/$name/entropyd.db"
  if [ -n "${FRESH:-}" ] || [ ! -f "$db" ]; then
    rm -rf "$cache/$name"; mkdir -p "$cache/$name"
    "$seed" --db "$db" --layers "$L" --heads "$H" --steps "$steps" --head-metrics "$hm" --run "$name" | sed 's/^/dashboard: /'
  fi
  local tmp; tmp=$(mktemp -d /tmp/entropyd-dash.XXXXXX)
  # a copy: the daemon may migrate or checkpoint it; the cache stays as seeded
  cp "$db" "$tmp/entropyd.db"
  node "$root/bench/dashboard.mjs" "$tmp" 1 "$label" "${LOADS:-5}" || { rm -rf "$tmp"; return 1; }
  rm -rf "$tmp"
}
echo "dashboard: load average before: $(cut -d" " -f1-3 /proc/loadavg) on $(nproc) cores (other work on the machine slows every figure)"
run_case dash-12x12-100k 12 12 100000 7 "12x12 heads, 100k steps"
[ -n "${SMALL_ONLY:-}" ] || run_case dash-32x32-20k 32 32 20000 3 "32x32 heads, 20k steps"
# a million steps (few heads keep the database small: the step count is what matters here)
[ -n "${SMALL_ONLY:-}" ] || run_case dash-4x4-1m 4 4 1000000 3 "4x4 heads, 1M steps"
