#!/usr/bin/env bash
# Browser bench of the live pages (bench/live.mjs): requests and bytes per minute
# of one live 12x12x9 run page and of the runs list during a collapse, the
# daemon's CPU with 20 such pages open, the cold first render of a 100k-step
# 12x12x9 run (median of 5 fresh contexts, 1440x900) and the compare view's
# first render with 10,000 runs stored. The two databases are seeded through
# the store API (bench_dashboard_seed, bench_many_runs_seed) and cached under
# $BUILD/bench-data/ (FRESH=1 re-seeds). LIVE_WINDOW_MS (60000, at least
# 10000) and LOADS (5, at least 5) as in live.mjs; the 20 pages are fixed.
# CPU heavy: nice it on a shared machine.
set -euo pipefail
BUILD=${BUILD:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
export ENTROPYD=${ENTROPYD:-$root/$BUILD/entropyd}
for b in bench_dashboard_seed bench_many_runs_seed; do
  [ -x "$root/$BUILD/bench/$b" ] || { echo "live: $root/$BUILD/bench/$b is missing (make all)"; exit 1; }
done
[ -d "$root/tests/browser/node_modules/playwright-core" ] || (cd "$root/tests/browser" && npm ci --no-audit --no-fund --silent)
cache="$root/$BUILD/bench-data"
big="$cache/live-12x12x9-100k/entropyd.db" many="$cache/live-10k-runs/entropyd.db"
if [ -n "${FRESH:-}" ] || [ ! -f "$big" ]; then
  rm -rf "$(dirname "$big")"; mkdir -p "$(dirname "$big")"
  "$root/$BUILD/bench/bench_dashboard_seed" --db "$big" --layers 12 --heads 12 --steps 100000 --head-metrics 9 \
    --run live-12x12x9-100k | sed 's/^/live: /'
fi
if [ -n "${FRESH:-}" ] || [ ! -f "$many" ]; then
  rm -rf "$(dirname "$many")"; mkdir -p "$(dirname "$many")"
  "$root/$BUILD/bench/bench_many_runs_seed" --db "$many" --runs 10000 | sed 's/^/live: /'
fi
echo "live: load average before: $(cut -d" " -f1-3 /proc/loadavg) on $(nproc) cores (other work on the machine slows every figure)"
node "$root/bench/live.mjs" "$big" "$many"
