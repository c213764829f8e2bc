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
k of the first `examples` examples of a probed forward: per head
`entropy`, `entropy_norm`, `max_logit`, `sigma_qk`, `entropy_bound`,
`logit_scale`, `eig_mean`, `eig_var`; per layer `rank_ratio`, `cos_sim`
(definitions: docs/science.md).  The watch keeps its own cost within
`budget` (default 2%) of the training step by choosing how often to probe
and on how many examples (every=K forces a cadence).  The norms behind
sigma_qk and entropy_bound are certified upper bounds (power iterations
with vectors kept between steps, and a proof that the bound is above the
true norm, as the C probe does; exact=True: QR + SVD in float64), so
entropy_bound stays a lower bound of the entropy.  max_logit is the
logits' own maximum: the attention is recomputed for a few examples, as
fused attention never exposes it.  docs/pytorch.md has the costs.

A custom attention (nanoGPT-style, F.scaled_dot_product_attention) reports
its q and k with one call in its forward:  watch.record(self, q, k, x=x,
is_causal=True, w_q=..., w_k=...)  (see Watch.record).

Also here: sigma_reparam(model) (σReparam on every nn.Linear through
torch.nn.utils.parametrize) and AlertResponder (sigmatrain --on-alert's
warn / checkpoint / stop / rollback, for a PyTorch loop).
"""
import collections
import contextlib
import copy
import math
import statistics
import sys
import time

import numpy as np

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


# ------------------------------------------------------------------ certified norms
#
# The budgeted probe's norms (the exact path above is kept for tests and
# exact=True).  Every norm behind entropy_bound must be an UPPER bound: an
# under-estimate lifts the bound above the truth (science.md §2).  Power
# iteration with vectors kept between calls gives a close estimate mu0 of a
# top eigenvalue from below; a Cholesky factorization of mu I - G that
# succeeds proves lambda_max(G) < mu (the C probe's certificate,
# trainer/probe.c top_eig_upper).  Without a device-to-host
# synchronisation there is no "try the next mu if it fails": the candidates
# mu0 (1 + delta) for a few deltas are factorized together
# (torch.linalg.cholesky_ex reports failure in a tensor, it never raises),
# the smallest proven one is taken with torch.where, and when none is
# proven the Frobenius norm (always >= lambda_max, looser) stands in.  The
# certificate is in float64: a float32 Cholesky's backward error (~2 n^2 u
# relative, 2e-3 at n = 128) is larger than the deltas.

_CERT_DELTAS = (1e-7, 1e-5, 1e-3, 3e-2)   # the weights' d x d matrices (cheap: every delta at once)
_SQUARINGS = 8                            # S^256 v for the d x d warm start
_POWER_STEPS = 6                          # ||X_b||_2: power steps in the C space per call
# The sync-free certificate (squaring + Cholesky) is what runs on a GPU; on
# the host eigvalsh is cheaper.  True makes the host run the GPU's path too
# (the tests check both).
_SYNC_FREE_ON_CPU = False


_STARTS = {}


def _unit_start(shape, n, dtype, dev):
    """A fixed, generic unit start vector (not orthogonal to a top
    eigenvector by construction, unlike all-ones for structured inputs),
    made once per shape."""
    key = (tuple(shape), n, dtype, str(dev))
    v = _STARTS.get(key)
    if v is None:
        g = torch.Generator().manual_seed(20230101)
        v = torch.rand(tuple(shape) + (n,), generator=g, dtype=torch.float64) + 0.5
        v = _STARTS[key] = (v / v.norm(dim=-1, keepdim=True)).to(dtype=dtype, device=dev)
    return v


def _mv(G, v):
    return (G @ v.unsqueeze(-1)).squeeze(-1)


def _normalize_rows(w, start):
    n = w.norm(dim=-1, keepdim=True)
    ok = torch.isfinite(n) & (n > 0)
    return torch.where(ok, w / torch.where(ok, n, torch.ones_like(n)), start)


def _rayleigh_bound(G, v):
    """A certified upper bound on lambda_max of the symmetric PSD float64
    G (..., n, n) from any unit v (..., n) and G itself, with no
    factorization: in the basis [v, v-perp], G = [[rho, b^T], [b, G22]] with
    rho = v^T G v, ||b|| = ||G v - rho v||, and ||G22||_2 <= t = min(
    ||G22||_F = sqrt(||G||_F^2 - rho^2 - 2 ||b||^2), tr(G) - rho), so
    lambda_max(G) <= the top eigenvalue of [[rho, ||b||], [||b||, t]].  Tight
    (rho + ||b||^2 / (rho - t)) when v is close to the top eigenvector and
    the top eigenvalue dominates; never below lambda_max (margins of 1e-10
    relative on the subtraction, float64 rounding being ~1e-13 here)."""
    Gv = _mv(G, v)
    rho = (v * Gv).sum(-1)
    b2 = (Gv - rho.unsqueeze(-1) * v).square().sum(-1)
    f2 = G.square().sum(dim=(-2, -1))
    tr = G.diagonal(dim1=-2, dim2=-1).sum(-1)
    t = torch.minimum((f2 * (1 + 1e-10) - (rho * rho + 2 * b2) * (1 - 1e-10)).clamp(min=0).sqrt(),
                      (tr - rho * (1 - 1e-10)).clamp(min=0) * (1 + 1e-10))
    half = 0.5 * (rho - t)
    lam = 0.5 * (rho + t) + (half * half + b2 * (1 + 1e-10)).sqrt()
    bound = torch.minimum(lam, f2.sqrt()) * (1 + 1e-9)
    return torch.where(torch.isfinite(f2), bound, torch.full_like(bound, float("nan")))


def _top_eig_upper(G, v, deltas=_CERT_DELTAS):
    """A certified upper bound on lambda_max of the small symmetric PSD
    float64 matrices G (..., n, n), never below it, and the next warm start
    (..., n): v <- S^256 v by repeated squaring of S = G / ||G||_F (8 d^3
    products, converged for any spectrum that is not a near-tie), then the
    smallest mu = rho (1 + delta) whose mu I - G has a Cholesky
    factorization (which proves lambda_max < mu), inflated by 1e-9 relative
    for the factorization's backward error (~2 n^2 u ||mu I - G||, u =
    2^-53), and _rayleigh_bound when no delta is proven.  NaN when G is not
    finite.  No host synchronisation: cholesky_ex reports failure in a
    tensor, torch.where picks."""
    n = G.shape[-1]
    if G.device.type == "cpu" and not _SYNC_FREE_ON_CPU:
        # On the host nothing waits for a device: LAPACK's dsyevr, whose
        # absolute error is ~n u ||G|| <= 1e-9 tr(G) for n <= 1024 (trainer/
        # probe.c top_eig_direct), plus that margin.  NaN when G is not finite.
        tr = G.diagonal(dim1=-2, dim2=-1).sum(-1)
        ok = torch.isfinite(tr)
        lam = torch.linalg.eigvalsh(torch.where(ok[..., None, None], G, torch.zeros_like(G)))[..., -1]
        return torch.where(ok, lam.clamp(min=0) + 1e-9 * tr, torch.full_like(tr, float("nan"))), v
    start = _unit_start((), n, G.dtype, G.device).expand_as(v)
    f = G.square().sum(dim=(-2, -1), keepdim=True).sqrt()
    P = G / torch.where(f > 0, f, torch.ones_like(f))
    for _ in range(_SQUARINGS):
        P = P @ P
        f = P.square().sum(dim=(-2, -1), keepdim=True).sqrt()
        P = P / torch.where(f > 0, f, torch.ones_like(f))
    v = _normalize_rows(_mv(P, _normalize_rows(v.to(G.dtype), start)), start)
    v = _normalize_rows(_mv(G, v), start)
    rho = (v * _mv(G, v)).sum(-1).clamp(min=0)
    dl = torch.tensor(deltas, dtype=G.dtype, device=G.device)
    mu = rho.unsqueeze(-1) * (1 + dl)                                          # (..., K)
    eye = torch.eye(n, dtype=G.dtype, device=G.device)
    info = torch.linalg.cholesky_ex(mu[..., None, None] * eye - G.unsqueeze(-3))[1]
    best = torch.where(info == 0, mu, torch.full_like(mu, float("inf"))).amin(-1)
    return torch.minimum(best * (1 + 1e-9), _rayleigh_bound(G, v)), v


def _sigma_pair_upper(wq, wk, bq, state):
    """Certified upper bounds on ||W_Q^h^T W_K^h||_2 and ||[W_Q^h | b_Q^h]^T
    W_K^h||_2 per head (H,), float64: wq, wk (H, d, C), bq (H, d) or None.
    The C x C products are never formed: their squared singular values are
    the eigenvalues of S = Lk^T Gq Lk (d x d) with Gq = Wq Wq^T, Gk = Wk Wk^T
    = Lk Lk^T, and S + u u^T (u = Lk^T b_Q) for the query bias (trainer/
    probe.c head_weights).  Gk gets eps I before its Cholesky (eps = 1e-12
    tr/d, above the factorization's error, and Gk + eps I >= Gk can only
    raise the norm); a Gk that still fails (not finite) falls back to the
    Frobenius norm sqrt(tr(Gq Gk)).  state keeps the warm starts."""
    H, d, C = wq.shape
    wq, wk = wq.double(), wk.double()
    Gq = wq @ wq.transpose(1, 2)
    Gk = wk @ wk.transpose(1, 2)
    eye = torch.eye(d, dtype=torch.float64, device=wq.device)
    trk = Gk.diagonal(dim1=1, dim2=2).sum(-1)
    Lk, info = torch.linalg.cholesky_ex(Gk + (1e-12 * trk / d + 1e-300)[:, None, None] * eye)
    S = Lk.transpose(1, 2) @ Gq @ Lk
    S = 0.5 * (S + S.transpose(1, 2))
    if bq is not None:
        u = (Lk.transpose(1, 2) @ bq.double().unsqueeze(-1))              # (H, d, 1)
        Sa = S + u @ u.transpose(1, 2)
        Gqa = Gq + bq.double().unsqueeze(-1) * bq.double().unsqueeze(-2)
    else:
        Sa, Gqa = S, Gq
    both = torch.stack([S, Sa])                                            # (2, H, d, d)
    vs = state.get("v_qk")
    if vs is None or vs.shape != (2, H, d) or vs.device != wq.device:
        vs = _unit_start((2, H), d, torch.float64, wq.device)
    mu, state["v_qk"] = _top_eig_upper(both, vs)
    fro = torch.stack([(Gq * Gk).sum((1, 2)), (Gqa * Gk).sum((1, 2))]).clamp(min=0) * (1 + 1e-12)
    mu = torch.where((info == 0).unsqueeze(0), torch.minimum(mu, fro), fro)
    mu = torch.where(trk.unsqueeze(0) == 0, torch.zeros_like(mu), mu)     # W_K^h = 0: every logit row-constant
    sig = mu.sqrt()
    return sig[0], sig[1]


def _x_norm_upper(x, state):
    """Certified upper bounds on ||X_b||_2 (B,), float64, for x (B, T, C):
    power steps on X_b^T X_b from a warm start kept in state (C,: the top
    right singular vector changes little from batch to batch), then
    _rayleigh_bound on the smaller Gram matrix (T x T or C x C, the same
    non-zero eigenvalues), formed in x's dtype when that is float32/float64
    with IEEE rounding (its error E has ||E||_2 <= gamma_k ||X_b||_F^2,
    gamma_k = k u / (1 - k u), k the inner dimension: added) and in float64
    otherwise (CUDA with TF32 matmuls allowed)."""
    B, T, C = x.shape
    dev = x.device
    wd = x.dtype
    if dev.type == "cuda" and wd == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        wd = torch.float64
    xw = x.to(wd)
    v = state.get("v_x")
    if v is None or v.shape != (C,) or v.device != dev:
        v = _unit_start((), C, torch.float64, dev)
    start = v.to(wd).expand(B, C)
    vb = start
    xt = xw.transpose(1, 2)
    for _ in range(_POWER_STEPS // 2):   # 2 T C each: no Gram matrix needed
        vb = _mv(xt, _mv(xw, _mv(xt, _mv(xw, vb))))
        vb = vb / vb.norm(dim=-1, keepdim=True)
    vb = _normalize_rows(vb, start)     # a zero or non-finite X_b: back to the start
    state["v_x"] = vb[0].double()
    if T <= C:
        G, k = torch.bmm(xw, xt.contiguous()), C
        w0 = _mv(xw, vb)                                   # the matching left vector
    else:
        G, k = torch.bmm(xt, xw.contiguous()), T
        w0 = vb
    G = G.double()
    G = 0.5 * (G + G.transpose(1, 2))
    w0 = w0.double()
    w0 = _normalize_rows(_mv(G, _normalize_rows(w0, _unit_start((), w0.shape[-1], torch.float64, dev))),
                         _unit_start((), w0.shape[-1], torch.float64, dev))
    u = 2.0 ** -24 if wd == torch.float32 else 2.0 ** -53
    gamma = k * u / (1 - k * u)
    fro2 = G.diagonal(dim1=1, dim2=2).sum(-1) / (1 - gamma) * (1 + 1e-6)     # >= ||X_b||_F^2
    return (_rayleigh_bound(G, w0) + gamma * fro2).clamp(min=0).sqrt()


def _up32(v):
    """v as float32 rounded up (never below v): sigma_qk and logit_scale are
    upper bounds, and stay so stored."""
    f = v.float()
    return torch.where(f.double() < v.double(), torch.nextafter(f, torch.full_like(f, float("inf"))), f)


def _metrics(q, k, x=None, mask=None, w_q=None, w_k=None, b_q=None, b_k=None, state=None, eig=True):
    """attention_metrics' work; with state (a dict of warm starts) the norms
    are certified upper bounds (the functions above), without it exact.
    eig=False leaves eig_var NaN and returns the d x d matrices M (H, d, d)
    float64 as a third value, for the caller to finish on the host
    (torch.linalg.eigvals on CUDA synchronises).  No host synchronisation
    otherwise."""
    exact = state is None
    B, H, T, d = q.shape
    dev = q.device
    wd = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    q = q.to(wd)
    k = k.to(wd)
    nan = torch.tensor(float("nan"), device=dev)
    if mask is None:
        mask = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    mask = mask.to(dev)
    logits = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))             # (B, H, T, T)
    # the most negative finite value, not -inf: a row with no key stays finite (its entropy is zeroed below)
    A = torch.softmax(logits.masked_fill(~mask, torch.finfo(wd).min), dim=-1)
    Ti = mask.sum(-1).to(wd).expand(B, H, T)                                # keys per row
    ent = -torch.special.xlogy(A, A).sum(-1) * (Ti > 0)                    # (B, H, T)
    rows = Ti > 1
    ent_norm = torch.where(rows, ent / torch.log(Ti.clamp(min=2)), torch.zeros_like(ent))
    entropy = ent.mean(dim=(0, 2))
    entropy_norm = ent_norm.sum(dim=(0, 2)) / rows.sum(dim=(0, 2)).clamp(min=1)
    max_logit = logits.abs().masked_fill(~mask, 0.0).amax(dim=(0, 2, 3))  # NaN logits give NaN
    sigma_qk = eig_mean = eig_var = bound = scale = nan.expand(H)
    rank_ratio = cos_sim = nan
    M = None
    if x is not None:
        x = x.detach().to(wd)
    if w_q is not None and w_k is not None:
        C = w_q.shape[1]
        wq = w_q.detach().reshape(H, d, C)
        wk = w_k.detach().reshape(H, d, C)
        # eigenvalues of M = W_K^h W_Q^h^T / sqrt(d) (d x d): complex in general
        M = (wk.double() @ wq.double().transpose(1, 2)) / math.sqrt(d)
        eig_mean = (M.diagonal(dim1=1, dim2=2).sum(-1) / d).to(wd)          # the trace: exact, real
        if eig:
            lam = torch.linalg.eigvals(M)
            eig_var = (lam - lam.mean(-1, keepdim=True)).abs().pow(2).mean(-1).to(wd)
        bq = None if b_q is None else b_q.detach().reshape(H, d)
        if exact:
            sig = _spectral_pair(wq.float(), wk.float())
            if bq is not None:
                sig_b = _spectral_pair(torch.cat([wq.float(), bq.float().unsqueeze(-1)], 2), wk.float())
            else:
                sig_b = sig
        else:
            sig, sig_b = _sigma_pair_upper(wq, wk, bq, state)
        sigma_qk = sig / math.sqrt(d)
        if x is not None:
            # the key bias is a constant along a logit row (the softmax ignores
            # it): only the query bias enters the bound, as [W_Q | b_Q], x~ = [x; 1]
            aug = (bq != 0).any().double() if bq is not None else torch.zeros((), dtype=torch.float64, device=dev)
            xs = torch.linalg.matrix_norm(x.double(), ord=2) if exact else _x_norm_upper(x, state)   # (B,)
            rn = ((x.double().square().sum(-1) + aug).sqrt() if exact else
                  (x.square().sum(-1).double() + aug).sqrt() * (1 + 1e-5))                       # (B, T) ||x~_i||
            s = (sig_b / math.sqrt(d)).view(1, H, 1) * xs.view(B, 1, 1) * rn.view(B, 1, T)           # (B, H, T)
            bound = entropy_bound(Ti.double(), s).mean(dim=(0, 2)).to(wd)
            scale = s.amax(dim=(0, 2))
    if x is not None:
        fro2 = x.square().sum(dim=(1, 2)).double()
        mu = x.mean(1).double()
        res2 = fro2 - T * (mu * mu).sum(-1)
        rank_ratio = torch.where(fro2 > 0, torch.sqrt((res2 / fro2).clamp(min=0)), torch.zeros_like(fro2)).mean()
        xn = x.norm(dim=-1, keepdim=True)
        unit = torch.where(xn > 0, x / xn.clamp(min=1e-30), torch.zeros_like(x))
        um = unit.mean(1).double()
        cos_sim = ((T * (um * um).sum(-1) - 1) / (T - 1)).mean() if T > 1 else torch.tensor(1.0, device=dev)
    heads = torch.stack([t.float() for t in (entropy, entropy_norm, max_logit, _up32(sigma_qk), bound, _up32(scale),
                                             eig_mean, eig_var)])
    layer = torch.stack([torch.as_tensor(rank_ratio, device=dev), torch.as_tensor(cos_sim, device=dev)]).float()
    return heads, layer, M


def attention_metrics(q, k, x=None, mask=None, w_q=None, w_k=None, b_q=None, b_k=None, state=None):
    """Metrics of one attention layer.  q, k: (B, H, T, d), the heads'
    queries and keys (biases included, before the 1/sqrt(d) scaling);
    x: (B, T, C) the layer's input (for rank_ratio, cos_sim, entropy_bound);
    mask: (T, T) or (B, H, T, T) boolean, True where a key may be attended
    (None: causal); w_q, w_k: (H*d, C) the projection weights (rows h*d..:
    head h) and b_q, b_k their biases (for sigma_qk, eig_*, entropy_bound).
    state: None for exact norms (QR + SVD in float64), or a dict kept
    between calls (one per layer) for the budgeted probe's certified upper
    bounds from warm-started power iterations: sigma_qk then is at most
    ~1e-5 relative above the exact value once the warm start has converged,
    and entropy_bound never above the exact path's.  Returns (heads (8, H)
    float32 in HEAD_METRICS order, layer (2,) in LAYER_METRICS order); what
    cannot be computed from what was given is NaN.  Under no_grad; all on
    q's device."""
    with torch.no_grad():
        heads, layer, _ = _metrics(q, k, x, mask, w_q, w_k, b_q, b_k, state=state)
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

def _no_autocast(dev):
    """The probe's own arithmetic runs outside autocast: a bf16 Gram matrix
    would void the certificate's error bound."""
    try:
        return torch.autocast(device_type=dev.type, enabled=False)
    except (RuntimeError, ValueError):
        return contextlib.nullcontext()


class _OneThread:
    """A context that runs the probe's host ops on the calling thread alone
    and restores the thread counts after.  Why: the probe is a few hundred
    small ops (a few MB at most), and with torch on every core each op above
    torch's grain size (32768 elements) is an OpenMP parallel region, each
    gemm above ~64^3 wakes OpenBLAS's own pool; on a busy machine every such
    handoff waits for a descheduled thread.  Measured on 2 shared cores
    (128 x 4 heads, 4 examples, load ~3): 8 ms per layer on one thread, 35
    to 230 ms on two.  torch.set_num_threads cannot be used to toggle: it
    also resizes torch's pthreadpool (milliseconds per change), so this
    calls omp_set_num_threads and openblas_set_num_threads of the libraries
    already loaded in the process (found in /proc/self/maps, opened with
    RTLD_NOLOAD: nothing new is loaded).  Both are per-process for
    OpenBLAS and per-thread (the caller's) for OpenMP, so another thread's
    BLAS call during a probe runs on one thread too.  Where neither library
    is found (not Linux, another runtime) it does nothing.  Nested uses
    restore at the outermost exit."""

    def __init__(self):
        self._omp_set = self._omp_get = self._blas_set = self._blas_get = None
        self._saved = None
        self._depth = 0
        try:
            self._find()
        except (OSError, AttributeError, ValueError):
            self._omp_set = self._blas_set = None

    def _find(self):
        import ctypes
        import os
        paths = set()
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                base = p.rsplit("/", 1)[-1]
                if base.startswith(("libgomp", "libiomp", "libomp", "libopenblas")) and ".so" in base:
                    paths.add(p)
        mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 1)
        for p in sorted(paths):
            try:
                lib = ctypes.CDLL(p, mode=mode)
            except OSError:
                continue
            if "openblas" in p:
                if self._blas_set is None and hasattr(lib, "openblas_set_num_threads"):
                    self._blas_set, self._blas_get = lib.openblas_set_num_threads, lib.openblas_get_num_threads
                    self._blas_get.restype = ctypes.c_int
            elif self._omp_set is None and hasattr(lib, "omp_set_num_threads"):
                self._omp_set, self._omp_get = lib.omp_set_num_threads, lib.omp_get_max_threads
                self._omp_get.restype = ctypes.c_int
        # torch's own count must be OpenMP's: ATen's backend is OpenMP, or this is not the runtime torch uses
        if self._omp_set is not None and torch.get_num_threads() != self._omp_get():
            self._omp_set = None

    def __enter__(self):
        self._depth += 1
        if self._depth > 1:
            return self
        omp = blas = 0
        if self._omp_set is not None:
            omp = self._omp_get()
            if omp > 1:
                self._omp_set(1)
        if self._blas_set is not None:
            blas = self._blas_get()
            if blas > 1:
                self._blas_set(1)
        self._saved = (omp, blas)
        return self

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth > 0:
            return False
        omp, blas = self._saved
        if omp > 1:
            self._omp_set(omp)
        if blas > 1:
            self._blas_set(blas)
        return False


_one_thread = None


def _serial(dev):
    """_OneThread for host tensors (made once), a no-op context otherwise."""
    global _one_thread
    if dev.type != "cpu":
        return contextlib.nullcontext()
    if _one_thread is None:
        _one_thread = _OneThread()
    return _one_thread


def _dist():
    """(rank, world size) of torch.distributed's default group, (0, 1) without one."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return 0, 1


class Watch:
    """Probes a model's attention layers and logs to an entropyd run.  Made by
    watch(); layers are numbered in the order they were found or recorded.

    The budget: the watch times itself (its hooks and log(), per step) and
    the step without it (the time between two consecutive log() calls less
    the watch's own), and probes every `interval` steps, the smallest
    interval whose mean cost stays within `budget` of the step; it halves
    `examples` when the interval would exceed 16 and doubles it back (up to
    the examples given) when a probe a step costs under a third of the
    budget.  The first probe (step 0, or the first log) pays for warm-up
    and is not counted; the second comes 4 steps later.  every=K fixes the
    cadence (every K-th step) and examples instead.  Counters: probes
    (probed steps), cost (seconds spent by the watch), interval, examples."""

    def __init__(self, run, every=None, examples=4, budget=0.02, exact=False, ranks="zero"):
        if ranks not in ("zero", "min", "mean"):
            raise ValueError("entropyd.torch.watch: ranks 'zero', 'min' or 'mean'")
        self.run = run
        self.budget = float(budget)
        self.every = None if every is None else max(1, int(every))
        self.max_examples = self.examples = int(examples)
        self.exact = bool(exact)
        self.ranks = ranks
        self.rank, self.world = _dist()
        self.active = True      # False: a rank that neither probes nor reports (ranks="zero", rank > 0)
        self.layers = run.layers if run is not None else 0
        self.heads = run.heads if run is not None else 0
        self.enabled = True
        self.probes = 0
        self.cost = 0.0
        self.interval = self.every or 1
        self._device = torch.device("cpu")   # the model's (watch() sets it)
        self._layers = {}       # module -> index
        self._out = {}          # index -> (heads (8,H), layer (2,)) on device
        self._mats = {}         # index -> M (H, d, d) or None: eig_var is finished on the host
        self._state = {}        # index -> the power iterations' warm starts
        self._step = 0          # the step the next forward belongs to
        self._next = 0          # the next step probed (budget)
        self._t_probe = 0.0     # seconds in the hooks since the last log
        self._events = []       # CUDA (start, end) events of the hooks' work
        self._t_log = None      # perf_counter at the last log's start
        self._log_dur = 0.0     # how long the last log took
        self._prev = None       # the last logged step
        self._steps = collections.deque(maxlen=33)   # step times without the watch (s)
        self._costs = collections.deque(maxlen=8)    # the watch's cost on probed steps
        self._base = collections.deque(maxlen=33)    # ... and on the others

    def due(self, step=None):
        """Whether the forward of step (default: the next one) is probed."""
        if not (self.enabled and self.active):
            return False
        s = self._step if step is None else step
        if self.every is not None:
            return s % self.every == 0
        return s >= self._next

    def _index(self, module):
        i = self._layers.get(module)
        if i is None:
            i = self._layers[module] = len(self._layers)
        return i

    def _compute(self, i, q, k, x, mask, w_q, w_k, b_q, b_k):
        t0 = time.perf_counter()
        dev = q.device
        ev = None
        if dev.type == "cuda":
            ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            ev[0].record()
        with torch.no_grad(), _no_autocast(dev), _serial(dev):
            st = None if self.exact else self._state.setdefault(i, {})
            h, l, self._mats[i] = _metrics(q, k, x, mask, w_q, w_k, b_q, b_k, state=st, eig=False)
            self._out[i] = (h, l)
        if ev is not None:
            ev[1].record()
            self._events.append(ev)
        self._t_probe += time.perf_counter() - t0

    def record(self, module, q, k, x=None, attn_mask=None, is_causal=False, w_q=None, w_k=None,
               b_q=None, b_k=None, mask=None):
        """For a custom attention layer: call in its forward with the heads'
        q, k (B, H, T, d, biases included, unscaled), as passed to
        F.scaled_dot_product_attention.  module: the layer (its index is the
        order of first record; an nn.Module in eval mode is not probed) or
        an int; x (B, T, C): the layer's input; w_q, w_k (H*d, C), b_q, b_k:
        its projection (e.g. slices of a fused c_attn weight: w[:C],
        w[C:2C]); attn_mask as for F.scaled_dot_product_attention (bool True
        = may attend), or mask.  Cheap when the step is not probed (nothing
        is computed)."""
        if not self.due():
            return
        if module.__class__ is int:
            i = module
        else:
            if isinstance(module, nn.Module) and not module.training:
                return
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
        self._compute(i, q, k, None if x is None else x[:n], mask, w_q, w_k, b_q, b_k)

    def _mha_forward(self, mha, orig):
        watch = self

        def forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                    average_attn_weights=True, *args, **kwargs):
            if mha.training and watch.due():
                watch._probe_mha(mha, query, key, attn_mask, kwargs.get("is_causal", False), key_padding_mask)
            return orig(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                        attn_mask=attn_mask, average_attn_weights=average_attn_weights, *args, **kwargs)
        return forward

    def _probe_mha(self, mha, query, key, attn_mask, is_causal, key_padding_mask=None):
        if query is not key or not getattr(mha, "_qkv_same_embed_dim", True):
            return  # cross-attention or separate q/k/v projections: not probed
        t0 = time.perf_counter()
        with torch.no_grad(), _no_autocast(query.device), _serial(query.device):
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
            if key_padding_mask is not None:   # (B, T): True (or -inf) = a padding key, never attended
                kp = key_padding_mask[:n]
                pad = kp if kp.dtype == torch.bool else ~(torch.isfinite(kp) & (kp > -1e30))
                mask = mask & ~pad.to(x.device).view(B, 1, 1, T)
        self._t_probe += time.perf_counter() - t0
        self._compute(self._index(mha), q, k, x, mask, w_q, w_k, b_q, b_k)

    # ------------------------------------------------------------ log

    def _proposal(self):
        """The probe interval the measurements ask for (and examples' adjustment)."""
        if not self._steps or not self._costs:
            return 4
        S = statistics.median(self._steps)
        c0 = statistics.median(self._base) if self._base else 0.0
        cp = max(0.0, statistics.fmean(self._costs) - c0)
        avail = self.budget * S - c0
        n = 1000 if avail <= 0 else min(1000, max(1, math.ceil(cp / avail)))
        if self.every is None and self.max_examples > 0:
            if n > 16 and self.examples > 1:
                self.examples = max(1, self.examples // 2)
                self._costs.clear()
                n = max(1, n // 2)
            elif n == 1 and 3 * cp < avail and self.examples < self.max_examples:
                self.examples = min(self.max_examples, 2 * self.examples)
                self._costs.clear()
        return n

    def log(self, step, loss=None, scalars=None, **more):
        """Logs step: the scalars (loss, and any keyword given, e.g. lr=...;
        tensors are fine) and, when this step was probed, every layer's
        metrics, in one device->host copy.  Sets up the probing of the next
        forward.  Returns what run.log_stacked returns (None on a rank
        that does not report).  With ranks="min"/"mean" every rank calls it
        at every step."""
        t0 = time.perf_counter()
        if self._t_log is not None and self._prev is not None and step == self._prev + 1:
            self._steps.append(max(0.0, t0 - self._t_log - self._log_dur - self._t_probe))
        self._t_log, self._prev = t0, step
        if not self.active:
            self._step = step + 1
            self._log_dur = time.perf_counter() - t0
            return None
        was_due = self.due(step)
        with _serial(self._device):
            ret, consensus, gpu = self._send(step, was_due, loss, scalars, more)
        dur = time.perf_counter() - t0
        spent = max(self._t_probe, gpu) + dur
        self.cost += spent
        if was_due:
            if self.probes > 0:            # the first probe pays for warm-up: not a measure
                self._costs.append(spent)
            self.probes += 1
            if self.every is None:
                self.interval = consensus if consensus is not None else self._proposal()
                self._next = step + max(1, self.interval)
        else:
            self._base.append(spent)
        self._t_probe = 0.0
        self._step = step + 1
        self._log_dur = time.perf_counter() - t0
        return ret

    def _send(self, step, was_due, loss, scalars, more):
        """log()'s work after the timing: the one copy, eig_var on the host,
        the run's log call.  Returns (what the run returned, the interval
        agreed by the ranks or None, the seconds CUDA events timed)."""
        reduce = self.ranks != "zero" and self.world > 1 and was_due
        sc = dict(scalars or {})
        if loss is not None:
            sc["loss"] = loss
        sc.update(more)
        tens = [k for k, v in sc.items() if torch.is_tensor(v)]
        out, self._out = self._out, {}
        mats_all, self._mats = self._mats, {}
        L, H = self.layers, self.heads
        parts, dev = [], None
        if out or reduce:
            dev = next(iter(out.values()))[0].device if out else self._device
            hv = torch.full((len(HEAD_METRICS), L, H), float("nan"), device=dev)
            lv = torch.full((len(LAYER_METRICS), L), float("nan"), device=dev)
            for i, (h, l) in out.items():
                if i < L:
                    hv[:, i, :h.shape[1]] = h
                    lv[:, i] = l
            red = torch.cat([hv.reshape(-1), lv.reshape(-1)]).double()
            if reduce:
                red = self._reduce(red, dev)
            parts.append(red)
            mats = [(i, m) for i, m in sorted(mats_all.items()) if m is not None and i < L]
            parts += [m.reshape(-1) for _, m in mats]
        if tens:
            tdev = dev or sc[tens[0]].device
            parts.append(torch.stack([sc[k].detach().reshape(()).to(device=tdev, dtype=torch.float64) for k in tens]))
        host = None
        if parts:
            d0 = parts[0].device
            host = torch.cat([p.to(d0) for p in parts]).cpu().numpy()       # the one copy
        nt = len(tens)
        for j, k in enumerate(tens):
            sc[k] = float(host[len(host) - nt + j])
        sc = {k: float(v) for k, v in sc.items()}
        gpu = 0.0
        if self._events:
            gpu = sum(a.elapsed_time(b) for a, b in self._events) / 1e3   # complete: the copy waited for them
            self._events = []
        consensus = None
        ret = None
        if out or reduce:
            nh, nl = len(HEAD_METRICS) * L * H, len(LAYER_METRICS) * L
            heads = host[:nh].astype(np.float32)
            layer = host[nh:nh + nl].astype(np.float32)
            off = nh + nl
            if reduce:
                consensus = int(host[off])
                off += 1
            hview = heads.reshape(len(HEAD_METRICS), L, H)
            for i, m in mats:
                hd = m.shape[0]
                dd = m.shape[1]
                M = host[off:off + hd * dd * dd].reshape(hd, dd, dd)
                off += hd * dd * dd
                lam = np.linalg.eigvals(M)
                hview[7, i, :hd] = (np.abs(lam - lam.mean(-1, keepdims=True)) ** 2).mean(-1)
            if self.run is not None:
                ret = self.run.log_stacked(step, scalars=sc, layer_names=LAYER_METRICS, layer_values=layer,
                                           head_names=HEAD_METRICS, head_values=heads)
        elif self.run is not None:
            ret = self.run.log(step, scalars=sc)
        return ret, consensus, gpu

    def _reduce(self, red, dev):
        """ranks="min"/"mean": every rank's heads and layers, reduced, and the
        next probe interval agreed (the largest any rank asks for under min,
        the mean under mean), in one all_reduce on the probed step."""
        import torch.distributed as dist
        n = float(self._proposal())
        if self.ranks == "min":
            r = torch.cat([torch.nan_to_num(red, nan=float("inf")), torch.tensor([-n], dtype=red.dtype, device=dev)])
            dist.all_reduce(r, op=dist.ReduceOp.MIN)
            v = torch.where(torch.isinf(r[:-1]), torch.full_like(r[:-1], float("nan")), r[:-1])
            return torch.cat([v, -r[-1:]])
        r = torch.cat([red, torch.tensor([n], dtype=red.dtype, device=dev)])
        dist.all_reduce(r, op=dist.ReduceOp.SUM)
        r = r / self.world
        return torch.cat([r[:-1], r[-1:].ceil()])

    def remove(self):
        """Undoes the hooks."""
        for m in list(self._layers):
            if "forward" in m.__dict__ and getattr(m, "_entropyd_watch", None) is self:
                del m.forward
                del m._entropyd_watch


def watch(model, run, budget=0.02, every=None, examples=4, exact=False, ranks="zero"):
    """Hooks every nn.MultiheadAttention of model (so nn.TransformerEncoder /
    Decoder models work unchanged; their self-attention is probed in
    training mode; eval-mode forwards are not) and returns the Watch whose
    log() sends each step.
    budget: the fraction of the training step the watch may cost (default
      0.02); it times itself and chooses how often to probe and on how many
      examples (up to `examples`);
    every: probe every K-th step instead (the budget is then not applied);
    examples: the first N examples of the batch are probed (0: all);
    exact: exact norms (QR + SVD in float64) instead of certified power
      iterations (for tests: several times slower);
    ranks: under torch.distributed (DDP, torchrun), "zero" (default): rank 0
      probes and reports, the other ranks pass run=None and do nothing;
      "min" / "mean": every rank probes its own examples and calls log at
      every step, and rank 0 (the one with the run) reports each head's
      minimum / mean over ranks, reduced in one all_reduce per probed step."""
    w = Watch(run, every=every, examples=examples, budget=budget, exact=exact, ranks=ranks)
    params = list(model.parameters())
    w._device = params[0].device if params else torch.device("cpu")
    if w.world > 1 and ranks == "zero" and w.rank != 0:
        w.active = False
        return w
    if w.world > 1 and ranks != "zero":
        import torch.distributed as dist
        shape = torch.tensor([w.layers, w.heads] if w.rank == 0 else [0, 0], dtype=torch.int64, device=w._device)
        dist.broadcast(shape, 0)
        w.layers, w.heads = int(shape[0]), int(shape[1])
    if run is None and w.world <= 1:
        raise ValueError("entropyd.torch.watch: run is None (only ranks other than 0 may pass None)")
    if w.rank == 0 and run is None:
        raise ValueError("entropyd.torch.watch: rank 0 needs the run")
    for m in model.modules():
        if isinstance(m, nn.MultiheadAttention):
            w._index(m)
            m.forward = w._mha_forward(m, m.forward)
            m._entropyd_watch = w
    if len(w._layers) > w.layers:
        raise ValueError("entropyd.torch.watch: %d attention layers, the run has layers=%d"
                         % (len(w._layers), w.layers))
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
