#!/usr/bin/env bash
# sigmatrain training benchmark (issue 4): tokens/s for L=4 H=4 C=128 T=128,
# batch 16, AdamW, 2 threads, with --reparam none and sigma; σReparam overhead;
# fraction of OpenBLAS sgemm peak measured in the same run; PyTorch on the same
# model in the same run when /usr/bin/python3 has torch (never installed here).
# Env: SIGMATRAIN (binary), STEPS (default 60), REPS (default 2, best kept).
set -u
BIN=${SIGMATRAIN:-build/sigmatrain}
STEPS=${STEPS:-60}
REPS=${REPS:-2}
CFG=(--layers 4 --heads 4 --dim 128 --seq-len 128 --batch 16 --optimizer adamw --threads 2
     --steps "$STEPS" --eval-every 0 --eval-batches 1 --print-every "$STEPS")
[ -x "$BIN" ] || { echo "sigmatrain: $BIN not built"; exit 1; }

# Shared 2-core machine: print the load so that a reader can judge the noise.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
peak_line=$("$BIN" --sgemm-peak --threads 2)
peak=$(echo "$peak_line" | awk '{print $2}')
core=$(echo "$peak_line" | awk '{print $6}')
echo "openblas sgemm peak (1024^3, core $core): $peak GFLOP/s, the better of: ${peak_line#*(}" | sed 's/)$//' 

declare -A tps gf rp
for rep in $(seq "$REPS"); do
  for mode in none sigma; do  # interleaved so that machine noise hits both
    line=$("$BIN" "${CFG[@]}" --reparam "$mode" | grep '^summary:')
    [ -n "$line" ] || { echo "sigmatrain --reparam $mode failed"; exit 1; }
    t=$(echo "$line" | sed -E 's/.*\| ([0-9]+) tok\/s.*/\1/')
    g=$(echo "$line" | sed -E 's/.* ([0-9.]+) GFLOP\/s.*/\1/')
    r=$(echo "$line" | sed -E 's/.*sreparam ([0-9.]+)% of step time.*/\1/')
    echo "  run $rep --reparam $mode: $t tok/s, $g GFLOP/s, sreparam $r% of step time"
    if [ -z "${tps[$mode]:-}" ] || [ "$t" -gt "${tps[$mode]}" ]; then
      tps[$mode]=$t; gf[$mode]=$g; rp[$mode]=$r
    fi
  done
done
echo "sigmatrain --reparam none : ${tps[none]} tokens/s (${gf[none]} GFLOP/s, $(awk -v g="${gf[none]}" -v p="$peak" 'BEGIN{printf "%.0f", 100*g/p}')% of sgemm peak)"
echo "sigmatrain --reparam sigma: ${tps[sigma]} tokens/s (${gf[sigma]} GFLOP/s, $(awk -v g="${gf[sigma]}" -v p="$peak" 'BEGIN{printf "%.0f", 100*g/p}')% of sgemm peak)"
echo "sigma overhead: $(awk -v a="${tps[none]}" -v b="${tps[sigma]}" 'BEGIN{printf "%.1f", 100*(a/b-1)}')% of step time end to end (best of $REPS; noisy on a shared machine), ${rp[sigma]}% measured inside the step (power iteration, W_hat, gradient through sigma)"

if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
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
  [ "$best" -gt 0 ] && echo "ratio sigmatrain/pytorch: none $(awk -v a="${tps[none]}" -v b="$best" 'BEGIN{printf "%.2f", a/b}')x, sigma $(awk -v a="${tps[sigma]}" -v b="$best" 'BEGIN{printf "%.2f", a/b}')x (target >= 1.5x)"
else
  echo "pytorch: not installed for /usr/bin/python3 (apt-get install python3-torch); ratio skipped"
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
