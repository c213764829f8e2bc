#!/usr/bin/env python3
"""Cost to the training loop of one entropyd Python run.log (issue 17's
bar: <= 50 us for a 12x12 step with 9 head metrics), against baselines
measured in the same run:
  - json.dumps of the same step: what a stdlib client pays only to format
    the line (before any socket write, on the training thread, under the GIL);
  - the C library's own enqueue (bench/bench_telemetry's number is separate).
The daemon is a real entropyd when ENTROPYD_SOCK is set (else spool only:
the training-thread cost is the same, the sender thread works the same)."""
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import numpy as np  # noqa: E402

import entropyd  # noqa: E402

L, H = 12, 12
HEADS = ["entropy", "entropy_norm", "max_logit", "sigma_qk", "entropy_bound", "eig_mean", "eig_var",
         "attn_sink", "head_extra"]
LAYERS = ["rank_ratio", "cos_sim"]
N = int(os.environ.get("BENCH_STEPS", 20000))
GAP_US = float(os.environ.get("BENCH_GAP_US", 200))  # stands in for the training step's compute


def busy(us):
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def measure(fn, n):
    """Wall time per call (p50, p99) and the training thread's CPU time per
    call (thread_time: what the call costs, without the time the thread
    waited for a core on a loaded machine), less the clock reads' own cost."""
    ts, cpu = [], 0
    t_empty = []
    for i in range(200):
        a = time.thread_time_ns()
        b = time.thread_time_ns()
        t_empty.append(b - a)
    empty = sorted(t_empty)[100]
    for i in range(n):
        c0 = time.thread_time_ns()
        t0 = time.perf_counter()
        fn(i)
        t1 = time.perf_counter()
        c1 = time.thread_time_ns()
        ts.append(t1 - t0)
        cpu += c1 - c0 - empty
        busy(GAP_US)
    ts.sort()
    return 1e6 * ts[len(ts) // 2], 1e6 * ts[int(len(ts) * 0.99)], cpu / 1e3 / n


def main():
    rng = np.random.default_rng(0)
    heads = {k: rng.random((L, H), dtype=np.float32) for k in HEADS}
    layers = {k: rng.random(L, dtype=np.float32) for k in LAYERS}
    stacked_h = np.stack([heads[k] for k in HEADS])
    stacked_l = np.stack([layers[k] for k in LAYERS])
    sock = os.environ.get("ENTROPYD_SOCK")
    spool = tempfile.mkdtemp(prefix="bench-python-")
    run = entropyd.init("bench-python-%d" % os.getpid(), layers=L, heads=H, seq_len=256,
                        daemon=("unix:" + sock) if sock else "", spool_dir=spool, queue_slots=4096)

    def log_numpy(i):
        run.log(i, scalars={"loss": 2.0, "lr": 1e-3, "grad_norm": 0.5}, layers=layers, heads=heads)

    def log_stacked(i):
        run.log_stacked(N + i, scalars={"loss": 2.0, "lr": 1e-3, "grad_norm": 0.5}, layer_names=LAYERS,
                        layer_values=stacked_l, head_names=HEADS, head_values=stacked_h)

    def json_baseline(i):
        json.dumps({"type": "step", "seq": i, "step": i, "time": time.time(),
                    "scalars": {"loss": 2.0, "lr": 1e-3, "grad_norm": 0.5},
                    "layers": {k: v.tolist() for k, v in layers.items()},
                    "heads": {k: v.tolist() for k, v in heads.items()}})

    res = [("run.log (numpy arrays)", measure(log_numpy, N)),
           ("run.log_stacked (one (9,12,12) array)", measure(log_stacked, N))]
    try:
        import torch
        th = {k: torch.from_numpy(v) for k, v in heads.items()}
        tl = {k: torch.from_numpy(v) for k, v in layers.items()}

        def log_torch(i):
            run.log(2 * N + i, scalars={"loss": 2.0, "lr": 1e-3, "grad_norm": 0.5}, layers=tl, heads=th)
        res.append(("run.log (CPU torch tensors)", measure(log_torch, N // 4)))
    except ImportError:
        pass
    res.append(("baseline: json.dumps of the same step (stdlib client, format only)", measure(json_baseline, N // 4)))
    st = run.stats()
    ok = run.finish("finished", grace=30, quiet=True)
    print("python run.log, %dx%d, %d head + %d layer metrics + 3 scalars, %d steps, %s, gap %.0f us (load %s)"
          % (L, H, len(HEADS), len(LAYERS), N, "entropyd" if sock else "spool only", GAP_US,
             open("/proc/loadavg").read().split()[0]))
    for name, (p50, p99, mean) in res:
        print("  %-66s wall p50 %6.1f us  p99 %7.1f us | thread CPU %6.1f us/call" % (name, p50, p99, mean))
    print("  dropped (queue full) %d of %d; %s" % (st["dropped_queue"], st["enqueued"] + st["dropped_queue"],
                                                    "all acknowledged" if ok else "not all acknowledged"))
    target = res[0][1][2]
    print("  target: run.log <= 50 us of training-thread CPU per step: %s (%.1f us; wall p50 %.1f us at this load)"
          % ("met" if target <= 50 else "NOT met", target, res[0][1][0]))
    return 0 if target <= 50 else 1


if __name__ == "__main__":
    sys.exit(main())
