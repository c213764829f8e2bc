#!/usr/bin/env bash
# Many-runs benchmark: hello latency, ingest rate, /api/runs first
# page and the runs page's first render with 10 and with 10,000 stored runs,
# side by side; daemon RSS per idle stored run; RSS after a 1024 x 1024-head
# run ends and is deleted. MANY_RUNS=N changes 10,000; LOADS=N the page loads;
# BIG_STEPS=N the steps of the 1024 x 1024-head run (3).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export ENTROPYD=${ENTROPYD:-$root/${BUILD:-build}/entropyd}
[ -d "$root/tests/browser/node_modules/playwright-core" ] || (cd "$root/tests/browser" && npm install --no-audit --no-fund --silent)
exec python3 "$root/bench/many_runs.py"
