#!/usr/bin/env bash
# sigmatrain training benchmark: tokens/s, GFLOP/s, the
# share of the OpenBLAS sgemm ceiling and σReparam's share of the step, at
# four widths, with the --reparam none, sigma and spectral arms interleaved
# (so that the load of a shared machine hits all three alike), each target
# of docs/benchmarks.md printed beside its figure.
#
# The figures come from build/bench/bench_step, which runs the trainer's
# step (forward with its power steps, zero_grad, backward with the gradient
# reduction, norm, AdamW) and measures the ceiling (2 concurrent
# single-threaded 1024^3 sgemm calls) before every step and after the last:
# each step's share is over the ceiling measured around it.  Medians over
# the steps, then over REPS runs of each arm.  "cpu share" divides by CPU
# seconds instead of wall seconds (the process's for the step, each sgemm
# thread's for the ceiling): waiting for a core moves it much less.
# σReparam in-step: power steps and the gradient through sigma, timed inside
# the step; e2e: 1 - tok/s(arm) / tok/s(none), noisy on a shared machine.
#
# Env: BENCH_STEP (binary), CONFIGS (names, default all), ARMS (default
# "none sigma spectral"), REPS (default 3), STEPS_SCALE (multiplies the
# steps per run).  E2E=1 also runs the sigmatrain binary itself per arm
# (its summary line, the ceiling before and after all runs; BASELINE=older
# sigmatrain binary interleaves its runs as rows marked "base").
set -u
BIN=${SIGMATRAIN:-build/sigmatrain}
STEP=${BENCH_STEP:-${BUILD:-build}/bench/bench_step}
REPS=${REPS:-3}
SCALE=${STEPS_SCALE:-1}
CONFIGS=${CONFIGS:-"C128 C384 C768 deep"}
ARMS=${ARMS:-"none sigma spectral"}
[ -x "$STEP" ] || { echo "sigmatrain: $STEP not built"; exit 1; }

declare -A SHAPE NSTEP BAR
SHAPE[C128]="4 4 128 128 16"; NSTEP[C128]=10; BAR[C128]="-"
SHAPE[C384]="6 6 384 256 8";  NSTEP[C384]=4;  BAR[C384]=75
SHAPE[C768]="8 12 768 256 4"; NSTEP[C768]=3;  BAR[C768]=80
SHAPE[deep]="24 4 128 128 16"; NSTEP[deep]=4; BAR[deep]="-"

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{if(NR==0)print "-"; else if(NR%2)print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
field() { echo "$1" | sed -E "s#.*$2.*#\1#"; }

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A R LOADS
for name in $CONFIGS; do
  [ -n "${SHAPE[$name]:-}" ] || { echo "unknown config $name"; exit 1; }
  LOADS[$name]="$(cut -d' ' -f1 /proc/loadavg)"
  for rep in $(seq "$REPS"); do
    for arm in $ARMS; do # interleaved
      line=$("$STEP" ${SHAPE[$name]} "$arm" $((NSTEP[$name] * SCALE)) 2 | grep '^step:')
      [ -n "$line" ] || { echo "bench_step $name $arm failed"; exit 1; }
      k="$name/$arm"
      R[$k/tps]+=" $(field "$line" '\| ([0-9]+) tok/s')"
      R[$k/gf]+=" $(field "$line" '\| ([0-9.]+) GFLOP/s')"
      R[$k/peak]+=" $(field "$line" 'peak ([0-9.]+) GFLOP/s')"
      R[$k/share]+=" $(field "$line" '\| share ([0-9.]+)%')"
      R[$k/cshare]+=" $(field "$line" 'cpu share ([0-9.]+)%')"
      R[$k/rp]+=" $(field "$line" 'sreparam ([0-9.]+)%')"
      R[$k/util]+=" $(field "$line" 'cpu/wall ([0-9.]+)')"
      R[$k/phases]="$(echo "$line" | sed -E 's#.*cpu/wall [0-9.]+ \| ##')"
    done
  done
  LOADS[$name]+=" -> $(cut -d' ' -f1 /proc/loadavg)"
done

bar() { # value bar kind(min|max) -> "met"/"NOT met"/""
  [ "$2" = "-" ] && return
  awk -v v="$1" -v b="$2" -v k="$3" 'BEGIN{ok = k == "min" ? v >= b : v <= b; printf "%s %s %s%%", ok ? "met" : "NOT met:", k == "min" ? ">=" : "<=", b}'
}
printf '%-6s %-9s %8s %8s %8s %7s %-18s %7s %8s %-14s %7s %9s %s\n' config arm tok/s GFLOP/s peak share "bar" "cpu sh" "σR step" "bar" "σR e2e" cpu/wall load
for name in $CONFIGS; do
  for arm in $ARMS; do
    k="$name/$arm"
    tps=$(echo ${R[$k/tps]} | median); sh=$(echo ${R[$k/share]} | median); rp=$(echo ${R[$k/rp]} | median)
    e2e="-"; rbar=""; sbar=""
    if [ "$arm" != none ] && [ -n "${R[$name/none/tps]:-}" ]; then
      e2e=$(awk -v a="$(echo ${R[$name/none/tps]} | median)" -v b="$tps" 'BEGIN{printf "%.1f%%", 100*(1-b/a)}')
    fi
    [ "$arm" = sigma ] && rbar=$(bar "$rp" 3 max)
    rps="-"; [ "$arm" != none ] && rps="$rp%"
    sbar=$(bar "$sh" "${BAR[$name]}" min)
    printf '%-6s %-9s %8s %8s %8s %6s%% %-18s %6s%% %8s %-14s %7s %9s %s\n' "$name" "$arm" "$tps" \
      "$(echo ${R[$k/gf]} | median)" "$(echo ${R[$k/peak]} | median)" "$sh" "${sbar:--}" \
      "$(echo ${R[$k/cshare]} | median)" "$rps" "${rbar:--}" "$e2e" "$(echo ${R[$k/util]} | median)" "${LOADS[$name]}"
  done
done
echo "  (medians of $REPS run(s) per arm; shapes L H C T B: C128 ${SHAPE[C128]}, C384 ${SHAPE[C384]}, C768 ${SHAPE[C768]}, deep ${SHAPE[deep]}; C128 and deep: the target is no regression, see docs/trainer.md for the last figures)"
echo "  where the step goes (last run of each config's sigma arm, % of step wall time):"
for name in $CONFIGS; do
  [ -n "${R[$name/sigma/phases]:-}" ] && echo "    $name: ${R[$name/sigma/phases]}"
done
tps_none=$(echo ${R[C128/none/tps]:-} | median); tps_sigma=$(echo ${R[C128/sigma/tps]:-} | median)

if [ "${E2E:-0}" = 1 ]; then
[ -x "$BIN" ] || { echo "sigmatrain: $BIN not built"; exit 1; }
echo "end to end (the sigmatrain binary's summary line):"
declare -A CFG STEPS
CFG[C128]="--layers 4 --heads 4 --dim 128 --seq-len 128 --batch 16";  STEPS[C128]=20
CFG[C384]="--layers 6 --heads 6 --dim 384 --seq-len 256 --batch 8";   STEPS[C384]=6
CFG[C768]="--layers 8 --heads 12 --dim 768 --seq-len 256 --batch 4";  STEPS[C768]=4
CFG[deep]="--layers 24 --heads 4 --dim 128 --seq-len 128 --batch 16"; STEPS[deep]=8
BINS="new"
[ -n "${BASELINE:-}" ] && BINS="base new"
declare -A BINARY=([new]="$BIN" [base]="${BASELINE:-}")

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
    for arm in $ARMS; do for tag in $BINS; do # interleaved
      line=$("${BINARY[$tag]}" ${CFG[$name]} --optimizer adamw --threads 2 --steps "$steps" --eval-every 0 \
             --eval-batches 1 --print-every "$steps" --reparam "$arm" --gamma-init one | grep '^summary:')
      [ -n "$line" ] || { echo "sigmatrain $name --reparam $arm failed"; exit 1; }
      t=$(echo "$line" | sed -E 's/.*\| ([0-9]+) tok\/s.*/\1/')
      g=$(echo "$line" | sed -E 's/.* ([0-9.]+) GFLOP\/s.*/\1/')
      r=$(echo "$line" | sed -E 's/.*sreparam ([0-9.]+)% of step time.*/\1/')
      k="$name/$arm/$tag"
      if [ -z "${tps[$k]:-}" ] || [ "$t" -gt "${tps[$k]}" ]; then tps[$k]=$t; gf[$k]=$g; rp[$k]=$r; fi
    done; done
  done
done

# A second peak after the runs: the load may have changed meanwhile; the
# shares use the higher of the two (the conservative choice).
peak2=$("$BIN" --sgemm-peak --threads 2 | awk '{print $2}')
peak=$(awk -v a="$peak" -v b="$peak2" 'BEGIN{print (a > b ? a : b)}')
echo "openblas sgemm peak after the runs: $peak2 GFLOP/s; shares below use $peak"
printf '%-6s %-9s %-5s %-44s %9s %8s %8s %10s %10s\n' config arm build flags tok/s GFLOP/s "% peak" "σR in-step" "σR e2e"
for name in $CONFIGS; do
  for arm in $ARMS; do for tag in $BINS; do
    k="$name/$arm/$tag"
    e2e="-"
    [ "$arm" != none ] && [ -n "${tps[$name/none/$tag]:-}" ] &&
      e2e=$(awk -v a="${tps[$name/none/$tag]}" -v b="${tps[$k]}" 'BEGIN{printf "%.1f%%", 100*(1-b/a)}')
    inst="-"
    [ "$arm" != none ] && inst="${rp[$k]}%"
    printf '%-6s %-9s %-5s %-44s %9s %8s %7s%% %10s %10s\n' "$name" "$arm" "$tag" "${CFG[$name]}" "${tps[$k]}" "${gf[$k]}" \
      "$(awk -v g="${gf[$k]}" -v p="$peak" 'BEGIN{printf "%.0f", 100*g/p}')" "$inst" "$e2e"
  done; done
done
echo "  (σR in-step: power steps and the gradient through sigma timed inside the step; σR e2e: 1 - tok/s(arm) / tok/s(none), noisy on a shared machine; ${REPS} run(s) per arm, best kept)"
fi

# PyTorch on the C = 128 model (the comparison the first benchmark made), when /usr/bin/python3 has
# torch (the deps never install it).
if [ -n "${tps_none}" ] && /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  core=$("$BIN" --sgemm-peak --threads 1 | awk '{print $6}')
  py=$(mktemp --suffix=.py)
  trap 'rm -f "$py"' EXIT
  cat > "$py" <<'PY'
import sys, time, math
import torch, torch.nn as nn, torch.nn.functional as F
L, H, C, T, B, V = 4, 4, 128, 128, 16, 64
steps = int(sys.argv[1])
torch.set_num_threads(2)
torch.manual_seed(0)
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1 = nn.LayerNorm(C); s.qkv = nn.Linear(C, 3 * C); s.proj = nn.Linear(C, C)
        s.ln2 = nn.LayerNorm(C); s.fc = nn.Linear(C, 4 * C); s.fcproj = nn.Linear(4 * C, C)
        s.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
    def forward(s, x):
        b, t, _ = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(s.mask[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
        x = x + s.proj((att @ v).transpose(1, 2).contiguous().view(b, t, C))
        return x + s.fcproj(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))
class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte = nn.Embedding(V, C); s.wpe = nn.Embedding(T, C)
        s.blocks = nn.ModuleList([Block() for _ in range(L)])
        s.lnf = nn.LayerNorm(C); s.head = nn.Linear(C, V, bias=False)
    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for blk in s.blocks: x = blk(x)
        return F.cross_entropy(s.head(s.lnf(x)).reshape(-1, V), tgt.reshape(-1))
m = GPT()
opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
data = torch.randint(0, V, (B, T + 1))
def step():
    loss = m(data[:, :-1], data[:, 1:]); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
for _ in range(3): step()
t0 = time.time()
for _ in range(steps): step()
print("%.0f %s" % (steps * B * T / (time.time() - t0), torch.__version__))
PY
  # As shipped (Debian's torch calls OpenBLAS, which misdetects this CPU),
  # and with the same OPENBLAS_CORETYPE sigmatrain selects for itself.
  best=0
  for ct in "" "$core"; do
    out=$(env ${ct:+OPENBLAS_CORETYPE=$ct} OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 /usr/bin/python3 "$py" 20)
    t=${out%% *}
    [[ $t =~ ^[0-9]+$ ]] || { echo "  pytorch run failed"; continue; }
    echo "  pytorch ${out#* } (OMP_WAIT_POLICY=PASSIVE, 2 threads${ct:+, OPENBLAS_CORETYPE=$ct}): $t tokens/s"
    [ "$t" -gt "$best" ] && best=$t
  done
  echo "pytorch best: $best tokens/s"
  [ "$best" -gt 0 ] && echo "ratio sigmatrain/pytorch: none $(awk -v a="$tps_none" -v b="$best" 'BEGIN{printf "%.2f", a/b}')x, sigma $(awk -v a="$tps_sigma" -v b="$best" 'BEGIN{printf "%.2f", a/b}')x (target >= 1.5x)"
elif [ -n "${tps_none}" ]; then
  echo "pytorch: not installed for /usr/bin/python3 (apt-get install python3-torch); ratio skipped"
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
