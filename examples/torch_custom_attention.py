#!/usr/bin/env python3
"""torch_custom_attention.py -- a nanoGPT-style causal LM whose attention
(F.scaled_dot_product_attention-like, written out) reports itself to
entropyd with watch.record.

    /usr/bin/python3 examples/torch_custom_attention.py --daemon unix:entropyd-data/entropyd.sock --steps 200

Fused attention never exposes its probabilities, so the layer hands the
watch its q and k (and, for sigma_qk, entropy_bound and eig_*, its input
and the q/k slices of its fused c_attn weight); the watch computes the
metrics on probed steps only, within its budget (docs/pytorch.md).  Data:
random tokens with a copy structure (the second half of each window repeats
the first), which attention learns within a few hundred steps.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import entropyd  # noqa: E402
import entropyd.torch  # noqa: E402


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.watch = None            # set to the entropyd watch after watch() is made

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.watch is not None:   # entropyd: q, k as the attention sees them; cheap when not probed
            w, b = self.c_attn.weight, self.c_attn.bias
            self.watch.record(self, q, k, x=x, is_causal=True, w_q=w[:C], w_k=w[C:2 * C], b_q=b[:C], b_k=b[C:2 * C])
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq_len):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def attach(self, watch):
        """Hands every attention layer the watch (in layer order)."""
        for b in self.blocks:
            b.attn.watch = watch

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def copy_batch(B, T, vocab, g):
    """Windows whose second half repeats the first: y is x shifted by one."""
    half = torch.randint(0, vocab, (B, (T + 2) // 2), generator=g)
    seq = torch.cat([half, half], 1)[:, :T + 1]
    return seq[:, :T], seq[:, 1:]


def args_parser(doc):
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--daemon", default=None, help="unix:PATH or tcp:HOST:PORT (default $ENTROPYD_DAEMON)")
    ap.add_argument("--run", default=None, help="run name (default: generated)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--every", type=int, default=0, help="probe every K steps (default 0: the 2%% budget)")
    ap.add_argument("--seed", type=int, default=1)
    return ap


def main(argv=None):
    a = args_parser(__doc__).parse_args(argv)
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed)
    model = GPT(a.vocab, a.dim, a.heads, a.layers, a.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    run = entropyd.init(a.run, layers=a.layers, heads=a.heads, seq_len=a.seq_len,             # entropyd:
                        config=dict(vars(a), trainer="examples/torch_custom_attention.py"), daemon=a.daemon)
    watch = entropyd.torch.watch(model, run, every=a.every or None)                          # entropyd:
    model.attach(watch)                                                                        # entropyd:
    for step in range(a.steps):
        x, y = copy_batch(a.batch, a.seq_len, a.vocab, g)
        model.train()
        loss = F.cross_entropy(model(x).reshape(-1, a.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        watch.log(step, loss=loss)                                                             # entropyd:
    print("torch_custom_attention: run %s, %d steps, %d probed (interval %d, %d examples), last loss %.3f"
          % (run.name, a.steps, watch.probes, watch.interval, watch.examples, loss.item()), flush=True)
    return 0 if run.finish("finished") else 1                                                  # entropyd:


if __name__ == "__main__":
    sys.exit(main())
