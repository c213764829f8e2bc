#!/usr/bin/env bash
# Storage floor (issue 14's 2.5 bytes/value bar): records a real sigmatrain
# stream (REAL_STEPS steps, 12x12; REPLAY=DB reads an earlier recording, any
# entropyd database, its longest run) and prints, metric by metric, what its
# sealed blocks cost against what an ideal coder would reach with four
# predictors (bench/storage_floor.py says which and how it estimates); then
# replays the recording to REPLAY_STEPS steps (bench_history_seed) for the
# all-in overheads of a long run, and adds them to the best predictors.
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
