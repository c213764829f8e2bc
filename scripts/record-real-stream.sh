#!/usr/bin/env bash
# Records a real sigmatrain stream for the storage benchmarks (bench/ingest.sh,
# bench/history.sh): a 12x12 run of STEPS steps into a fresh entropyd in DIR
# (created), then stops the daemon. Prints the database's path.
#   usage: scripts/record-real-stream.sh DIR STEPS   (env: BUILD)
set -euo pipefail
BUILD=${BUILD:-build}
dir=$1 steps=$2
mkdir "$dir"
"$BUILD/entropyd" --data "$dir" --http off >"$dir/out" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$dir/entropyd.sock" ] && break; sleep 0.05; done
"$BUILD/sigmatrain" --layers 12 --heads 12 --dim 96 --seq-len 32 --batch 4 --threads 1 --probe-examples 1 \
  --eval-every 0 --print-every 100000 --steps "$steps" --daemon "unix:$dir/entropyd.sock" \
  --run real >"$dir/train.log" 2>&1
kill "$pid"; wait "$pid" 2>/dev/null || true
echo "$dir/entropyd.db"
