#!/usr/bin/env bash
# The PyTorch probe's cost: step time of a PyTorch loop with the
# default entropyd.torch.watch against no watch, interleaved in one run
# (bench/bench_torch_probe.py), against a real entropyd.  Needs torch at
# /usr/bin/python3 (Debian's python3-torch); skipped without it.
#   TORCH_BENCH_CONFIGS, TORCH_BENCH_THREADS, TORCH_BENCH_PAIRS, TORCH_BENCH_BLOCK: see the .py
set -euo pipefail
BUILD=${BUILD:-build}
PY=/usr/bin/python3
if ! $PY -c 'import torch' 2>/dev/null; then echo "torch_probe: no torch at $PY, skipped"; exit 0; fi
export ENTROPYD_TELEMETRY_LIB=$PWD/$BUILD/libentropyd_telemetry.so
dir=$(mktemp -d /tmp/torch-bench.XXXXXX)
"$BUILD/entropyd" --data "$dir" --http off >"$dir/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for i in $(seq 100); do [ -S "$dir/entropyd.sock" ] && break; sleep 0.05; done
ENTROPYD_SOCK=$dir/entropyd.sock $PY bench/bench_torch_probe.py
