"""entropyd.torch: attention-collapse metrics of a PyTorch model, streamed
with entropyd.  Needs torch only when imported.

    import entropyd, entropyd.torch
    run = entropyd.init("lm", layers=L, heads=H, seq_len=T, config=vars(args))
    watch = entropyd.torch.watch(model, run)           # hooks every nn.MultiheadAttention
    for step, batch in enumerate(loader):
        loss = ...; loss.backward(); opt.step()
        watch.log(step, loss=loss, lr=lr)                # one device->host copy per logged step
    run.finish("finished")

Metrics (the definitions of sigmatrain's probe, trainer/probe.h and
science.md), computed with torch ops on the model's device from the q and
k of the first `examples` examples of a probed forward (every `every`
steps): per head `entropy`, `entropy_norm`, `max_logit`, `sigma_qk`,
`entropy_bound`, `logit_scale`, `eig_mean`, `eig_var`; per layer
`rank_ratio`, `cos_sim` (definitions: docs/science.md).
Unlike the C probe (power iterations with persistent vectors, tuned for a
3% budget), the norms here are exact (QR + an SVD of d x d matrices), and
max_logit is the logits' own maximum: the attention is recomputed for a few
examples, as fused attention never exposes it.

A custom attention (nanoGPT-style, F.scaled_dot_product_attention) reports
its q and k with one call in its forward:  watch.record(self, q, k, x=x,
is_causal=True, w_q=..., w_k=...)  (see Watch.record).

Also here: sigma_reparam(model) (σReparam on every nn.Linear through
torch.nn.utils.parametrize) and AlertResponder (sigmatrain --on-alert's
warn / checkpoint / stop / rollback, for a PyTorch loop).
"""
import copy
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

HEAD_METRICS = ["entropy", "entropy_norm", "max_logit", "sigma_qk", "entropy_bound", "logit_scale", "eig_mean",
                "eig_var"]
LAYER_METRICS = ["rank_ratio", "cos_sim"]

__all__ = ["watch", "Watch", "attention_metrics", "entropy_bound", "sigma_reparam", "SigmaReparam",
           "AlertResponder", "HEAD_METRICS", "LAYER_METRICS"]


# ------------------------------------------------------------------ metrics

def entropy_bound(T, s):
    """Theorem 3.1 (science.md §2), elementwise: the lowest entropy (nats) of
    a softmax over T logits whose centred L2 norm is at most s.  T and s are
    tensors of one shape; T <= 1 gives 0, s <= 0 gives log T (probe_entropy_bound)."""
    T = T.to(torch.float64)
    s = s.to(torch.float64)
    r = s * torch.sqrt(T / (T - 1).clamp(min=1))
    beta = torch.exp(-r)
    den = 1 + (T - 1) * beta
    b = torch.log(den) + s * torch.sqrt(T * (T - 1)) * beta / den
    b = torch.where(r > 60, torch.zeros_like(b), b)
    b = torch.where(s > 0, b, torch.log(T.clamp(min=1)))
    return torch.where(T <= 1, torch.zeros_like(b), b)


def _spectral_pair(wq, wk):
    """||wq^T wk||_2 per head, exactly: wq, wk (H, d, C'); the C' x C' product
    has rank <= d, its norm is that of R_q^T R_k (QR of wq^T and wk^T)."""
    rq = torch.linalg.qr(wq.transpose(1, 2).double(), mode="reduced")[1]
    rk = torch.linalg.qr(wk.transpose(1, 2).double(), mode="reduced")[1]
    return torch.linalg.matrix_norm(rq @ rk.transpose(1, 2), ord=2)


def attention_metrics(q, k, x=None, mask=None, w_q=None, w_k=None, b_q=None, b_k=None):
    """Metrics of one attention layer.  q, k: (B, H, T, d), the heads'
    queries and keys (biases included, before the 1/sqrt(d) scaling);
    x: (B, T, C) the layer's input (for rank_ratio, cos_sim, entropy_bound);
    mask: (T, T) or (B, H, T, T) boolean, True where a key may be attended
    (None: causal); w_q, w_k: (H*d, C) the projection weights (rows h*d..:
    head h) and b_q, b_k their biases (for sigma_qk, eig_*, entropy_bound).
    Returns (heads (8, H) float32 in HEAD_METRICS order, layer (2,) in
    LAYER_METRICS order); what cannot be computed from what was given is NaN.
    Under no_grad; all on q's device."""
    with torch.no_grad():
        B, H, T, d = q.shape
        dev = q.device
        q = q.float()
        k = k.float()
        nan = torch.tensor(float("nan"), device=dev)
        if mask is None:
            mask = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        mask = mask.to(dev).expand(B, H, T, T)
        logits = (q @ k.transpose(-1, -2)) / math.sqrt(d)                  # (B, H, T, T)
        a = logits.masked_fill(~mask, float("-inf"))
        A = torch.softmax(a, dim=-1)
        A = torch.nan_to_num(A, nan=0.0) if not torch.isfinite(logits).all() else A
        ent = -torch.special.xlogy(A, A).sum(-1)                          # (B, H, T)
        Ti = mask.sum(-1).to(torch.float32)                                # keys per row
        rows = Ti > 1
        ent_norm = torch.where(rows, ent / torch.log(Ti.clamp(min=2)), torch.zeros_like(ent))
        entropy = ent.mean(dim=(0, 2))
        nrows = rows.sum(dim=(0, 2)).clamp(min=1)
        entropy_norm = ent_norm.sum(dim=(0, 2)) / nrows
        absl = logits.abs().masked_fill(~mask, 0.0)
        max_logit = absl.amax(dim=(0, 2, 3))
        max_logit = torch.where(torch.isfinite(logits).all(), max_logit, nan.expand(H))
        sigma_qk = eig_mean = eig_var = bound = scale = nan.expand(H)
        rank_ratio = cos_sim = nan
        if w_q is not None and w_k is not None:
            C = w_q.shape[1]
            wq = w_q.detach().float().reshape(H, d, C)
            wk = w_k.detach().float().reshape(H, d, C)
            sigma_qk = (_spectral_pair(wq, wk) / math.sqrt(d)).float()
            # eigenvalues of M / sqrt(d), M = W_K^h W_Q^h^T (d x d): complex in general
            lam = torch.linalg.eigvals((wk @ wq.transpose(1, 2)).double() / math.sqrt(d))    # (H, d)
            mean = lam.mean(-1)
            eig_mean = mean.real.float()
            eig_var = (lam - mean.unsqueeze(-1)).abs().pow(2).mean(-1).float()
            if x is not None:
                x = x.detach().float()
                # the key bias is a constant along a logit row (the softmax ignores
                # it): only the query bias enters the bound, as [W_Q | b_Q]
                aug = b_q is not None and bool((b_q != 0).any())
                if aug:
                    bq = b_q.detach().float().reshape(H, d, 1)
                    sig_b = _spectral_pair(torch.cat([wq, bq], 2), wk) / math.sqrt(d)
                    xt = torch.cat([x, torch.ones(B, T, 1, device=dev)], 2)
                else:
                    sig_b = sigma_qk.double()
                    xt = x
                xs = torch.linalg.matrix_norm(x.double(), ord=2)              # (B,) ||X_b||_2
                rn = xt.double().norm(dim=-1)                                  # (B, T) ||x~_i||
                s = sig_b.view(1, H, 1) * xs.view(B, 1, 1) * rn.view(B, 1, T)  # (B, H, T)
                bound = entropy_bound(Ti.double(), s).mean(dim=(0, 2)).float()
                scale = s.amax(dim=(0, 2)).float()
        if x is not None:
            x = x.detach().float()
            fro2 = (x * x).sum(dim=(1, 2)).double()
            mu = x.mean(1).double()
            res2 = fro2 - T * (mu * mu).sum(-1)
            rank_ratio = torch.where(fro2 > 0, torch.sqrt((res2 / fro2).clamp(min=0)),
                                     torch.zeros_like(fro2)).mean().float()
            xn = x.norm(dim=-1, keepdim=True)
            unit = torch.where(xn > 0, x / xn.clamp(min=1e-30), torch.zeros_like(x))
            um = unit.mean(1).double()
            cos_sim = ((T * (um * um).sum(-1) - 1) / (T - 1)).mean().float() if T > 1 else torch.tensor(1.0, device=dev)
        heads = torch.stack([entropy, entropy_norm, max_logit, sigma_qk.to(dev), bound.to(dev), scale.to(dev),
                             eig_mean.to(dev), eig_var.to(dev)]).float()
        layer = torch.stack([torch.as_tensor(rank_ratio, device=dev), torch.as_tensor(cos_sim, device=dev)]).float()
        return heads, layer


def _mask_from(attn_mask, is_causal, B, H, T, dev):
    """The boolean 'may attend' mask of MultiheadAttention's arguments."""
    if attn_mask is None:
        if is_causal:
            return torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        return torch.ones(T, T, dtype=torch.bool, device=dev)
    m = attn_mask
    if m.dtype == torch.bool:
        allow = ~m  # MultiheadAttention: True = not allowed
    else:
        allow = torch.isfinite(m) & (m > -1e30)
    if allow.dim() == 3:  # (B*H, T, T)
        allow = allow.view(-1, H, T, T)[:B]
    return allow


# ------------------------------------------------------------------ hooks

class Watch:
    """Probes a model's attention layers and logs to an entropyd run.  Made by
    watch(); layers are numbered in the order they were found or recorded."""

    def __init__(self, run, every=1, examples=4):
        self.run = run
        self.every = max(1, int(every))
        self.examples = int(examples)
        self._layers = {}       # module -> index
        self._out = {}          # index -> (heads (8,H), layer (2,)) on device
        self._step = 0          # the step the next forward belongs to
        self.enabled = True

    def due(self, step=None):
        s = self._step if step is None else step
        return self.enabled and s % self.every == 0

    def _index(self, module):
        i = self._layers.get(module)
        if i is None:
            i = self._layers[module] = len(self._layers)
        return i

    def record(self, module, q, k, x=None, attn_mask=None, is_causal=False, w_q=None, w_k=None,
               b_q=None, b_k=None, mask=None):
        """For a custom attention layer: call in its forward with the heads'
        q, k (B, H, T, d, biases included, unscaled), as passed to
        F.scaled_dot_product_attention.  module: the layer (its index is the
        order of first record) or an int; x (B, T, C): the layer's input;
        w_q, w_k (H*d, C), b_q, b_k: its projection (e.g. slices of a fused
        c_attn weight: w[:C], w[C:2C]); attn_mask as for
        F.scaled_dot_product_attention (bool True = may attend), or mask.
        Cheap when the step is not probed (nothing is computed)."""
        if not (self.enabled and self._step % self.every == 0):
            return
        if module.__class__ is int:
            i = module
        else:
            i = self._index(module)
        n = self.examples if self.examples > 0 else q.shape[0]
        q, k = q[:n], k[:n]
        B, H, T, _ = q.shape
        if mask is None:
            if attn_mask is not None:
                mask = attn_mask if attn_mask.dtype == torch.bool else torch.isfinite(attn_mask)
                if mask.dim() == 4:
                    mask = mask[:n]
            else:
                mask = _mask_from(None, is_causal, B, H, T, q.device)
        self._out[i] = attention_metrics(q, k, None if x is None else x[:n], mask, w_q, w_k, b_q, b_k)

    def _mha_forward(self, mha, orig):
        watch = self

        def forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                    average_attn_weights=True, *args, **kwargs):
            if watch.enabled and watch._step % watch.every == 0 and mha.training:
                watch._probe_mha(mha, query, key, attn_mask, kwargs.get("is_causal", False))
            return orig(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                        attn_mask=attn_mask, average_attn_weights=average_attn_weights, *args, **kwargs)
        return forward

    def _probe_mha(self, mha, query, key, attn_mask, is_causal):
        if query is not key or not getattr(mha, "_qkv_same_embed_dim", True):
            return  # cross-attention or separate q/k/v projections: not probed
        with torch.no_grad():
            x = query if mha.batch_first else query.transpose(0, 1)       # (B, T, E)
            n = self.examples if self.examples > 0 else x.shape[0]
            x = x[:n]
            E, H = mha.embed_dim, mha.num_heads
            d = E // H
            w = mha.in_proj_weight
            b = mha.in_proj_bias
            w_q, w_k = w[:E], w[E:2 * E]
            b_q = b[:E] if b is not None else None
            b_k = b[E:2 * E] if b is not None else None
            B, T, _ = x.shape
            q = F.linear(x, w_q, b_q).view(B, T, H, d).transpose(1, 2)
            k = F.linear(x, w_k, b_k).view(B, T, H, d).transpose(1, 2)
            mask = _mask_from(attn_mask, is_causal, B, H, T, x.device)
            self._out[self._index(mha)] = attention_metrics(q, k, x, mask, w_q, w_k, b_q, b_k)

    def log(self, step, loss=None, scalars=None, **more):
        """Logs step: the scalars (loss, and any keyword given, e.g. lr=...;
        tensors are fine) and, when this step was probed, every layer's
        metrics in one device->host copy.  Sets up the probing of the next
        forward.  Returns what run.log_stacked returns."""
        sc = dict(scalars or {})
        if loss is not None:
            sc["loss"] = loss
        sc.update(more)
        sc = {k: (float(v.detach()) if hasattr(v, "detach") else float(v)) for k, v in sc.items()}
        out, self._out = self._out, {}
        self._step = step + 1
        L = self.run.layers
        if not out:
            return self.run.log(step, scalars=sc)
        dev = next(iter(out.values()))[0].device
        H = self.run.heads
        hv = torch.full((len(HEAD_METRICS), L, H), float("nan"), device=dev)
        lv = torch.full((len(LAYER_METRICS), L), float("nan"), device=dev)
        for i, (h, l) in out.items():
            if i < L:
                hv[:, i, :h.shape[1]] = h
                lv[:, i] = l
        both = torch.cat([hv.reshape(-1), lv.reshape(-1)]).cpu().numpy()  # the one copy
        nh = len(HEAD_METRICS) * L * H
        return self.run.log_stacked(step, scalars=sc, layer_names=LAYER_METRICS, layer_values=both[nh:],
                                    head_names=HEAD_METRICS, head_values=both[:nh])

    def remove(self):
        """Undoes the hooks."""
        for m in list(self._layers):
            if "forward" in m.__dict__ and getattr(m, "_entropyd_watch", None) is self:
                del m.forward
                del m._entropyd_watch


def watch(model, run, every=1, examples=4):
    """Hooks every nn.MultiheadAttention of model (so nn.TransformerEncoder /
    Decoder models work unchanged; their self-attention is probed, in
    training mode) and returns the Watch whose log() sends each step.
    every: probe every K-th step (the other steps send scalars only);
    examples: the first N examples of the batch are probed (0: all)."""
    w = Watch(run, every=every, examples=examples)
    for m in model.modules():
        if isinstance(m, nn.MultiheadAttention):
            w._index(m)
            m.forward = w._mha_forward(m, m.forward)
            m._entropyd_watch = w
    if len(w._layers) > run.layers:
        raise ValueError("entropyd.torch.watch: %d attention layers, the run has layers=%d"
                         % (len(w._layers), run.layers))
    return w


# ------------------------------------------------------------------ σReparam

def _normalize(v, eps=1e-12):
    return v / v.norm().clamp(min=eps)


class SigmaReparam(nn.Module):
    """The parametrization W_hat = (gamma / sigma(W)) W (science.md §3), the
    maths of trainer/sreparam.c: sigma by ONE power step per training-mode
    forward of its module (power_step, from a forward pre-hook: v <-
    normalize(W u), u <- normalize(W^T v)), then sigma = v^T W u with u, v
    constants, so d sigma / dW = v u^T flows through autograd; u from
    the top right singular vector of the initial W; gamma = sigma(W_init)
    (gamma_init "sigma": W_hat = W at the start) or 1 ("one")."""

    def __init__(self, weight, gamma_init="sigma"):
        super().__init__()
        with torch.no_grad():
            W = weight.detach().float()
            _, S, Vh = torch.linalg.svd(W, full_matrices=False)
            u = Vh[0].clone()
            v = _normalize(W @ u)
            sigma = float(S[0])
        self.register_buffer("u", u.to(weight.dtype))
        self.register_buffer("v", v.to(weight.dtype))
        self.register_buffer("sigma", torch.tensor(sigma, dtype=weight.dtype))
        if gamma_init not in ("sigma", "one"):
            raise ValueError("gamma_init: 'sigma' or 'one'")
        self.gamma = nn.Parameter(torch.tensor(sigma if gamma_init == "sigma" else 1.0, dtype=weight.dtype))

    def power_step(self, W):
        """One power-iteration step on the trained W (no gradient)."""
        with torch.no_grad():
            v = _normalize(W @ self.u)
            u = _normalize(W.t() @ v)
            self.v.copy_(v)
            self.u.copy_(u)
            self.sigma.copy_(v @ W @ u)

    def forward(self, W):
        sigma = self.v @ W @ self.u   # = the step's sigma; d sigma / dW = v u^T
        return (self.gamma / sigma) * W


def _power_hook(targets):
    # One power step per training-mode forward of the module, however often
    # its forward reads the weight (MultiheadAttention reads in_proj_weight
    # more than once, and out_proj.weight without calling out_proj).
    def hook(module, args):
        if module.training and torch.is_grad_enabled():
            for owner, name in targets:
                pl = owner.parametrizations[name]
                pl[0].power_step(pl.original)
    return hook


def sigma_reparam(model, gamma_init="sigma"):
    """σReparam on every nn.Linear of model and on every
    nn.MultiheadAttention's in_proj_weight (one fused QKV matrix: one sigma
    and one gamma, like sigmatrain's qkv) and out_proj, through
    torch.nn.utils.parametrize.  Call before creating the optimizer (the
    gammas are new parameters).  Returns model.  The power step runs once per
    training-mode forward of each layer (a forward pre-hook): once per
    training step for a model called once a step; eval mode and no_grad run
    none."""
    done = set()
    for m in list(model.modules()):
        if isinstance(m, nn.MultiheadAttention) and m._qkv_same_embed_dim and \
                not parametrize.is_parametrized(m, "in_proj_weight"):
            parametrize.register_parametrization(m, "in_proj_weight", SigmaReparam(m.in_proj_weight, gamma_init))
            targets = [(m, "in_proj_weight")]
            if isinstance(m.out_proj, nn.Linear) and not parametrize.is_parametrized(m.out_proj, "weight"):
                parametrize.register_parametrization(m.out_proj, "weight", SigmaReparam(m.out_proj.weight, gamma_init))
                targets.append((m.out_proj, "weight"))
                done.add(m.out_proj)
            m.register_forward_pre_hook(_power_hook(targets))
    for m in list(model.modules()):
        if isinstance(m, nn.Linear) and m not in done and not parametrize.is_parametrized(m, "weight"):
            parametrize.register_parametrization(m, "weight", SigmaReparam(m.weight, gamma_init))
            m.register_forward_pre_hook(_power_hook([(m, "weight")]))
    return model


# ------------------------------------------------------------------ alerts

class AlertResponder:
    """sigmatrain --on-alert for a PyTorch loop.  action: "warn" (print),
    "checkpoint" (save model + optimizer state to path.format(step=...)),
    "stop" (checkpoint, then should_stop is True: end the run "aborted"),
    "rollback" (restore the newest in-memory snapshot from before the
    alert's start_step; the loop then skips what it likes and goes on).
    rules: act only on these rule names (None: any).  Call
    responder.snapshot(step) every few steps (rollback), and
    responder.handle(run.alerts(), step) after each log; it returns the step
    restored to (rollback) or None.  Firing alerts about steps abandoned by a
    rollback (start_step > restored step, step_time before the rollback) are
    ignored, as sigmatrain does (schema/protocol.md)."""

    def __init__(self, model, optimizer=None, action="warn", rules=None, path="checkpoint-step{step}.pt",
                 keep=4, log=None):
        if action not in ("warn", "checkpoint", "stop", "rollback"):
            raise ValueError("action: warn, checkpoint, stop or rollback")
        self.model, self.optimizer, self.action = model, optimizer, action
        self.rules = set(rules) if rules else None
        self.path, self.keep = path, keep
        self.log = log or sys.stderr
        self.snapshots = []    # (step, model state, optimizer state)
        self.should_stop = False
        self.rolled_back_at = None   # (restored step, wall time of the rollback)
        self.rollbacks = 0

    def snapshot(self, step):
        st = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        ost = copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None
        self.snapshots.append((step, st, ost))
        del self.snapshots[:-self.keep]

    def _save(self, step):
        p = self.path.format(step=step)
        torch.save({"step": step, "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None}, p)
        return p

    def handle(self, alerts, step):
        restored = None
        for a in alerts:
            if a.get("transition") != "firing":
                continue
            if self.rules is not None and a.get("rule") not in self.rules:
                continue
            start = int(a.get("start_step", a.get("step", step)))
            if self.rolled_back_at is not None:
                c, when = self.rolled_back_at
                if start > c and a.get("step_time", when) < when:
                    continue  # a verdict on abandoned steps still in flight
            print("entropyd alert: %s firing since step %d (severity %s)"
                  % (a.get("rule"), start, a.get("severity")), file=self.log)
            if self.action == "checkpoint":
                print("entropyd alert: checkpoint %s" % self._save(step), file=self.log)
            elif self.action == "stop":
                print("entropyd alert: checkpoint %s, stopping" % self._save(step), file=self.log)
                self.should_stop = True
            elif self.action == "rollback":
                snap = [s for s in self.snapshots if s[0] < start]
                if not snap:
                    print("entropyd alert: no snapshot before step %d, not rolling back" % start, file=self.log)
                    continue
                s_step, st, ost = snap[-1]
                self.model.load_state_dict(st)
                if ost is not None and self.optimizer is not None:
                    self.optimizer.load_state_dict(ost)
                import time
                self.rolled_back_at = (s_step, time.time())
                self.rollbacks += 1
                self.snapshots = [s for s in self.snapshots if s[0] <= s_step]
                print("entropyd alert: rolled back to step %d" % s_step, file=self.log)
                restored = s_step
        return restored
