#!/usr/bin/env bash
# Telemetry overhead on the training step: sigmatrain on the bench
# config (L=4 H=4 C=128 T=128, batch 16, AdamW, 2 threads, σReparam),
# --log-every 1, in the same run: --telemetry-ab N alternates blocks of N
# steps with telemetry (probe + enqueue, sender thread busy) and without, and
# reports the median and mean step time of both (the first step of each block
# is left out: it may carry the sender's work of the previous block).
#   attached  to a real entropyd
#   spooling  to an unreachable socket (everything goes to the spool)
# Also prints the trainer's own accounting of the hook (probe + enqueue) and
# bench_probe (probe_compute against a training step, in one process).
# Env: SIGMATRAIN, ENTROPYD, BUILD, STEPS (default 120), BLOCK (default 4).
set -u
BUILD=${BUILD:-build}
BIN=${SIGMATRAIN:-$BUILD/sigmatrain}
DAEMON=${ENTROPYD:-$BUILD/entropyd}
STEPS=${STEPS:-120}
BLOCK=${BLOCK:-4}
for b in "$BIN" "$DAEMON"; do [ -x "$b" ] || { echo "telemetry_overhead: $b not built"; exit 1; }; done
tmp=$(mktemp -d /tmp/telemetry-overhead.XXXXXX)
dpid=
cleanup() { [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
"$DAEMON" --data "$tmp/d" --http off >"$tmp/daemon.out" 2>"$tmp/daemon.err" &
dpid=$!
for _ in $(seq 100); do [ -S "$tmp/d/entropyd.sock" ] && break; sleep 0.05; done
[ -S "$tmp/d/entropyd.sock" ] || { echo "telemetry_overhead: entropyd did not start"; cat "$tmp/daemon.err"; exit 1; }

CFG=(--layers 4 --heads 4 --dim 128 --seq-len 128 --batch 16 --optimizer adamw --threads 2
     --steps "$STEPS" --eval-every 0 --eval-batches 1 --print-every "$STEPS" --log-every 1 --telemetry-ab "$BLOCK")
echo "sigmatrain bench config, $STEPS steps, blocks of $BLOCK steps with/without telemetry (load: $(cut -d' ' -f1-3 /proc/loadavg))"
rc=0
for mode in attached spooling; do
  case $mode in
    attached) args=(--daemon "unix:$tmp/d/entropyd.sock" --run "bench-ab") ;;
    spooling) args=(--daemon "unix:$tmp/nobody.sock" --run "bench-ab" --spool "$tmp/spool") ;;
  esac
  out=$("$BIN" "${CFG[@]}" "${args[@]}" 2>&1)
  ab=$(echo "$out" | grep '^telemetry A/B')
  hook=$(echo "$out" | grep -o 'telemetry hook (probe + enqueue) [0-9.]* ms/step, [0-9.]*% of wall time')
  tps=$(echo "$out" | grep '^summary:' | sed -E 's/.*\| ([0-9]+) tok\/s.*/\1/')
  if [ -z "$ab" ]; then echo "telemetry_overhead: $mode run failed:"; echo "$out" | tail -5; rc=1; continue; fi
  med=$(echo "$ab" | sed -E 's/.*overhead median (-?[0-9.]+)%.*/\1/')
  mean=$(echo "$ab" | sed -E 's/.*mean (-?[0-9.]+)%$/\1/')
  verdict=$(awk -v m="$med" 'BEGIN{print (m <= 3.0) ? "<= 3% in this run" : "> 3% in this run"}')
  echo "$mode: overhead $med% (median step), $mean% (mean step): $verdict (target 3%; compare runs: one run can be off by 10% on a busy machine)"
  echo "  $ab"
  echo "  $hook; $tps tok/s over the whole run"
done
echo "(a shared 2-core machine: the sender thread and entropyd compete with the 2 training threads; load now: $(cut -d' ' -f1-3 /proc/loadavg))"
if [ -x "$BUILD/bench/bench_probe" ]; then
  "$BUILD/bench/bench_probe" 20 2
fi
exit $rc
