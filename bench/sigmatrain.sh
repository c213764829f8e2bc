#!/usr/bin/env bash
# sigmatrain training benchmark (issues 4 and 21): tokens/s, GFLOP/s and the
# share of the OpenBLAS sgemm peak measured in the same run, at four widths,
# with the --reparam none, sigma and spectral arms interleaved (so that the
# load of a shared machine hits all three alike), and σReparam's share of the
# step: measured inside the step (power step, gradient through sigma) and end
# to end (sigma arm against the none arm).
#
# The sigma arm uses --gamma-init one: a step costs the same with either init,
# and the SVD of --gamma-init sigma takes longer than the steps at C = 768.
# Env: SIGMATRAIN (binary), CONFIGS (names to run, default all), REPS
# (default 1, best kept), STEPS_SCALE (multiplies every config's steps).
set -u
BIN=${SIGMATRAIN:-build/sigmatrain}
REPS=${REPS:-1}
SCALE=${STEPS_SCALE:-1}
CONFIGS=${CONFIGS:-"C128 C384 C768 deep"}
[ -x "$BIN" ] || { echo "sigmatrain: $BIN not built"; exit 1; }

declare -A CFG STEPS
CFG[C128]="--layers 4 --heads 4 --dim 128 --seq-len 128 --batch 16";  STEPS[C128]=20
CFG[C384]="--layers 6 --heads 6 --dim 384 --seq-len 256 --batch 8";   STEPS[C384]=6
CFG[C768]="--layers 8 --heads 12 --dim 768 --seq-len 256 --batch 4";  STEPS[C768]=4
CFG[deep]="--layers 24 --heads 4 --dim 128 --seq-len 128 --batch 16"; STEPS[deep]=8
ARMS="none sigma spectral"

# Shared 2-core machine: print the load so that a reader can judge the noise.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
peak_line=$("$BIN" --sgemm-peak --threads 2)
peak=$(echo "$peak_line" | awk '{print $2}')
echo "openblas sgemm peak (1024^3, core $(echo "$peak_line" | awk '{print $6}')): $peak GFLOP/s, the better of: ${peak_line#*(}" | sed 's/)$//'

declare -A tps gf rp
for name in $CONFIGS; do
  [ -n "${CFG[$name]:-}" ] || { echo "unknown config $name"; exit 1; }
  steps=$((STEPS[$name] * SCALE))
  for rep in $(seq "$REPS"); do
    for arm in $ARMS; do # interleaved
      line=$("$BIN" ${CFG[$name]} --optimizer adamw --threads 2 --steps "$steps" --eval-every 0 \
             --eval-batches 1 --print-every "$steps" --reparam "$arm" --gamma-init one | grep '^summary:')
      [ -n "$line" ] || { echo "sigmatrain $name --reparam $arm failed"; exit 1; }
      t=$(echo "$line" | sed -E 's/.*\| ([0-9]+) tok\/s.*/\1/')
      g=$(echo "$line" | sed -E 's/.* ([0-9.]+) GFLOP\/s.*/\1/')
      r=$(echo "$line" | sed -E 's/.*sreparam ([0-9.]+)% of step time.*/\1/')
      k="$name/$arm"
      if [ -z "${tps[$k]:-}" ] || [ "$t" -gt "${tps[$k]}" ]; then tps[$k]=$t; gf[$k]=$g; rp[$k]=$r; fi
    done
  done
done

# A second peak after the runs: the load may have changed meanwhile; the
# shares use the higher of the two (the conservative choice).
peak2=$("$BIN" --sgemm-peak --threads 2 | awk '{print $2}')
peak=$(awk -v a="$peak" -v b="$peak2" 'BEGIN{print (a > b ? a : b)}')
echo "openblas sgemm peak after the runs: $peak2 GFLOP/s; shares below use $peak"
printf '%-6s %-9s %-44s %9s %8s %8s %10s %10s\n' config arm flags tok/s GFLOP/s "% peak" "σR in-step" "σR e2e"
for name in $CONFIGS; do
  for arm in $ARMS; do
    k="$name/$arm"
    e2e="-"
    [ "$arm" != none ] && e2e=$(awk -v a="${tps[$name/none]}" -v b="${tps[$k]}" 'BEGIN{printf "%.1f%%", 100*(1-b/a)}')
    inst="-"
    [ "$arm" != none ] && inst="${rp[$k]}%"
    printf '%-6s %-9s %-44s %9s %8s %7s%% %10s %10s\n' "$name" "$arm" "${CFG[$name]}" "${tps[$k]}" "${gf[$k]}" \
      "$(awk -v g="${gf[$k]}" -v p="$peak" 'BEGIN{printf "%.0f", 100*g/p}')" "$inst" "$e2e"
  done
done
echo "(σR in-step: power steps and the gradient through sigma timed inside the step; σR e2e: 1 - tok/s(arm) / tok/s(none), noisy on a shared machine; ${REPS} run(s) per arm, best kept)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
