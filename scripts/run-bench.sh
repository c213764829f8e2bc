#!/usr/bin/env bash
# make bench: runs every benchmark and prints its figures.
#   build/bench/*            (C benchmarks)
#   bench/*.sh               (benchmarks that drive several programs)
set -u
BUILD=${BUILD:-build}
export BUILD ENTROPYD=$PWD/$BUILD/entropyd SIGMATRAIN=$PWD/$BUILD/sigmatrain
rc=0
for b in bench/*.sh; do
  [ -f "$b" ] || continue
  if [ -n "${ONLY:-}" ] && [[ $b != *$ONLY* ]]; then continue; fi
  echo "== $(basename "$b" .sh)"
  bash "$b" || { echo "bench $(basename "$b") failed"; rc=1; }
done
exit $rc
