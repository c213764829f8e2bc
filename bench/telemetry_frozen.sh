#!/usr/bin/env bash
# A frozen daemon (SIGSTOP) must not slow the trainer: step times and the
# telemetry calls' cost with the daemon running, frozen and running again,
# side by side, with the bars (bench/bench_telemetry_frozen.c).
#   STEPS (default 1500), WORK_US: the step's compute (default 1000)
set -euo pipefail
BUILD=${BUILD:-build}
echo "load: $(uptime | sed 's/.*load average/load average/')"
ENTROPYD=${ENTROPYD:-$BUILD/entropyd} "$BUILD/bench/bench_telemetry_frozen"
