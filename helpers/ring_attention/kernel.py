"""The torch kernel under ring attention: one block of keys at a time, fully masked tiles skipped (12.3.2).

:func:`tile_plan` says, per query tile, which key columns to compute and which mask the partly
visible ones need; :func:`block_forward` and :func:`block_backward` compute one K/V block's
attention (output and log-sum-exp) and its gradients in the accumulator dtype (:func:`acc_dtype`);
:func:`merge_into` folds a block into the running result with the online softmax (the torch
version of :func:`helpers.attention_numpy.merge`). :class:`BufferMeter` measures the K/V bytes
alive on a rank. :func:`tolerance` is how close a distributed result must be to the exact one.

Tensor layout on a rank: ``(heads, tokens, head_dim)``.
"""
from __future__ import annotations

import math
import weakref

import numpy as np

from .partition import allowed, tile_ok

# ---- torch: a tiled block kernel that skips fully masked tiles -----------------------------

def tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing a distributed result in ``dtype`` with the exact one.

    The ring sums the same terms as one process, in another order, with float32 accumulators for
    16-bit inputs; the result is rounded to ``dtype`` once. So float64/float32 results agree to a
    few hundred ulps (64 eps here, allowing for sums over hundreds of keys), 16-bit results to a
    few units of their eps (rounding of inputs and output dominates).
    """
    import torch

    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"no tolerance defined for {dtype}: use float64, float32, bfloat16 or float16")
    eps = torch.finfo(dtype).eps
    if dtype in (torch.float64, torch.float32):
        return 64 * eps, 64 * eps
    if dtype in (torch.bfloat16, torch.float16):
        return 4 * eps, 4 * eps
    raise ValueError(f"no tolerance defined for {dtype}: use float64, float32, bfloat16 or float16")


def acc_dtype(dtype):
    """Accumulator dtype: float32 for 16-bit inputs (as FlashAttention does), else the input dtype."""
    import torch

    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def tile_plan(q_pos, k_pos, causal, valid_len, tile):
    """Per query tile: the key columns to compute (tiles not fully masked) and their mask (or None)."""
    import torch

    ok = allowed(q_pos, k_pos, causal, valid_len)
    any_t, all_t = tile_ok(ok, tile)
    plan = []
    for i in range(any_t.shape[0]):
        kt = np.flatnonzero(any_t[i])
        if len(kt) == 0:
            continue
        rows = slice(i * tile, (i + 1) * tile)
        if len(kt) == kt[-1] - kt[0] + 1:  # a contiguous run of tiles: a slice, no gather
            cols = slice(int(kt[0]) * tile, (int(kt[-1]) + 1) * tile)
            cols_np = np.arange(cols.start, cols.stop)
        else:
            cols_np = (kt[:, None] * tile + np.arange(tile)[None, :]).ravel()
            cols = torch.from_numpy(cols_np)
        partial = np.flatnonzero(~all_t[i, kt])  # selected tiles that are only partly visible
        if len(partial) == 0:
            mask = None
        else:
            a, b = int(partial[0]) * tile, (int(partial[-1]) + 1) * tile
            if len(partial) != partial[-1] - partial[0] + 1:
                a, b = 0, len(cols_np)
            mask = (slice(a, b), torch.from_numpy(ok[rows][:, cols_np[a:b]].copy()))
        plan.append((rows, cols, mask, len(kt)))
    return plan


def _apply_mask(x, mask, fill):
    """Fill the hidden entries of a score-like tensor; only the partly visible columns are touched."""
    if mask is None:
        return x
    sl, m = mask
    x[..., sl] = x[..., sl].masked_fill(~m.to(x.device), fill)
    return x


def _take(x, cols):
    return x[:, cols] if isinstance(cols, slice) else x.index_select(1, cols.to(x.device))


def block_forward(q, k, v, plan, scale):
    """Attention of local queries over one K/V block: ``(out, lse, tiles)`` in the accumulator dtype.

    Rows that see no key of this block get ``out = 0`` and ``lse = -inf``.
    """
    import torch

    acc = acc_dtype(q.dtype)
    H, n, dv = q.shape[0], q.shape[1], v.shape[-1]
    out = torch.zeros(H, n, dv, dtype=acc, device=q.device)
    lse = torch.full((H, n), -math.inf, dtype=acc, device=q.device)
    tiles = 0
    for rows, cols, mask, nt in plan:
        s = _apply_mask(torch.matmul(q[:, rows].to(acc), _take(k, cols).to(acc).transpose(-1, -2)) * scale, mask, -math.inf)
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(s - m)
        l = e.sum(dim=-1, keepdim=True)
        out[:, rows] = torch.matmul(e, _take(v, cols).to(acc)) / l.clamp_min(torch.finfo(acc).tiny)
        lse[:, rows] = torch.where(l[..., 0] > 0, m[..., 0] + torch.log(l[..., 0]), torch.full_like(l[..., 0], -math.inf))
        tiles += nt
    return out, lse, tiles


def merge_into(out, lse, blk_out, blk_lse):
    """Online-softmax merge in (output, log-sum-exp) form, in place: the ring's update rule (12.3.2).

    ``lse = logaddexp(lse, blk_lse)``; ``out = out e^(lse_old - lse) + blk_out e^(blk_lse - lse)``.
    This is the (m, l, O) merge of :func:`helpers.attention_numpy.merge` with ``l`` folded into
    ``lse = m + log l`` and ``O`` kept normalised.
    """
    import torch

    new = torch.logaddexp(lse, blk_lse)
    safe = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
    wa = torch.where(torch.isfinite(lse), torch.exp(lse - safe), torch.zeros_like(lse))
    wb = torch.where(torch.isfinite(blk_lse), torch.exp(blk_lse - safe), torch.zeros_like(blk_lse))
    out.mul_(wa[..., None]).add_(blk_out * wb[..., None])
    lse.copy_(new)


def block_backward(q, k, v, do, lse, delta, plan, scale):
    """Gradient contributions of one K/V block: ``(dq, dk, dv, tiles)`` in the accumulator dtype.

    With ``P = exp(q k^T scale - lse)`` (the final softmax, rebuilt from the saved ``lse``):
    ``dV = P^T dO``, ``dS = P (dO V^T - delta)`` with ``delta = rowsum(dO * O)``,
    ``dQ = dS K scale``, ``dK = dS^T Q scale``.
    """
    import torch

    acc = acc_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    tiles = 0
    for rows, cols, mask, nt in plan:
        qi, doi = q[:, rows].to(acc), do[:, rows].to(acc)
        kc, vc = _take(k, cols).to(acc), _take(v, cols).to(acc)
        s = torch.matmul(qi, kc.transpose(-1, -2)) * scale
        pr = _apply_mask(torch.exp(s - lse[:, rows, None]), mask, 0.0)
        dvc = torch.matmul(pr.transpose(-1, -2), doi)
        ds = pr * (torch.matmul(doi, vc.transpose(-1, -2)) - delta[:, rows, None])
        dq[:, rows] += torch.matmul(ds, kc) * scale
        dkc = torch.matmul(ds.transpose(-1, -2), qi) * scale
        if isinstance(cols, slice):
            dk[:, cols] += dkc
            dv[:, cols] += dvc
        else:
            dk.index_add_(1, cols.to(dk.device), dkc)
            dv.index_add_(1, cols.to(dv.device), dvc)
        tiles += nt
    return dq, dk, dv, tiles


# ---- measuring the K/V bytes alive on a rank ------------------------------------------------

class BufferMeter:
    """Bytes of tracked tensors alive on this rank, by kind, and their peak (12.3.2 memory claim).

    ``track(t, kind)`` registers a tensor; it counts until the tensor is freed (a weakref
    finalizer fires when the tensor is deallocated: a buffer still referenced by a pending
    send, or by a forgotten variable, keeps counting). ``peak[kind]`` is the largest sum reached.
    """

    def __init__(self):
        self.live: dict[int, tuple[str, int]] = {}
        self.current: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self._next = 0

    def track(self, t, kind: str = "kv"):
        key, self._next = self._next, self._next + 1
        nbytes = t.numel() * t.element_size()
        self.live[key] = (kind, nbytes)
        self.current[kind] = self.current.get(kind, 0) + nbytes
        self.peak[kind] = max(self.peak.get(kind, 0), self.current[kind])
        weakref.finalize(t, self._release, key)
        return t

    def _release(self, key):
        kind, nbytes = self.live.pop(key, (None, 0))
        if kind is not None:
            self.current[kind] -= nbytes

    def reset_peak(self):
        self.peak = dict(self.current)


def track(meter, t, kind):
    return t if meter is None else meter.track(t, kind)
