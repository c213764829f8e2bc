#!/usr/bin/env bash
# Data-parallel sigmatrain on MPI: scaling from 1 to 2 ranks on
# this machine, 1 thread per rank, same global batch (L=4 H=4 C=128 T=128,
# batch 16, AdamW, σReparam: bench/sigmatrain.sh's model), and the share of
# step time spent in the gradient all-reduce, split into waiting for the
# other rank and the all-reduce itself (SIGMATRAIN_DIST_SPLIT_WAIT puts a
# barrier before each all-reduce and times the two apart).
#   efficiency = tokens/s(2 ranks) / (2 x tokens/s(1 rank))
# Variants: the whole gradient in one MPI_Allreduce (default) or in 256 KiB
# buckets (MPI_Iallreduce, all in flight); shared-memory transfers with
# vader's single-copy (CMA, the default) or without it
# (OMPI_MCA_btl_vader_single_copy_mechanism=none, needed where ptrace is not
# allowed).  Reference: one process with --threads 2 (in-process data
# parallelism on the same 2 cores).
# Env: BUILD (default build), STEPS (default 30), REPS (default 2, best kept).
set -u
BUILD=${BUILD:-build}
ONE=${SIGMATRAIN:-$BUILD/sigmatrain}
MPIBIN=$(dirname "$ONE")/sigmatrain-mpi
STEPS=${STEPS:-30}
REPS=${REPS:-2}
CFG=(--layers 4 --heads 4 --dim 128 --seq-len 128 --batch 16 --optimizer adamw --reparam sigma
     --steps "$STEPS" --eval-every 0 --eval-batches 1 --print-every "$STEPS")
if [ ! -x "$MPIBIN" ] || ! command -v mpirun >/dev/null; then
  echo "mpi: $MPIBIN or mpirun missing (make deps, then make)"; exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) (2 cores shared with other work: figures are noisy)"

tps_of() { sed -nE 's/^summary:.*\| ([0-9]+) tok\/s.*/\1/p'; }
declare -A best line cpu
# CPU seconds (user + sys) of a command and its children, on stderr's last line
TIMEFORMAT='cpu %U %S'
keep() { # name full-output (its last line: cpu U S)
  local t c
  t=$(echo "$2" | tps_of)
  c=$(echo "$2" | sed -nE 's/^cpu ([0-9.]+) ([0-9.]+)$/\1 \2/p' | awk '{print $1 + $2}')
  if [ -z "${best[$1]:-}" ] || [ "$t" -gt "${best[$1]}" ]; then best[$1]=$t; line[$1]=$2; fi
  if [ -z "${cpu[$1]:-}" ] || awk -v a="$c" -v b="${cpu[$1]}" 'BEGIN{exit !(a < b)}'; then cpu[$1]=$c; fi
}
for rep in $(seq "$REPS"); do  # interleaved so that machine noise hits every variant
  out=$( { time "$ONE" "${CFG[@]}" --threads 1 2>&1; } 2>&1); keep one1 "$out"
  out=$( { time "$ONE" "${CFG[@]}" --threads 2 2>&1; } 2>&1); keep one2 "$out"
  out=$( { time SIGMATRAIN_DIST_SPLIT_WAIT=1 mpirun --oversubscribe -np 2 "$MPIBIN" "${CFG[@]}" --threads 1 2>&1; } 2>&1)
  keep mpi "$out"
  out=$( { time SIGMATRAIN_DIST_SPLIT_WAIT=1 mpirun --oversubscribe -np 2 "$MPIBIN" "${CFG[@]}" --threads 1 \
           --dist-bucket-kb 256 2>&1; } 2>&1)
  keep bucket "$out"
  out=$( { time OMPI_MCA_btl_vader_single_copy_mechanism=none SIGMATRAIN_DIST_SPLIT_WAIT=1 \
           mpirun --oversubscribe -np 2 "$MPIBIN" "${CFG[@]}" --threads 1 2>&1; } 2>&1)
  keep nocma "$out"
  echo "  rep $rep: 1 rank ${best[one1]} | 2 ranks ${best[mpi]} | buckets ${best[bucket]} | no CMA ${best[nocma]} | 1 process 2 threads ${best[one2]} tok/s (best so far)"
done

report() { # name label
  local o=${line[$1]} t=${best[$1]}
  local comm share wait ar
  comm=$(echo "$o" | sed -nE 's/^dist: gradient all-reduce ([0-9.]+) ms\/step.*/\1/p')
  share=$(echo "$o" | sed -nE 's/^dist: gradient all-reduce .*, ([0-9.]+)% of training time.*/\1/p')
  wait=$(echo "$o" | sed -nE 's/^dist: split timing: waiting for the other ranks ([0-9.]+) ms.*/\1/p')
  ar=$(echo "$o" | sed -nE 's/.*all-reduce itself ([0-9.]+) ms.*/\1/p')
  printf "%-44s %6d tok/s  efficiency %5.1f%%  communicating %s%% of step time (%s ms/step: waiting for the other rank %s, all-reduce %s)\n" \
    "$2" "$t" "$(awk -v a="$t" -v b="${best[one1]}" 'BEGIN{print 100*a/(2*b)}')" "$share" "$comm" "$wait" "$ar"
}
printf "%-44s %6d tok/s\n" "1 rank (build/sigmatrain --threads 1)" "${best[one1]}"
report mpi "2 ranks, one MPI_Allreduce, CMA"
report bucket "2 ranks, 256 KiB buckets (Iallreduce), CMA"
report nocma "2 ranks, one MPI_Allreduce, no single-copy"
printf "%-44s %6d tok/s  (in-process threads, for reference: %.1f%% of 2 x 1 rank)\n" \
  "1 process --threads 2" "${best[one2]}" "$(awk -v a="${best[one2]}" -v b="${best[one1]}" 'BEGIN{print 100*a/(2*b)}')"
echo "CPU seconds (user + sys, whole run incl. start-up; least of the reps): 1 rank ${cpu[one1]}, 2 ranks ${cpu[mpi]}" \
     "(buckets ${cpu[bucket]}, no CMA ${cpu[nocma]}), 1 process 2 threads ${cpu[one2]}:" \
     "CPU efficiency of 2 ranks $(awk -v a="${cpu[one1]}" -v b="${cpu[mpi]}" 'BEGIN{printf "%.1f", 100*a/b}')% (what a machine with 2 idle cores could reach at best)"
echo "gradient: $(echo "${line[mpi]}" | sed -nE 's/.*\(([0-9]+) calls, ([0-9]+) floats each\).*/\2 floats/p') ($(echo "${line[mpi]}" | sed -nE 's/.*calls, ([0-9]+) floats each.*/\1/p' | awk '{printf "%.1f MB", $1*4/1e6}')) per step; best of $REPS runs of $STEPS steps"
# Would overlapping the all-reduce with the backward pay?  bench/mpi/overlap.c
# (MPI, so built here with mpicc rather than by the Makefile's bench rule).
mkdir -p "$BUILD/mpi"
if mpicc -std=c11 -O2 -Wall -Wextra -Werror bench/mpi/overlap.c -o "$BUILD/mpi/overlap"; then
  mpirun --oversubscribe -np 2 "$BUILD/mpi/overlap" \
    "$(echo "${line[mpi]}" | sed -nE 's/.*calls, ([0-9]+) floats each.*/\1/p')" 15 2>&1 | grep '^overlap:'
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
