#!/usr/bin/env bash
# Python client benchmark: what entropyd's run.log costs the
# training thread for a 12x12 step with 9 head metrics (target <= 50 us),
# beside a stdlib json.dumps client's formatting alone, against a real
# entropyd; a PyTorch training loop with and without logging every step in
# interleaved blocks (target: within 3%, bench/bench_python_log.py); then
# examples/pytorch_lm.py's median step time in three separate runs: without
# telemetry, logging every step (scalars only: the probe runs never), and
# probing + logging every step (what the probe itself costs).
#   BENCH_STEPS (default 20000), AB_BLOCK (20), AB_REPS (40), LM_STEPS (80),
#   BUILD (build): the build directory whose entropyd and libentropyd_telemetry.so
#   are measured (for an A/B of two builds, run this alternately with each)
set -euo pipefail
BUILD=${BUILD:-build}
# the interpreter with numpy and, when one has it, torch (Debian's python3-torch)
PY=python3
python3 -c 'import numpy' 2>/dev/null || PY=/usr/bin/python3
/usr/bin/python3 -c 'import numpy, torch' 2>/dev/null && PY=/usr/bin/python3
export ENTROPYD_TELEMETRY_LIB=$PWD/$BUILD/libentropyd_telemetry.so
dir=$(mktemp -d /tmp/python-bench.XXXXXX)
"$BUILD/entropyd" --data "$dir" --http off >"$dir/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for i in $(seq 100); do [ -S "$dir/entropyd.sock" ] && break; sleep 0.05; done
rc=0
export ENTROPYD_PID=$pid   # the A/B reports the daemon's CPU per logged step
ENTROPYD_SOCK=$dir/entropyd.sock $PY bench/bench_python_log.py || rc=1
# the bar's A/B again with the training loop on one core (see bench_python_log.py)
AB_ONLY=1 OPENBLAS_NUM_THREADS=1 ENTROPYD_SOCK=$dir/entropyd.sock $PY bench/bench_python_log.py || rc=1
if $PY -c 'import torch' 2>/dev/null; then
  LM_STEPS=${LM_STEPS:-80}
  med() { sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p'; }
  lm() { $PY examples/pytorch_lm.py --steps "$LM_STEPS" --sigma-reparam --print-every 100000 "$@"; }
  a=$(lm --no-telemetry | med)
  b=$(lm --daemon "unix:$dir/entropyd.sock" --run bench-lm-log --log-every 1000000000 | med)
  c=$(lm --daemon "unix:$dir/entropyd.sock" --run bench-lm-probe --log-every 1 | med)
  echo "pytorch_lm, three separate runs (2x4 heads, dim 64, T 64, batch 8, σReparam, $LM_STEPS steps each, load $(cut -d' ' -f1 /proc/loadavg)):"
  echo "  median step: no telemetry $a ms | logging every step $b ms | probe + logging every step $c ms"
  awk -v a="$a" -v b="$b" -v c="$c" 'BEGIN { printf "  logging: %+.1f%% of the step (not interleaved: see the A/B above for the bar); probe + logging: %+.1f%%\n", 100*(b-a)/a, 100*(c-a)/a }'
fi
exit $rc
