#!/usr/bin/env bash
# Live dashboard benchmark (issue 33 item 1): requests and bytes per minute
# of one run page left open on a live 12x12 run logging 10 steps/s, and of
# the runs list while that run collapses. It is tests/browser/live.test.mjs
# with a one-minute window (LIVE_WINDOW_MS); the figures are its
# "live run page" and "runs list during a collapse" lines. Cold first render
# of a 100k-step run: bench/dashboard.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ -d "$root/tests/browser/node_modules/playwright-core" ] || (cd "$root/tests/browser" && npm ci --no-audit --no-fund --silent)
export ENTROPYD=${ENTROPYD:-$root/${BUILD:-build}/entropyd}
out=$(LIVE_WINDOW_MS=${LIVE_WINDOW_MS:-60000} node "$root/tests/browser/live.test.mjs" 2>&1) || { echo "$out" | tail -40; exit 1; }
echo "$out" | grep -E '^(live run page|runs list during)' | sed 's/^/live: /'
echo "$out" | grep -E '^FAIL' || true
