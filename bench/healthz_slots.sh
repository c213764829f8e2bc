#!/usr/bin/env bash
# /healthz with every HTTP slot taken: latency of
# /healthz and /metrics with 512 open /api/stream clients (every ordinary
# slot; the answers come through a reserved one) beside the same probes
# with no stream open. Bar: /healthz p99 <= 100 ms, none unanswered.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export ENTROPYD=${ENTROPYD:-$root/${BUILD:-build}/entropyd}
exec python3 -W ignore "$root/bench/healthz_slots.py"
