#!/usr/bin/env python3
"""The PyTorch probe's cost to the training step (the target: the
default entropyd.torch.watch within 2% of no watch), interleaved in one
process: a pre-LN nn.TransformerEncoder LM (AdamW, batch 16, seq 128,
causal mask) alternates steps with the default watch (budget 2%,
watch.log every step: scalars, and the probe when the watch chooses) and
steps with no watch at all (the hooks removed, no log), W N N W W N N W
..., so that the load of a shared machine, which drifts over seconds, is
the same for both kinds; a block of such steps gives the ratio of the
two kinds' mean step times, and the figure is the median of the blocks'
ratios with their quartiles.  Printed for wall time (the bar) and the process's CPU time (all
threads: the client's sender included, and OpenBLAS's spinning pool), and
the training thread's own CPU time (with one thread, torch's and
OpenBLAS's, every op of the step and the probe runs on it: the figure a
loaded machine disturbs least); also what the watch says it spent (watch.cost over the watched
blocks' time), its interval and examples.
Configs "d_model x layers x heads": 128x4x4 and 256x6x8, each with one
intra-op thread and with every core.  The watch's steps are numbered
consecutively (one run), and the time of the unwatched step between two
of them is taken out of what the watch measures as its step, so its
schedule sees only watched steps.  Env: TORCH_BENCH_CONFIGS (default "128x4x4,256x6x8"),
TORCH_BENCH_THREADS ("1,all": torch's threads and OpenBLAS's pool alike),
TORCH_BENCH_PAIRS (4: the blocks; each of TORCH_BENCH_BLOCK watched steps,
default 12 and at least 3 probe intervals, and as many unwatched), ENTROPYD_SOCK (a daemon; else spool only)."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import entropyd  # noqa: E402
import entropyd.torch as et  # noqa: E402

B, T, V = 16, 128, 256


def quart(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def hook(w, model):
    for m in model.modules():
        if isinstance(m, nn.MultiheadAttention):
            m.forward = w._mha_forward(m, m.forward)
            m._entropyd_watch = w


def blas_threads(n):
    """OpenBLAS's pool size (torch.set_num_threads leaves it alone: Debian's
    torch calls the system BLAS, OpenBLAS with one thread per core), so "one
    thread" is one core for the step's gemms too.  Returns the old size."""
    ot = et._OneThread()
    if ot._blas_set is None:
        return None
    old = ot._blas_get()
    ot._blas_set(n)
    return old


def bench(C, L, H, threads, pairs, block, sock):
    torch.set_num_threads(threads)
    blas_threads(threads)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(C, H, 4 * C, dropout=0.0, batch_first=True, norm_first=True)
    model = nn.ModuleDict(dict(tok=nn.Embedding(V, C), pos=nn.Embedding(T, C),
                               enc=nn.TransformerEncoder(layer, L, enable_nested_tensor=False), head=nn.Linear(C, V)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    mask = nn.Transformer.generate_square_subsequent_mask(T)
    g = torch.Generator().manual_seed(1)
    pos = torch.arange(T)

    def step():
        x = torch.randint(0, V, (B, T + 1), generator=g)
        h = model["tok"](x[:, :T]) + model["pos"](pos)
        out = model["head"](model["enc"](h, mask=mask))
        loss = F.cross_entropy(out.reshape(-1, V), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    name = "bench-torch-%dx%dx%d-t%d" % (C, L, H, threads)
    run = entropyd.init(name, layers=L, heads=H, seq_len=T, daemon=("unix:" + sock) if sock else "")
    w = et.watch(model, run)                       # the default watch
    w.remove()
    ws = 0                                         # the watch's steps, consecutive

    def one_step(watched):
        """One training step, watched (hooks on, log) or not; returns its
        (wall, process cpu, this thread's cpu) seconds."""
        nonlocal ws
        if watched:
            hook(w, model)
        t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
        loss = step()
        if watched:
            w.log(ws, loss=loss)
            ws += 1
        else:
            float(loss)                            # what a loop prints or checks anyway
        out = (time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - m0)
        if watched:
            w.remove()
        else:
            # the watch times the step from one log() to the next: the
            # unwatched step between two of its steps is not its step
            if w._t_log is not None:
                w._t_log += out[0]
        return out

    def block_of():
        """`block` watched and `block` unwatched steps, alternating (the
        order flips each step): a ratio of their mean times."""
        acc = {True: [0.0, 0.0, 0.0], False: [0.0, 0.0, 0.0]}
        for i in range(2 * block):
            watched = (i % 4) in (0, 3)            # W N N W W N N W ...: each kind first half the time
            for k, v in enumerate(one_step(watched)):
                acc[watched][k] += v
        return [acc[True][k] / acc[False][k] - 1 for k in range(3)], acc[True][0], acc[False][0] / block

    for _ in range(3):                             # warm-up: the allocator, the watch's first probes
        one_step(True)
        one_step(False)
    # A block must hold several probe intervals: in a block shorter than
    # the interval, some hold a probe and some none, and the median of the
    # blocks' ratios is the cost of a block with a probe, not the mean cost.
    block = max(block, 3 * w.interval)
    cost0, probes0 = w.cost, w.probes
    wall, cpu, main, watched_time = [], [], [], 0.0
    for p in range(pairs):
        r, wt, base = block_of()
        watched_time += wt
        wall.append(r[0])
        cpu.append(r[1])
        main.append(r[2])
        base_ms = base * 1e3
    run.finish("finished", grace=10, quiet=True)
    lo, md, hi = quart(wall)
    clo, cmd, chi = quart(cpu)
    mlo, mmd, mhi = quart(main)
    print("  %3dx%dx%d, %s thread%s: step %.0f ms; watch vs none: wall %+.2f%% (quartiles %+.2f .. %+.2f%%), "
          "cpu %+.2f%% (%+.2f .. %+.2f%%), the training thread's cpu %+.2f%% (%+.2f .. %+.2f%%); the watch's own count %.2f%% (%d probes in %d steps, interval %d, "
          "%d examples, blocks of %d; load %s)" % (C, L, H, threads, "" if threads == 1 else "s", base_ms, 100 * md, 100 * lo,
                                      100 * hi, 100 * cmd, 100 * clo, 100 * chi, 100 * mmd, 100 * mlo, 100 * mhi,
                                      100 * (w.cost - cost0) / watched_time,
                                      w.probes - probes0, pairs * block, w.interval, w.examples, block,
                                      open("/proc/loadavg").read().split()[0]), flush=True)
    return md, hi - lo


def probe_alone(C, H, n=4, reps=15):
    """One layer's probe on n examples (the default 4), the thread's CPU time
    per call (median): the budgeted path against exact=True's."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    d = C // H
    x = F.layer_norm(torch.randn(n, T, C) + torch.randn(C), (C,))
    w, b = torch.randn(3 * C, C) / C ** 0.5, torch.randn(3 * C) * 0.02
    q = (x @ w[:C].T + b[:C]).view(n, T, H, d).transpose(1, 2)
    k = (x @ w[C:2 * C].T + b[C:2 * C]).view(n, T, H, d).transpose(1, 2)
    out = {}
    for kind in ("budget", "exact", "budget", "exact"):
        st = {} if kind == "budget" else None
        ts = []
        for _ in range(reps):
            t0 = time.thread_time()
            with torch.no_grad():
                et._metrics(q, k, x, None, w[:C], w[C:2 * C], b[:C], b[C:2 * C], state=st, eig=True)
            ts.append(time.thread_time() - t0)
        out[kind] = min(out.get(kind, 1e9), statistics.median(ts[3:]))
    print("  probe alone, one layer, %dx%d heads, %d examples x %d tokens, one thread: %.2f ms budgeted, "
          "%.2f ms exact (CPU time, median)" % (C, H, n, T, 1e3 * out["budget"], 1e3 * out["exact"]), flush=True)


def main():
    configs = [tuple(int(v) for v in c.split("x")) for c in
               os.environ.get("TORCH_BENCH_CONFIGS", "128x4x4,256x6x8").split(",")]
    threads = [os.cpu_count() if t == "all" else int(t) for t in os.environ.get("TORCH_BENCH_THREADS", "1,all").split(",")]
    pairs = int(os.environ.get("TORCH_BENCH_PAIRS", 4))
    sock = os.environ.get("ENTROPYD_SOCK")
    print("torch probe A/B: nn.TransformerEncoder LM, batch %d, seq %d, %d blocks of interleaved steps, load %s" % (
        B, T, pairs, open("/proc/loadavg").read().split()[0]), flush=True)
    for C, L, H in configs:
        probe_alone(C, H)
    worst, spread = None, 0.0
    for C, L, H in configs:
        block = int(os.environ.get("TORCH_BENCH_BLOCK", 12))
        for t in threads:
            md, iqr = bench(C, L, H, t, pairs, block, sock)
            worst = md if worst is None else max(worst, md)
            spread = max(spread, iqr)
    # A median inside 2% means little when the pairs scatter over tens of
    # per cent (a loaded machine): then the figure is not settled either way.
    verdict = "met" if worst <= 0.02 else "NOT met"
    if spread > 0.08:
        verdict += " (not settled: interquartile range up to %.1f points; rerun quieter or with more pairs)" % (
            100 * spread)
    print("  bar: the default watch within 2%% of none (median of the blocks of interleaved steps): worst %+.2f%% -> %s"
          % (100 * worst, verdict), flush=True)


if __name__ == "__main__":
    main()
