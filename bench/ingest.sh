#!/usr/bin/env bash
# Ingest benchmark: K simulated trainers -> the real entropyd over its Unix
# socket; prints head-values/s committed and acked beside the 5M target, the
# daemon's CPU per step, bytes on disk per value of the bench's synthetic
# data, and, beside it, bytes per value of a REAL sigmatrain stream: a run
# recorded by sigmatrain (REAL_STEPS steps, 12x12; REPLAY=DB replays a
# recording made before: any entropyd database, its longest run) replayed
# to REPLAY_STEPS steps by bench_history_seed, all-in (frames, blocks,
# rollups, indexes, WAL after checkpoint), exact and with --lossy-bf16
# (sealed blocks rounded to bfloat16). The narrow-row SQLite ceiling is
# measured in the same run. REAL=0 skips the real stream. Then the daemon's
# CPU per step at a training loop's pace (PACE_TRAINERS=1 trainer sending a
# step every PACE_MS=15 ms for PACE_SECONDS=6 s, on a fresh daemon), where a
# transaction's fixed costs count, not only the per-value ones (the
# loop-overhead bar of docs/benchmarks.md); PACE_SECONDS=0 skips it.
#   TRAINERS=4 SECONDS_RUN=10 REAL_STEPS=400 REPLAY_STEPS=20000 bench/ingest.sh
set -euo pipefail
BUILD=${BUILD:-build}
K=${TRAINERS:-4}
SECS=${SECONDS_RUN:-10}
dir=$(mktemp -d /tmp/entropyd-bench.XXXXXX)
pid=
trap '[ -n "$pid" ] && { kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; }; rm -rf "$dir"' EXIT
echo "ingest: load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
"$BUILD/entropyd" --data "$dir" >"$dir/log" 2>&1 &
pid=$!
for i in $(seq 100); do [ -S "$dir/entropyd.sock" ] && break; sleep 0.05; done
"$BUILD/bench/bench_ingest" --socket "$dir/entropyd.sock" --trainers "$K" --seconds "$SECS" \
  --narrow-db "$dir/narrow.db" | tee "$dir/out"
# the daemon's CPU time (user + system) over the run, per acked step
ticks=$(awk '{print $14 + $15}' /proc/$pid/stat)
kill -TERM $pid; wait $pid || true
pid=
steps_acked=$(awk '/steps acked/ {print $9}' "$dir/out")
awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v s="$steps_acked" 'BEGIN { printf "ingest: daemon CPU %.1f s = %.1f us per step\n", t/hz, 1e6*t/hz/s }' | tee "$dir/cpu_full"
values=$(awk '/total head values/ {print $5}' "$dir/out")
bytes=$(sqlite3 "$dir/entropyd.db" "PRAGMA wal_checkpoint(TRUNCATE);" >/dev/null; stat -c %s "$dir/entropyd.db")
awk -v b="$bytes" -v v="$values" 'BEGIN { printf "ingest: synthetic data (uniform random, 6 digits): database %.1f MB for %.0f head values = %.2f bytes/head value (layer metrics and scalars ride along)\n", b/1e6, v, b/v }'
if [ "${REAL:-1}" != 0 ]; then
  src=${REPLAY:-}
  if [ -z "$src" ]; then
    src=$(BUILD=$BUILD scripts/record-real-stream.sh "$dir/real" "${REAL_STEPS:-400}")
  fi
  "$BUILD/bench/bench_history_seed" --db "$dir/replay.db" --run replay --steps "${REPLAY_STEPS:-20000}" \
    --replay "$src" | sed 's/^/ingest: real sigmatrain stream: /'
  rm -f "$dir/replay.db"
  "$BUILD/bench/bench_history_seed" --db "$dir/replay.db" --run replay --steps "${REPLAY_STEPS:-20000}" \
    --replay "$src" --lossy-bf16 1 | grep bytes/value | sed 's/^/ingest: real sigmatrain stream, --lossy-bf16: /'
fi
if [ "${PACE_SECONDS:-6}" != 0 ]; then
  rm -rf "$dir/paced"; mkdir "$dir/paced"
  "$BUILD/entropyd" --data "$dir/paced" --http off >"$dir/paced/log" 2>&1 &
  pid=$!
  for i in $(seq 100); do [ -S "$dir/paced/entropyd.sock" ] && break; sleep 0.05; done
  "$BUILD/bench/bench_ingest" --socket "$dir/paced/entropyd.sock" --trainers "${PACE_TRAINERS:-1}" \
    --seconds "${PACE_SECONDS:-6}" --pace-ms "${PACE_MS:-15}" --narrow-seconds 0 >"$dir/paced/out"
  ticks=$(awk '{print $14 + $15}' /proc/$pid/stat)
  kill -TERM $pid; wait $pid || true
  pid=
  steps_acked=$(awk '/steps acked/ {print $9}' "$dir/paced/out")
  full=$(awk '/daemon CPU/ {print $7}' "$dir/cpu_full")
  awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v s="$steps_acked" -v k="${PACE_TRAINERS:-1}" -v ms="${PACE_MS:-15}" \
    -v full="$full" 'BEGIN { printf "ingest: at a training loop'"'"'s pace (%d trainer(s), a step every %s ms): daemon CPU %.0f us per step (%d steps), beside %.0f us per step at full speed above\n", k, ms, 1e6*t/hz/s, s, full }'
fi
echo "ingest: load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
