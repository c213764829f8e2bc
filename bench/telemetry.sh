#!/usr/bin/env bash
# Telemetry client benchmark: what one logged step costs the training thread
# (12x12 model, 8 head + 4 layer metrics + 5 scalars), with no daemon
# (spooling), an unreachable one, a fake one in-process, and the real
# entropyd when it is built; plus the sender thread's own throughput.
#   STEPS (default 20000), GAP_US: busy work between steps (default 100)
set -euo pipefail
BUILD=${BUILD:-build}
STEPS=${STEPS:-20000}
GAP_US=${GAP_US:-100}
if [ -x "$BUILD/entropyd" ]; then
  dir=$(mktemp -d /tmp/telemetry-bench.XXXXXX)
  "$BUILD/entropyd" --data "$dir" --http off >"$dir/log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
  for i in $(seq 100); do [ -S "$dir/entropyd.sock" ] && break; sleep 0.05; done
  if [ -S "$dir/entropyd.sock" ]; then
    "$BUILD/bench/bench_telemetry" "$STEPS" "$GAP_US" "$dir/entropyd.sock"
    exit 0
  fi
  echo "telemetry: entropyd did not start (log: $(tail -n 3 "$dir/log")); without it:"
fi
"$BUILD/bench/bench_telemetry" "$STEPS" "$GAP_US"
