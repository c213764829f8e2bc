#!/usr/bin/env python3
"""torch_encoder.py -- a bidirectional nn.TransformerEncoder classifier on
padded sequences, watched by entropyd with no change to the model.

    /usr/bin/python3 examples/torch_encoder.py --daemon unix:entropyd-data/entropyd.sock --steps 300

entropyd.torch.watch hooks every nn.MultiheadAttention inside the encoder;
the probe honours the attention's masks (here src_key_padding_mask: padded
keys are never attended, so they count in no row's entropy) and, with no
causal mask, normalizes each row's entropy by the log of its unpadded keys.
Task: does the sequence contain token 0 (one attention hop from the
classification token)?  Validation forwards in eval mode are not probed.
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import entropyd  # noqa: E402
import entropyd.torch  # noqa: E402

PAD, CLS = 1, 2


class Classifier(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq_len):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq_len, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Linear(dim, 2)

    def forward(self, idx):
        T = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        h = self.encoder(h, src_key_padding_mask=idx == PAD)
        return self.out(h[:, 0])                   # the CLS position


def batch(B, T, vocab, g):
    lens = torch.randint(T // 2, T + 1, (B,), generator=g)
    idx = torch.randint(3, vocab, (B, T), generator=g)
    has = torch.rand(B, generator=g) < 0.5
    where = (torch.rand(B, generator=g) * (lens - 1).float()).long() + 1
    idx[has, where[has]] = 0
    idx[:, 0] = CLS
    idx[torch.arange(T).unsqueeze(0) >= lens.unsqueeze(1)] = PAD
    return idx, has.long()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", default=None, help="unix:PATH or tcp:HOST:PORT (default $ENTROPYD_DAEMON)")
    ap.add_argument("--run", default=None, help="run name (default: generated)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed)
    model = Classifier(a.vocab, a.dim, a.heads, a.layers, a.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    run = entropyd.init(a.run, layers=a.layers, heads=a.heads, seq_len=a.seq_len, daemon=a.daemon,   # entropyd:
                        config=dict(vars(a), trainer="examples/torch_encoder.py"))
    watch = entropyd.torch.watch(model, run)                                                          # entropyd:
    acc = float("nan")
    for step in range(a.steps):
        x, y = batch(a.batch, a.seq_len, a.vocab, g)
        model.train()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        scalars = {}
        if step % 50 == 49 or step == a.steps - 1:
            model.eval()                           # not probed: the training step's metrics stay
            with torch.no_grad():
                vx, vy = batch(256, a.seq_len, a.vocab, g)
                acc = (model(vx).argmax(-1) == vy).float().mean().item()
            scalars["val_acc"] = acc
        watch.log(step, loss=loss, **scalars)                                                         # entropyd:
    print("torch_encoder: run %s, %d steps, %d probed (interval %d), val_acc %.3f"
          % (run.name, a.steps, watch.probes, watch.interval, acc), flush=True)
    return 0 if run.finish("finished") else 1                                                         # entropyd:


if __name__ == "__main__":
    sys.exit(main())
