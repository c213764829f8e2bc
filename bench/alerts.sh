#!/usr/bin/env bash
# Alert rule evaluation cost against ingest cost, measured in the same run as
# CPU time (the machine is shared, so wall time would mostly measure waiting):
# the default rules on a 12 x 12 model with 8 head metrics; target: at most 5%
# of the daemon's CPU time per ingested step.
set -euo pipefail
BUILD=${BUILD:-build}
eval_us=$("$BUILD/bench/bench_alert" 20000 | tee /dev/stderr | sed -n 's/.*: \([0-9.]*\) us per step in the engine.*/\1/p')
ingest_us=$(SECONDS_RUN=4 TRAINERS=4 bash bench/ingest.sh 2>&1 | tee /dev/stderr | sed -n 's/.*= \([0-9.]*\) us per step$/\1/p')
awk -v e="$eval_us" -v i="$ingest_us" 'BEGIN { printf "alerts: ingest %.1f us CPU per step, rule evaluation %.2f us CPU per step = %.1f%% (target <= 5%%)\n", i, e, 100 * e / i }'
