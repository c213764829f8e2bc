# scripts/start-entropyd.sh: sourced by the benchmarks that query a real
# entropyd over HTTP (bench/history.sh, bench/http.sh, bench/wide_series.sh).
#
#   start_entropyd BINARY DATA_DIR [flag ...]
#
# starts BINARY (an entropyd) on DATA_DIR with HTTP on a free loopback port
# and the given extra flags, its stdout in DATA_DIR/out and its stderr in
# DATA_DIR/log, and waits until it prints its port. Sets entropyd_pid (the
# caller kills it) and entropyd_port. When no port appears within 10 s it
# stops the daemon, prints its log and exits the calling script with 1.
start_entropyd() {
  local bin=$1 data=$2
  shift 2
  "$bin" --data "$data" --http 127.0.0.1:0 "$@" >"$data/out" 2>"$data/log" &
  entropyd_pid=$!
  entropyd_port=
  for _ in $(seq 200); do
    entropyd_port=$(awk '/^http port/ {print $3}' "$data/out" 2>/dev/null || true)
    [ -n "$entropyd_port" ] && return 0
    kill -0 "$entropyd_pid" 2>/dev/null || break
    sleep 0.05
  done
  kill "$entropyd_pid" 2>/dev/null
  echo "$bin did not start on $data:" >&2
  cat "$data/log" >&2
  exit 1
}
