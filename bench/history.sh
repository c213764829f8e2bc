#!/usr/bin/env bash
# History-scaling benchmark (issue "Long runs"): a short and a long run of
# the same shape, written straight through store.h by bench_history_seed
# and served by the real entropyd. bench_history prints every read path's
# p50/p99 on both side by side with the ratio, then a rollback of REWIND
# steps and a DELETE of the long run with another trainer's ack latency
# meanwhile, and the WAL's peak. Then the WAL's peak while a trainer
# streams (bench_ingest) and a client reads an export at 200 KB/s.
#
# The runs replay a real sigmatrain stream (12x12 heads, every metric it
# logs: 8 head metrics, 10 layer metrics, 7 scalars), recorded first by
# running sigmatrain for REAL_STEPS steps (REPLAY=DB replays a recording
# made before: any entropyd database, its longest run), so bytes/value is
# that of real values. SYNTHETIC=1 seeds the synthetic shape instead
# (HEAD_METRICS head metrics, 3 layer metrics, 2 scalars; smooth values that
# compress better than real ones), and LAYERS x HEADS heads (default 12 x
# 12; the real stream is 12 x 12). The database is made in a temporary
# directory and deleted at the end (KEEP=1 keeps it, and prints where).
#   SHORT=10000 LONG=1000000 REAL_STEPS=400 REQUESTS=200 REWIND=40000 bench/history.sh
#   SYNTHETIC=1 LAYERS=32 HEADS=32 SHORT=10000 LONG=100000 bench/history.sh
set -euo pipefail
BUILD=${BUILD:-build}
SHORT=${SHORT:-10000}
LONG=${LONG:-1000000}
HM=${HEAD_METRICS:-9}
LAYERS=${LAYERS:-12}
HEADS=${HEADS:-12}
dir=$(mktemp -d /tmp/entropyd-history.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  if [ -n "${KEEP:-}" ]; then echo "history: kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
t0=$(date +%s)
seedargs=(--head-metrics "$HM" --layers "$LAYERS" --heads "$HEADS")
if [ -z "${SYNTHETIC:-}" ]; then
  if [ "$LAYERS" != 12 ] || [ "$HEADS" != 12 ]; then
    echo "history: the real stream is 12 x 12; LAYERS and HEADS need SYNTHETIC=1" >&2
    exit 2
  fi
  src=${REPLAY:-}
  if [ -z "$src" ]; then
    src=$(BUILD=$BUILD scripts/record-real-stream.sh "$dir/real" "${REAL_STEPS:-400}")
    echo "history: recorded ${REAL_STEPS:-400} real sigmatrain steps (12x12) in $(( $(date +%s) - t0 )) s"
  fi
  seedargs=(--replay "$src")
fi
"$BUILD/bench/bench_history_seed" --db "$dir/entropyd.db" --run short --steps "$SHORT" "${seedargs[@]}" | tee "$dir/seed" | sed 's/^/history: /'
"$BUILD/bench/bench_history_seed" --db "$dir/entropyd.db" --run long --steps "$LONG" "${seedargs[@]}" | tee -a "$dir/seed" | sed 's/^/history: /'
values=$(awk '{for (i = 1; i < NF; i++) if ($i == "values") v += $(i + 1)} END {print v}' "$dir/seed")
bytes=$(( $(stat -c %s "$dir/entropyd.db") + $(stat -c %s "$dir/entropyd.db-wal" 2>/dev/null || echo 0) ))
echo "history: database $((bytes / 1048576)) MiB for $values values: $(awk -v b=$bytes -v v=$values 'BEGIN{printf "%.2f", b/v}') bytes/value all-in (frames, blocks, rollups, indexes, WAL after checkpoint; seeded in $(( $(date +%s) - t0 )) s; bar 2.5)"
# The seed writes GBs in a few minutes; the kernel is still writing them back
# when it ends, and reads that wait behind that writeback are the disk's, not
# the daemon's (a real run writes the same bytes over days). Flush first.
t1=$(date +%s.%N); sync "$dir/entropyd.db"
# The reads below measure the daemon, so the file starts in the OS's cache, as
# a file a daemon has been writing for days is: on this VM ~20% of a fresh 3 GB
# file had been dropped from it, and those reads waited for the disk (random
# window p99 35 ms cold, 13 ms with the file cached, same daemon build).
cat "$dir/entropyd.db" >/dev/null
echo "history: sync after seeding and reading the file into the OS cache took $(awk -v a="$t1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
. scripts/start-entropyd.sh
start_entropyd "$BUILD/entropyd" "$dir"
pid=$entropyd_pid port=$entropyd_port
echo "history: load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
short_id=$(sqlite3 "$dir/entropyd.db" "SELECT id FROM runs WHERE name = 'short'")
long_id=$(sqlite3 "$dir/entropyd.db" "SELECT id FROM runs WHERE name = 'long'")
"$BUILD/bench/bench_history" --port "$port" --socket "$dir/entropyd.sock" --db "$dir/entropyd.db" \
  --short "$short_id" --long "$long_id" --long-name long --long-steps "$LONG" \
  --requests "${REQUESTS:-200}" --rewind "${REWIND:-40000}" --layers "$LAYERS" --heads "$HEADS"
# WAL peak with a slow export reader and a streaming trainer
rm -f "$dir/wal-peak"
( peak=0; while [ ! -e "$dir/stop" ]; do
    s=$(stat -c %s "$dir/entropyd.db-wal" 2>/dev/null || echo 0); [ "$s" -gt "$peak" ] && peak=$s
    echo "$peak" > "$dir/wal-peak"; sleep 0.02; done ) &
sampler=$!
curl -s --limit-rate 200k -o /dev/null "http://127.0.0.1:$port/api/runs/$short_id/export?format=csv" &
reader=$!
"$BUILD/bench/bench_ingest" --socket "$dir/entropyd.sock" --trainers 2 --seconds "${SECONDS_INGEST:-10}" | sed 's/^/history: /'
touch "$dir/stop"; wait "$sampler" 2>/dev/null || true
kill "$reader" 2>/dev/null || true; wait "$reader" 2>/dev/null || true
peak=$(cat "$dir/wal-peak")
echo "history: WAL peak with a slow export reader (200 KB/s) and a streaming trainer: $(awk -v b=$peak 'BEGIN{printf "%.1f", b/1048576}') MiB (bar: 64 MiB)"
echo "history: load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
