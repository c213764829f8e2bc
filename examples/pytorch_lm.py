#!/usr/bin/env python3
"""pytorch_lm.py -- a causal LM on nn.TransformerEncoder, watched by entropyd.

    python3 examples/pytorch_lm.py --daemon unix:entropyd-data/entropyd.sock --run lm-baseline
    python3 examples/pytorch_lm.py --daemon unix:entropyd-data/entropyd.sock --run lm-sigma --sigma-reparam

Post-LN, Adam at lr 0.2 without warmup or clipping (the recipe of the
README's unstable sigmatrain demo, at twice its learning rate: at 0.1 this
model's heads hover at the entropy_collapse threshold instead of crossing
it): the baseline's attention collapses within ten steps and
entropy_collapse fires 20 steps later; its --sigma-reparam twin (σReparam on
every linear layer, entropyd.torch.sigma_reparam) fires nothing.
Data: a synthetic corpus (copy / key-value recall episodes, which need
attention) or the bytes of --data FILE.  CPU is enough: 2 layers x 4 heads,
dim 64, 64 tokens, batch 8.

The entropyd part is five lines (marked "entropyd:"); the rest is an
ordinary PyTorch training loop.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import entropyd  # noqa: E402
import entropyd.torch  # noqa: E402


def synthetic_corpus(n, seed):
    """Tokens 0..63: copy episodes (COPY s.. SEP s.. EOS) and key-value recall
    (KV k v k v .. QRY k v EOS); the second halves need attention."""
    g = torch.Generator().manual_seed(seed)
    COPY, SEP, EOS, KV, QRY = 0, 1, 2, 3, 4
    out = []
    while len(out) < n:
        if torch.rand(1, generator=g).item() < 0.5:
            k = int(torch.randint(2, 8, (1,), generator=g))
            s = (torch.randint(0, 16, (k,), generator=g) + 16).tolist()
            out += [COPY] + s + [SEP] + s + [EOS]
        else:
            m = int(torch.randint(2, 5, (1,), generator=g))
            keys = (torch.randperm(8, generator=g)[:m] + 8).tolist()
            vals = (torch.randint(0, 16, (m,), generator=g) + 32).tolist()
            q = int(torch.randint(0, m, (1,), generator=g))
            ep = [KV]
            for a, b in zip(keys, vals):
                ep += [a, b]
            out += ep + [QRY, keys[q], vals[q], EOS]
    return torch.tensor(out[:n], dtype=torch.long), 64


class LM(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq_len, norm_first):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                           norm_first=norm_first)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, x):
        T = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(T, device=x.device))
        return self.head(self.blocks(h, mask=self.mask[:T, :T]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", default=None, help="unix:PATH or tcp:HOST:PORT (default $ENTROPYD_DAEMON)")
    ap.add_argument("--run", default=None, help="run name (default: generated)")
    ap.add_argument("--spool", default=None, help="spool directory (default: a private temporary one)")
    ap.add_argument("--data", default=None, help="train on the bytes of this text file (default: synthetic)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pre-ln", action="store_true", help="norm_first=True (default: post-LN)")
    ap.add_argument("--sigma-reparam", action="store_true", help="σReparam on every linear layer")
    ap.add_argument("--log-every", type=int, default=1,
                    help="probe every K steps (default 1: every step, so the alerts come as early as they can; "
                         "0: the watch's own 2%% budget chooses)")
    ap.add_argument("--examples", type=int, default=4, help="examples of the batch the probe reads")
    ap.add_argument("--on-alert", default="warn", choices=["warn", "checkpoint", "stop", "rollback"])
    ap.add_argument("--no-telemetry", action="store_true", help="train without entropyd (for timing)")
    ap.add_argument("--print-every", type=int, default=25)
    a = ap.parse_args(argv)

    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    if a.data:
        tokens = torch.tensor(list(open(a.data, "rb").read()), dtype=torch.long)
        vocab = 256
    else:
        tokens, vocab = synthetic_corpus(200_000, a.seed)
    model = LM(vocab, a.dim, a.heads, a.layers, a.seq_len, a.pre_ln)
    if a.sigma_reparam:
        entropyd.torch.sigma_reparam(model)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)

    run = watch = responder = None
    if not a.no_telemetry:
        run = entropyd.init(a.run, layers=a.layers, heads=a.heads, seq_len=a.seq_len,   # entropyd:
                            config=dict(vars(a), trainer="examples/pytorch_lm.py"),
                            daemon=a.daemon, spool_dir=a.spool)
        watch = entropyd.torch.watch(model, run, every=a.log_every or None, examples=a.examples)  # entropyd:
        responder = entropyd.torch.AlertResponder(model, opt, action=a.on_alert)
        print("pytorch_lm: run %s -> %s" % (run.name, a.daemon or os.environ.get("ENTROPYD_DAEMON", "default")),
              flush=True)

    B, T = a.batch, a.seq_len
    n_windows = (len(tokens) - 1) // T
    t_start = time.perf_counter()
    step_times = []
    status = "finished"
    for step in range(a.steps):
        t0 = time.perf_counter()
        idx = torch.randint(0, n_windows, (B,)) * T
        x = torch.stack([tokens[i:i + T] for i in idx])
        y = torch.stack([tokens[i + 1:i + T + 1] for i in idx])
        model.train()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if run is not None:
            watch.log(step, loss=loss, lr=a.lr)                                   # entropyd:
            if responder.action == "rollback" and step % 10 == 0:
                responder.snapshot(step)
            responder.handle(run.alerts(), step)
            if responder.should_stop:
                status = "aborted"
                break
        step_times.append(time.perf_counter() - t0)
        if step % a.print_every == 0 or step == a.steps - 1:
            lv = loss.item()
            print("step %4d/%d  loss %s" % (step, a.steps, "%.4f" % lv if math.isfinite(lv) else lv), flush=True)
    wall = time.perf_counter() - t_start
    st = sorted(step_times)
    print("pytorch_lm: %d steps in %.1f s, median step %.2f ms" % (len(step_times), wall, 1e3 * st[len(st) // 2]))
    if run is not None:
        s = run.stats()
        ok = run.finish(status)                                                    # entropyd:
        print("pytorch_lm: run %s %s; enqueued %d, dropped %d, acked %s" % (
            run.name, status, s["enqueued"], s["dropped_queue"], "all" if ok else "not all (spooled)"))
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
