#!/usr/bin/env bash
# Remote-write benchmark: the push rate of a committed backlog to
# a receiver that decodes nothing (the pusher's own cost) and to Debian's
# Prometheus 2.42, side by side, with the daemon's CPU per million samples.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export ENTROPYD=${ENTROPYD:-$root/${BUILD:-build}/entropyd}
exec python3 "$root/bench/remote_write.py"
