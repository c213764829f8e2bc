#!/usr/bin/env bash
# Ingest benchmark: K simulated trainers -> the real entropyd over its Unix
# socket; prints head-values/s committed and acked, bytes on disk per value,
# and the narrow-row SQLite ceiling measured in the same run.
set -euo pipefail
BUILD=${BUILD:-build}
K=${TRAINERS:-4}
SECS=${SECONDS_RUN:-10}
dir=$(mktemp -d /tmp/entropyd-bench.XXXXXX)
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
"$BUILD/entropyd" --data "$dir" >"$dir/log" 2>&1 &
pid=$!
for i in $(seq 100); do [ -S "$dir/entropyd.sock" ] && break; sleep 0.05; done
"$BUILD/bench/bench_ingest" --socket "$dir/entropyd.sock" --trainers "$K" --seconds "$SECS" \
  --narrow-db "$dir/narrow.db" | tee "$dir/out"
# the daemon's CPU time (user + system) over the run, per acked step
ticks=$(awk '{print $14 + $15}' /proc/$pid/stat)
kill -TERM $pid; wait $pid || true
steps_acked=$(awk '/steps acked/ {print $9}' "$dir/out")
awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v s="$steps_acked" 'BEGIN { printf "ingest: daemon CPU %.1f s = %.1f us per step\n", t/hz, 1e6*t/hz/s }' 
values=$(awk '/total head values/ {print $5}' "$dir/out")
bytes=$(sqlite3 "$dir/entropyd.db" "PRAGMA wal_checkpoint(TRUNCATE);" >/dev/null; stat -c %s "$dir/entropyd.db")
awk -v b="$bytes" -v v="$values" 'BEGIN { printf "ingest: database %.1f MB for %.0f head values = %.2f bytes/value (target <= 5)\n", b/1e6, v, b/v }'
