#!/usr/bin/env python3
"""torch_ddp.py -- distributed data-parallel training (torchrun, DDP) watched
by entropyd: one run, reported once.

    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 \\
        examples/torch_ddp.py --daemon unix:entropyd-data/entropyd.sock --steps 100

Rank 0 opens the run; the other ranks pass run=None.  --ranks zero (the
default) probes and reports rank 0's examples only: the other ranks do no
telemetry at all.  --ranks min / mean: every rank probes its own examples
and rank 0 reports each head's minimum / mean over the ranks, in one small
all_reduce on probed steps (every rank then calls watch.log at every step).
--model custom: the nanoGPT-style attention of torch_custom_attention.py,
reporting through watch.record; --model encoder: nn.TransformerEncoder.
gloo on CPU (nccl when CUDA is there).
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import entropyd  # noqa: E402
import entropyd.torch  # noqa: E402
from torch_custom_attention import GPT, args_parser, copy_batch  # noqa: E402


class EncoderLM(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq_len):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq_len, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def attach(self, watch):
        pass     # nn.MultiheadAttention is hooked by watch() itself

    def forward(self, idx):
        T = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        return self.head(self.blocks(h, mask=self.mask[:T, :T]))


def main(argv=None):
    ap = args_parser(__doc__)
    ap.add_argument("--model", choices=["custom", "encoder"], default="custom")
    ap.add_argument("--ranks", choices=["zero", "min", "mean"], default="zero")
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)                          # the same initial weights on every rank
    g = torch.Generator().manual_seed(a.seed + 1000 * rank)   # each rank its own data
    cls = GPT if a.model == "custom" else EncoderLM
    model = cls(a.vocab, a.dim, a.heads, a.layers, a.seq_len).to(dev)
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr)
    run = None
    if rank == 0:                                                                                  # entropyd:
        run = entropyd.init(a.run, layers=a.layers, heads=a.heads, seq_len=a.seq_len, daemon=a.daemon,
                            config=dict(vars(a), world=world, trainer="examples/torch_ddp.py"))
    watch = entropyd.torch.watch(ddp, run, every=a.every or None, ranks=a.ranks)                  # entropyd:
    model.attach(watch)
    for step in range(a.steps):
        x, y = copy_batch(a.batch, a.seq_len, a.vocab, g)
        ddp.train()
        loss = F.cross_entropy(ddp(x.to(dev)).reshape(-1, a.vocab), y.to(dev).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        watch.log(step, loss=loss)                                                                 # entropyd:
    ok = True
    if run is not None:
        print("torch_ddp: run %s, %d ranks, %d steps, %d probed (ranks=%s)"
              % (run.name, world, a.steps, watch.probes, a.ranks), flush=True)
        ok = run.finish("finished")                                                                # entropyd:
    else:
        print("torch_ddp: rank %d done, %d probed" % (rank, watch.probes), flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
