#!/usr/bin/env bash
# Storage floor (the 2.5 bytes/value target): records a real sigmatrain
# stream (REAL_STEPS steps, 12x12; REPLAY=DB reads an earlier recording, any
# entropyd database, its longest run) and prints, metric by metric, what its
# sealed blocks cost against what an ideal coder would reach with four
# predictors (bench/storage_floor.py says which and how it estimates); then
# replays the recording to REPLAY_STEPS steps (bench_history_seed) for the
# all-in overheads of a long run, and adds them to the best predictors;
# last, bytes/value of that replay at each lossy precision (--lossy-bits).
#   REAL_STEPS=1000 REPLAY_STEPS=20000 bench/storage_floor.sh      REPLAY=/tmp/rec/entropyd.db bench/storage_floor.sh
set -euo pipefail
BUILD=${BUILD:-build}
dir=$(mktemp -d /tmp/entropyd-floor.XXXXXX)
trap 'rm -rf "$dir"' EXIT
src=${REPLAY:-}
if [ -z "$src" ]; then
  src=$(BUILD=$BUILD scripts/record-real-stream.sh "$dir/real" "${REAL_STEPS:-1000}")
fi
"$BUILD/bench/bench_history_seed" --db "$dir/long.db" --run replay --steps "${REPLAY_STEPS:-20000}" --replay "$src" \
  | sed 's/^/storage_floor: replayed: /'
/usr/bin/python3 bench/storage_floor.py "$src" "$dir/long.db"
# the lossy precisions (entropyd --lossy-bits N): bytes/value all-in of the
# same replay at each, beside exact (docs/storage.md, "The lossy option")
for bits in 0 20 18 17 16 14 12 10 7; do
  rm -f "$dir/lossy.db" "$dir/lossy.db-wal" "$dir/lossy.db-shm"
  "$BUILD/bench/bench_history_seed" --db "$dir/lossy.db" --run replay --steps "${REPLAY_STEPS:-20000}" --replay "$src" \
    --lossy-bits "$bits" | awk -v b="$bits" '/bytes\/value/ {
      for (i = 1; i < NF; i++) if ($(i + 1) == "bytes/value") v = $i
      printf "storage_floor: --lossy-bits %-5s relative error <= %-8s %s bytes/value all-in\n",
        b == 0 ? "off" : b, b == 0 ? "0" : sprintf("%.1e", 2 ^ -(b + 1)), v }'
done
