#!/usr/bin/env bash
# HTTP benchmark: a database with two runs of 1,000,000 steps (2x2 heads and
# 1x12 heads, written straight through store.h by bench_http_gen), served by
# the real entropyd; bench_http measures series latency (one head, random
# windows, pooled heads, and 12 heads in one split=head request against one
# of them alone) and frame latency, requests/s of
# /api/runs and of a static file, and commit -> SSE delay with 100 clients.
#   STEPS=1000000 CLIENTS=100 SECONDS_RUN=3 REQUESTS=500 bench/http.sh
set -euo pipefail
BUILD=${BUILD:-build}
STEPS=${STEPS:-1000000}
dir=$(mktemp -d /tmp/entropyd-httpbench.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; [ -n "$pid" ] && wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
# generating 1M steps takes 10-25 s: keep the database between runs, made
# again whenever the generator (so the store code) is newer than it
cache="$BUILD/bench/http-$STEPS.db"
if [ ! -s "$cache" ] || [ "$BUILD/bench/bench_http_gen" -nt "$cache" ]; then
  rm -f "$cache" "$cache-wal" "$cache-shm"
  "$BUILD/bench/bench_http_gen" "$cache.tmp" "$STEPS"
  sqlite3 "$cache.tmp" 'PRAGMA wal_checkpoint(TRUNCATE);' >/dev/null 2>&1 || true
  rm -f "$cache.tmp-wal" "$cache.tmp-shm"
  mv "$cache.tmp" "$cache"
fi
cp "$cache" "$dir/entropyd.db"
mkdir -p "$dir/web"
# a 12 KB page: the size of a small dashboard file
{ echo '<!doctype html><title>bench</title>'; head -c 12000 /dev/zero | tr '\0' 'x'; echo; } > "$dir/web/index.html"
. scripts/start-entropyd.sh
start_entropyd "$BUILD/entropyd" "$dir" --web-root "$dir/web"
pid=$entropyd_pid port=$entropyd_port
# the figures are latencies on a shared machine: say how busy it was
echo "http: load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
"$BUILD/bench/bench_http" --port "$port" --socket "$dir/entropyd.sock" --run 1 --split-run 2 --static /index.html \
  --requests "${REQUESTS:-500}" --clients "${CLIENTS:-100}" --seconds "${SECONDS_RUN:-3}" --pid "$pid"
echo "http: load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
