"""Context parallelism: ring attention on the launcher's ranks, and its cost models (P.10, 12.3.2).

The sequence is cut into ``p`` shards, one per rank. Each rank keeps its query shard and passes
key/value shards around a ring (to rank ``r+1``, from rank ``r-1``), with the send of the block it
is working on and the receive of the next one in flight while it computes (two buffers,
"ping-pong"). Partial results are merged with the online softmax (see
:mod:`helpers.attention_numpy`). The backward pass goes round the ring again: K/V travel as in
the forward pass, and the dK/dV accumulators travel with them, collecting every rank's
contribution, until they arrive home.

Contents:

* partitions of the sequence over ranks (``contiguous``, ``striped``, ``zigzag``), padding for a
  length that does not divide, the causal work each rank does (unmasked query/key pairs, tiles);
* the cost models of the sections: K/V memory, ring bytes, all-gather and all-to-all (Ulysses)
  bytes, attention FLOPs;
* the torch side: a tiled block kernel that skips fully masked tiles, forward and backward through
  the ring as a ``torch.autograd.Function``, a meter of K/V bytes alive on a rank, and the two
  other designs (all-gather K/V, Ulysses all-to-all of heads) for comparison;
* worker functions for :func:`helpers.launcher.launch` (also runnable under torchrun).

Tensor layout on a rank: ``(heads, tokens, head_dim)``.
"""
from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from . import costs
from .validate import equal_parts, integer_at_least, positive_number

SCHEMES = ("contiguous", "striped", "zigzag")


# ---- partitions of the sequence -------------------------------------------------------------

def _check_sp(s: int, p: int):
    for name, x in (("s", s), ("p", p)):
        integer_at_least(x, name)


def _unit(p: int, scheme: str) -> int:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}: allowed are {SCHEMES}")
    return 2 * p if scheme == "zigzag" else p


def padded_length(s: int, p: int, scheme: str = "contiguous") -> int:
    """Smallest length >= ``s`` the scheme can split over ``p`` ranks (a multiple of p; 2p for zigzag)."""
    _check_sp(s, p)
    u = _unit(p, scheme)
    return -(-s // u) * u


def partition_indices(s: int, p: int, scheme: str = "contiguous") -> list[np.ndarray]:
    """The token positions each of ``p`` ranks holds (12.3.2).

    ``contiguous``: rank k holds ``[k s/p, (k+1) s/p)``. ``striped``: rank k holds every p-th
    token starting at k. ``zigzag``: the sequence is cut into 2p chunks and rank k holds chunks k
    and 2p-1-k (one early, one late). ValueError when ``s`` is not a multiple of p (2p for
    zigzag): pad first (:func:`padded_length`).
    """
    _check_sp(s, p)
    u = _unit(p, scheme)
    chunks = [np.arange(c.start, c.stop) for c in equal_parts(s, u, (
        f"sequence length s={{n}} is not divisible by {'2p' if scheme == 'zigzag' else 'p'}={{k}} "
        f"({scheme} partition over p={p} ranks); pad it to {padded_length(s, p, scheme)} and mask the padding"))]
    if scheme == "contiguous":
        return chunks
    if scheme == "striped":
        return [np.arange(s)[k::p].copy() for k in range(p)]
    return [np.concatenate([chunks[k], chunks[2 * p - 1 - k]]) for k in range(p)]


def allowed(q_pos, k_pos, causal: bool, valid_len: int | None = None) -> np.ndarray:
    """Boolean ``(len(q_pos), len(k_pos))``: True where the query may see the key.

    Causal: key position <= query position. Padding: keys at positions >= ``valid_len`` are hidden.
    """
    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    ok = np.ones((len(q_pos), len(k_pos)), dtype=bool)
    if causal:
        ok &= q_pos[:, None] >= k_pos[None, :]
    if valid_len is not None:
        ok &= (k_pos < valid_len)[None, :]
    return ok


def _tile_ok(ok: np.ndarray, tile: int):
    n_q, n_k = ok.shape
    if tile < 1 or n_q % tile or n_k % tile:
        raise ValueError(f"tile={tile} must be >= 1 and divide the local shard length {n_q}")
    t = ok.reshape(n_q // tile, tile, n_k // tile, tile)
    return t.any(axis=(1, 3)), t.all(axis=(1, 3))


def work_table(s: int, p: int, scheme: str, causal: bool = True, tile: int | None = None, valid_len=None) -> dict:
    """The attention work of every rank at every ring step, from the masks alone (12.3.2).

    Returns ``pairs[r, j]`` (unmasked query/key pairs rank r scores at step j, when it holds the
    K/V block of rank ``(r - j) mod p``) and ``tiles[r, j]`` (tile x tile blocks it computes when
    it skips tiles that are fully masked; ``tile`` defaults to the whole local shard). The kernel
    in this module computes exactly ``tiles`` tiles (checked in the tests).
    """
    parts = partition_indices(s, p, scheme)
    n = s // p
    tile = n if tile is None else tile
    pairs = np.zeros((p, p), dtype=np.int64)
    tiles = np.zeros((p, p), dtype=np.int64)
    for r in range(p):
        for j in range(p):
            ok = allowed(parts[r], parts[(r - j) % p], causal, valid_len)
            pairs[r, j] = ok.sum()
            tiles[r, j] = _tile_ok(ok, tile)[0].sum()
    return {"pairs": pairs, "tiles": tiles, "tile": tile, "tile_pairs": tile * tile}


# ---- cost models (P.10, 12.3.2) ---------------------------------------------------------------

def _nonneg(**kw):
    for k, x in kw.items():
        positive_number(x, k, allow_zero=True)


def score_matrix_bytes(n: int, bytes_per: int = 2, heads: int = 1, layers: int = 1) -> int:
    """Bytes to materialise the n x n score matrix (P.10: one head, one layer, 16-bit)."""
    _nonneg(n=n, bytes_per=bytes_per, heads=heads, layers=layers)
    return n * n * bytes_per * heads * layers


def kv_bytes(s: int, hidden: int, bytes_per: int = 2, layers: int = 1, batch: int = 1, p: int = 1, t: int = 1) -> float:
    """Bytes of K and V for ``s`` tokens of width ``hidden`` (12.3.2): ``2 s h bytes``.

    Divided by the context-parallel degree ``p`` (each rank holds s/p tokens) and the
    tensor-parallel degree ``t`` (each rank holds hidden/t of the heads).
    """
    _nonneg(s=s, hidden=hidden, bytes_per=bytes_per, layers=layers, batch=batch)
    _check_sp(1, p), _check_sp(1, t)
    return 2 * s * hidden * bytes_per * layers * batch / (p * t)


def ring_bytes_per_rank(s: int, p: int, n_heads: int, d_head: int, bytes_per: int = 2, batch: int = 1) -> float:
    """Forward-pass bytes one rank sends per layer in ring attention (12.3.2).

    ``p - 1`` steps, each sending a K and a V block of ``s/p x n_heads x d_head`` elements:
    ``2 (p-1) (s/p) n_heads d_head bytes``.
    """
    _check_sp(s, p)
    _nonneg(n_heads=n_heads, d_head=d_head, bytes_per=bytes_per, batch=batch)
    return costs.ring_steps("all_gather", p) * (2 * (s / p) * n_heads * d_head * bytes_per * batch)


def ring_backward_bytes_per_rank(s: int, p: int, n_heads: int, d_head: int, bytes_per: int = 2, grad_bytes_per: int | None = None) -> float:
    """Backward-pass bytes one rank sends per layer: K/V again (p-1 steps) plus dK/dV (p steps home).

    ``grad_bytes_per`` is the accumulator's element size (4 for float32 accumulators of 16-bit K/V).
    One rank (p = 1) sends nothing.
    """
    g = bytes_per if grad_bytes_per is None else grad_bytes_per
    hops = p if p > 1 else 0
    return ring_bytes_per_rank(s, p, n_heads, d_head, bytes_per) + hops * 2 * (s / p) * n_heads * d_head * g


def allgather_kv_bytes_per_rank(s: int, p: int, n_heads: int, d_head: int, bytes_per: int = 2) -> float:
    """Bytes one rank sends to all-gather K and V with a ring all-gather: ``(p-1)/p`` of the full pair."""
    _check_sp(s, p)
    return costs.ring_bytes_sent("all_gather", 2 * s * n_heads * d_head * bytes_per, p)


def ulysses_bytes_per_rank(s: int, p: int, n_heads: int, d_head: int, bytes_per: int = 2) -> float:
    """Bytes one rank sends in Ulysses-style attention: all-to-all of Q, K, V in, of the output back.

    Each all-to-all keeps 1/p of a rank's ``s/p x n_heads x d_head`` block and sends the rest:
    ``4 (p-1)/p (s/p) n_heads d_head bytes``. Needs ``p`` to divide ``n_heads``.
    """
    _check_sp(s, p)
    if n_heads % p:
        raise ValueError(f"all-to-all over heads needs p={p} to divide n_heads={n_heads}")
    return 4 * costs.ring_bytes_sent("all_to_all", (s / p) * n_heads * d_head * bytes_per, p)


def attention_flops(s_q: int, s_k: int, n_heads: int, d_head: int, causal: bool = False) -> float:
    """Forward FLOPs of attention: ``q k^T`` and ``P v``, 2 FLOPs per multiply-add each (halved if causal)."""
    _nonneg(s_q=s_q, s_k=s_k, n_heads=n_heads, d_head=d_head)
    return float(costs.attention_flops(s_q, s_k, n_heads * d_head, causal))


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


def _plan(q_pos, k_pos, causal, valid_len, tile):
    """Per query tile: the key columns to compute (tiles not fully masked) and their mask (or None)."""
    import torch

    ok = allowed(q_pos, k_pos, causal, valid_len)
    any_t, all_t = _tile_ok(ok, tile)
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


def _track(meter, t, kind):
    return t if meter is None else meter.track(t, kind)


# ---- torch: ring attention forward and backward -------------------------------------------------

@dataclass
class RingConfig:
    """How a ring-attention call runs on this rank (positions come from the partition scheme)."""

    scheme: str = "contiguous"
    causal: bool = False
    valid_len: int | None = None  # real tokens; positions >= valid_len are padding keys
    tile: int | None = None  # tile size for skipping fully masked tiles (default: whole shard)
    meter: BufferMeter | None = None
    stats: dict = field(default_factory=dict)
    overlap: bool = True  # post the next transfer before computing (False: transfer, then compute)


def _ring_exchange(send_buf, recv_buf, rank, p):
    """Post send to rank+1 and receive from rank-1 (non-blocking); return the requests."""
    import torch.distributed as dist

    ops = [dist.P2POp(dist.isend, send_buf, (rank + 1) % p), dist.P2POp(dist.irecv, recv_buf, (rank - 1) % p)]
    return dist.batch_isend_irecv(ops)


def _ring_setup(q, cfg):
    """What the forward and the backward ring both start from: rank, ring size, shapes, this
    rank's token positions, tile size, softmax scale and accumulation dtype."""
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    H, n, d = q.shape
    tile = n if cfg.tile is None else cfg.tile
    return rank, p, H, n, d, _positions(n, p, cfg), tile, 1.0 / math.sqrt(d), acc_dtype(q.dtype)


def _positions(n_local, p, cfg):
    return partition_indices(n_local * p, p, cfg.scheme)


def _span(name):
    from .commlog import span

    return span(name)


def ring_forward(q, k, v, cfg: RingConfig):
    """Forward ring on this rank: returns ``(out, lse)``; ``out`` in q's dtype, ``lse`` in float32/64."""
    import torch

    rank, p, H, n, d, pos, tile, scale, acc = _ring_setup(q, cfg)
    out = torch.zeros(H, n, v.shape[-1], dtype=acc, device=q.device)
    lse = torch.full((H, n), -math.inf, dtype=acc, device=q.device)
    st = cfg.stats.setdefault("forward", {"compute_s": [], "compute_cpu_s": [], "wait_s": [], "tiles": [], "src": []})
    cur = _track(cfg.meter, torch.stack([k, v]), "kv")  # the outgoing buffer for step 0
    for j in range(p):
        src = (rank - j) % p
        reqs, nxt = None, None
        if j < p - 1:
            nxt = _track(cfg.meter, torch.empty_like(cur), "kv")
            if cfg.overlap:
                reqs = _ring_exchange(cur, nxt, rank, p)
            else:
                t0 = time.perf_counter()
                for r in _ring_exchange(cur, nxt, rank, p):
                    r.wait()
                st["wait_s"].append(time.perf_counter() - t0)
        plan = _plan(pos[rank], pos[src], cfg.causal, cfg.valid_len, tile)
        t0, c0 = time.perf_counter(), time.thread_time()
        with _span("attend"):
            if plan:
                bo, bl, nt = block_forward(q, cur[0], cur[1], plan, scale)
                merge_into(out, lse, bo, bl)
                del bo, bl
            else:
                nt = 0
        st["compute_s"].append(time.perf_counter() - t0)
        st["compute_cpu_s"].append(time.thread_time() - c0)
        st["tiles"].append(nt)
        st["src"].append(src)
        if j < p - 1:
            if reqs is not None:
                t0 = time.perf_counter()
                with _span("wait"):
                    for r in reqs:
                        r.wait()
                st["wait_s"].append(time.perf_counter() - t0)
                del reqs
            cur = nxt
            del nxt
    del cur
    return out.to(q.dtype), lse


def ring_backward(q, k, v, out, lse, dout, cfg: RingConfig):
    """Backward ring on this rank: returns ``(dq, dk, dv)`` for the local shards.

    K/V go round as in the forward pass; the dK/dV accumulator of each block travels one step
    behind them, each rank adding its contribution, and after ``p`` sends it is back at its owner.
    """
    import torch

    rank, p, H, n, d, pos, tile, scale, acc = _ring_setup(q, cfg)
    delta = (dout.to(acc) * out.to(acc)).sum(-1)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    st = cfg.stats.setdefault("backward", {"compute_s": [], "compute_cpu_s": [], "wait_s": [], "tiles": [], "src": []})
    cur = _track(cfg.meter, torch.stack([k, v]), "kv")
    dcur = _track(cfg.meter, torch.zeros((2,) + tuple(k.shape), dtype=acc, device=q.device), "dkv")
    d_reqs = None
    for j in range(p):
        src = (rank - j) % p
        reqs, nxt = None, None
        if j < p - 1:
            nxt = _track(cfg.meter, torch.empty_like(cur), "kv")
            reqs = _ring_exchange(cur, nxt, rank, p)
        plan = _plan(pos[rank], pos[src], cfg.causal, cfg.valid_len, tile)
        t0, c0 = time.perf_counter(), time.thread_time()
        with _span("attend-bwd"):
            if plan:
                bq, bk, bv, nt = block_backward(q, cur[0], cur[1], dout, lse, delta, plan, scale)
            else:
                bq = bk = bv = None
                nt = 0
        st["compute_s"].append(time.perf_counter() - t0)
        st["compute_cpu_s"].append(time.thread_time() - c0)
        st["tiles"].append(nt)
        st["src"].append(src)
        t0 = time.perf_counter()
        with _span("wait"):
            if d_reqs is not None:  # the accumulator for block src, arriving from rank-1
                for r in d_reqs:
                    r.wait()
                del d_reqs
                dcur = dnxt
                del dnxt
            if bq is not None:
                dq += bq
                dcur[0] += bk
                dcur[1] += bv
                del bq, bk, bv
            if p > 1:
                dnxt = _track(cfg.meter, torch.empty_like(dcur), "dkv")
                d_reqs = _ring_exchange(dcur, dnxt, rank, p)
            if reqs is not None:
                for r in reqs:
                    r.wait()
                del reqs
        st["wait_s"].append(time.perf_counter() - t0)
        if j < p - 1:
            cur = nxt
            del nxt
    del cur
    if d_reqs is not None:
        for r in d_reqs:
            r.wait()
        del d_reqs
        dcur = dnxt
        del dnxt
    return dq.to(q.dtype), dcur[0].to(k.dtype), dcur[1].to(v.dtype)


def _make_function():
    import torch

    class RingAttentionFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cfg):
            out, lse = ring_forward(q.detach(), k.detach(), v.detach(), cfg)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.cfg = cfg
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = ring_backward(q.detach(), k.detach(), v.detach(), out, lse, dout.contiguous(), ctx.cfg)
            return dq, dk, dv, None

    return RingAttentionFn


_FN = None


def ring_attention(q, k, v, *, scheme: str = "contiguous", causal: bool = False, valid_len: int | None = None,
                   tile: int | None = None, meter: BufferMeter | None = None, stats: dict | None = None,
                   overlap: bool = True):
    """Ring attention over the world's ranks on this rank's shards ``q, k, v`` of ``(heads, s/p, d)``.

    Differentiable: ``backward`` runs the backward ring. ``scheme`` says which token positions
    each rank holds (the same on all ranks); ``valid_len`` hides padding keys; ``tile`` enables
    skipping of fully masked tiles; ``meter`` records the K/V buffers' lifetimes; ``stats`` (a
    dict) receives per-step compute and wait times and tile counts.
    """
    global _FN
    if q.dim() != 3 or k.shape != v.shape or q.shape != k.shape:
        raise ValueError(f"q, k, v must be (heads, tokens, head_dim) with equal heads and tokens, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if scheme not in SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}: allowed are {SCHEMES}")
    if scheme == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"zigzag needs an even local shard length, got {q.shape[1]}")
    if _FN is None:
        _FN = _make_function()
    cfg = RingConfig(scheme, causal, valid_len, tile, meter, {} if stats is None else stats, overlap)
    return _FN.apply(q, k, v, cfg)


# ---- inputs, references and assembling results ----------------------------------------------

def make_inputs(s: int, heads: int, d: int, seed: int = 0, dtype=None):
    """Global q, k, v and an upstream gradient dout, each ``(heads, s, d)``, identical on every rank."""
    import torch

    _check_sp(s, 1)
    dtype = torch.float64 if dtype is None else dtype
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(heads, s, d, generator=g, dtype=torch.float64).to(dtype) for _ in range(4)]


def reference_attention(q, k, v, dout=None, causal: bool = False, valid_len: int | None = None):
    """Full attention on one process in float64 with autograd: ``(out, dq, dk, dv)`` (grads None without dout)."""
    import torch

    q, k, v = (x.detach().to(torch.float64).requires_grad_(dout is not None) for x in (q, k, v))
    s = q.shape[1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    ok = torch.from_numpy(allowed(np.arange(s), np.arange(k.shape[1]), causal, valid_len))
    out = torch.softmax(scores.masked_fill(~ok, -math.inf), dim=-1) @ v
    if dout is None:
        return out.detach(), None, None, None
    out.backward(dout.to(torch.float64))
    return out.detach(), q.grad, k.grad, v.grad


def single_process_attention(q, k, v, causal: bool = False):
    """Plain attention in the inputs' own dtype on one process (what the ring is compared with)."""
    import torch

    s = q.shape[1]
    acc = acc_dtype(q.dtype)
    scores = (q.to(acc) @ k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    ok = torch.from_numpy(allowed(np.arange(s), np.arange(s), causal))
    return (torch.softmax(scores.masked_fill(~ok, -math.inf), dim=-1) @ v.to(acc)).to(q.dtype)


def assemble(results: list[dict], key: str, s: int):
    """Put each rank's local rows of ``key`` back at their token positions; drop padding (>= s)."""
    import torch

    first = results[0][key]
    total = sum(r[key].shape[1] for r in results)
    full = torch.zeros((first.shape[0], total) + tuple(first.shape[2:]), dtype=first.dtype)
    for r in results:
        full[:, torch.as_tensor(r["idx"])] = r[key]
    return full[:, :s]


# ---- worker functions for the launcher ---------------------------------------------------------

def ring_attention_worker(s: int, heads: int, d: int, *, scheme: str = "contiguous", causal: bool = False,
                          dtype: str = "float64", backward: bool = True, tile: int | None = None,
                          seed: int = 0, pad: bool = False, overlap: bool = True):
    """Run ring attention on this rank's shard of the seeded inputs (12.3.2); return what it computed.

    ``pad=True`` pads a length that the scheme cannot split to the next multiple and masks the
    padding keys; ``pad=False`` lets :func:`partition_indices` raise its ValueError. Returns a dict
    with ``idx`` (token positions), ``out`` and (with ``backward``) ``dq, dk, dv``, the measured
    ``stats``, the meter's peak bytes by kind (``fwd_peak``, ``bwd_peak``), ``saved_bytes`` (what
    autograd keeps for backward, measured with saved-tensor hooks) and ``shard_bytes`` (one K/V
    shard pair).
    """
    import torch
    import torch.distributed as dist

    from .worker import device

    rank, p = dist.get_rank(), dist.get_world_size()
    dt = getattr(torch, dtype)
    q, k, v, dout = make_inputs(s, heads, d, seed, dt)
    s_pad = padded_length(s, p, scheme) if pad else s
    idx = partition_indices(s_pad, p, scheme)[rank]
    if s_pad > s:
        q, k, v, dout = (torch.cat([x, x.new_zeros(heads, s_pad - s, d)], dim=1) for x in (q, k, v, dout))
    dev = device()
    ti = torch.as_tensor(idx)
    meter = BufferMeter()
    ql, kl, vl = (x.index_select(1, ti).to(dev).requires_grad_(backward) for x in (q, k, v))
    meter.track(kl, "kv"), meter.track(vl, "kv")  # this rank's own shard, kept for the backward pass
    shard = 2 * kl.numel() * kl.element_size()
    stats: dict = {}
    saved: dict = {}

    def pack(t):  # what autograd keeps for the backward pass, each storage counted once
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    dist.barrier()  # start the ring together (spans and timelines line up)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = ring_attention(ql, kl, vl, scheme=scheme, causal=causal, valid_len=s if s_pad > s else None,
                             tile=tile, meter=meter, stats=stats, overlap=overlap)
    fwd_peak = dict(meter.peak)
    res = {"idx": idx, "out": out.detach(), "stats": stats, "shard_bytes": shard, "fwd_peak": fwd_peak,
           "saved_bytes": sum(saved.values())}
    if backward:
        meter.reset_peak()
        out.backward(dout.index_select(1, ti).to(dev))
        res.update(dq=ql.grad, dk=kl.grad, dv=vl.grad, bwd_peak=dict(meter.peak))
    return res


def compare_results(results: list[dict], s: int, heads: int, d: int, *, causal: bool = False,
                    dtype: str = "float64", seed: int = 0) -> dict:
    """Largest error of the ring's output and gradients against float64 single-process attention.

    Returns ``{"out": err, "dq": err, ...}`` (max abs error), the ``tolerance`` used and ``ok``.
    The reference starts from the same inputs rounded to ``dtype``.
    """
    import torch

    dt = getattr(torch, dtype)
    q, k, v, dout = make_inputs(s, heads, d, seed, dt)
    ref = dict(zip(("out", "dq", "dk", "dv"), reference_attention(q, k, v, dout, causal)))
    rtol, atol = tolerance(dt)
    errs, ok = {}, True
    for key in ("out", "dq", "dk", "dv"):
        if key not in results[0]:
            continue
        got = assemble(results, key, s).to(torch.float64)
        errs[key] = float((got - ref[key]).abs().max())
        ok &= bool(torch.allclose(got, ref[key], rtol=rtol, atol=atol))
    return {"errors": errs, "tolerance": (rtol, atol), "ok": ok}


def _sent_since(start) -> float:
    """Ring-model bytes this rank sent since the :func:`helpers.commlog.mark` ``start`` (nan outside a job)."""
    from .commlog import ops_since

    return float(sum(o.model_sent for o in ops_since(start))) if start.log is not None else float("nan")


def designs_worker(s: int, heads: int, d: int, *, causal: bool = False, seed: int = 0, dtype: str = "float32"):
    """Attention on the same ranks three ways, forward pass (12.3.2, P.10): ring, all-gather K/V, Ulysses.

    For each: this rank's output rows, the bytes it sent (from the communication log: send bytes
    for the ring, ring-model bytes of each collective) and the peak bytes of K/V it held (own shard
    included), measured by :class:`BufferMeter`. Contiguous partition for all three.
    """
    import torch
    import torch.distributed as dist

    from .commlog import mark
    from .worker import device

    rank, p = dist.get_rank(), dist.get_world_size()
    if heads % p:
        raise ValueError(f"Ulysses all-to-all needs p={p} to divide heads={heads}")
    dt = getattr(torch, dtype)
    q, k, v, _ = make_inputs(s, heads, d, seed, dt)
    idx = partition_indices(s, p, "contiguous")[rank]
    ti = torch.as_tensor(idx)
    dev = device()
    n = s // p
    res = {"idx": idx}

    # 1. the ring
    meter = BufferMeter()
    ql, kl, vl = (x.index_select(1, ti).to(dev) for x in (q, k, v))
    meter.track(kl, "kv"), meter.track(vl, "kv")
    start = mark()
    with torch.no_grad():
        out = ring_attention(ql, kl, vl, causal=causal, meter=meter)
    res["ring"] = {"out": out, "sent": _sent_since(start), "kv_peak": meter.peak.get("kv", 0)}
    del out

    # 2. all-gather K and V, then attend locally
    meter = BufferMeter()
    meter.track(kl, "kv"), meter.track(vl, "kv")
    start = mark()
    kv = torch.stack([kl, vl])
    full = _track(meter, torch.empty((p * 2,) + tuple(kv.shape[1:]), dtype=kv.dtype, device=dev), "kv")
    dist.all_gather_single(full, kv)
    del kv
    parts = full.view((p, 2) + tuple(full.shape[1:]))  # (rank, k/v, heads, n, d)
    kf = parts[:, 0].permute(1, 0, 2, 3).reshape(heads, s, d)
    vf = parts[:, 1].permute(1, 0, 2, 3).reshape(heads, s, d)
    plan = _plan(idx, np.arange(s), causal, None, n)
    o, _, _ = block_forward(ql, kf, vf, plan, 1.0 / math.sqrt(d))
    res["allgather"] = {"out": o.to(dt), "sent": _sent_since(start), "kv_peak": meter.peak.get("kv", 0)}
    del full, parts, kf, vf, o

    # 3. Ulysses: all-to-all so each rank holds all s tokens of heads/p heads, attend, all-to-all back
    meter = BufferMeter()
    meter.track(kl, "kv"), meter.track(vl, "kv")
    start = mark()
    hp = heads // p

    def to_heads(x):  # (heads, n, d) sequence-sharded -> (heads/p, s, d) head-sharded
        send = x.reshape(p, hp, n, d).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        return recv.permute(1, 0, 2, 3).reshape(hp, s, d)  # chunk i came from rank i: tokens in order

    qh = to_heads(ql)
    kh = _track(meter, to_heads(kl), "kv")
    vh = _track(meter, to_heads(vl), "kv")
    plan = _plan(np.arange(s), np.arange(s), causal, None, s)
    oh, _, _ = block_forward(qh, kh, vh, plan, 1.0 / math.sqrt(d))
    del qh, kh, vh
    send = oh.to(dt).reshape(hp, p, n, d).permute(1, 0, 2, 3).contiguous()  # chunk i: rank i's tokens
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    res["ulysses"] = {"out": recv.reshape(heads, n, d), "sent": _sent_since(start), "kv_peak": meter.peak.get("kv", 0)}
    res["shard_bytes"] = 2 * kl.numel() * kl.element_size()
    return res


def causal_balance_worker(s: int, heads: int, d: int, *, tile: int, schemes=SCHEMES, repeats: int = 3,
                          seed: int = 0, dtype: str = "float32"):
    """Causal ring attention (forward) with each partition scheme, timed per step (12.3.2).

    Each scheme runs ``repeats`` times; per step this rank keeps the smallest CPU time of its
    attention compute (``thread_time``: what this rank computed, less affected by other ranks
    sharing the cores than wall time) and the smallest wall time. Returns, per scheme: ``tiles``
    per step, ``cpu_s`` and ``wall_s`` per step, ``total_wall_s`` (the whole ring, min over
    repeats) and the rank's output rows of the last run (``idx``, ``out``) so the caller can check
    exactness.
    """
    import torch
    import torch.distributed as dist

    from .worker import device

    rank, p = dist.get_rank(), dist.get_world_size()
    dt = getattr(torch, dtype)
    q, k, v, _ = make_inputs(s, heads, d, seed, dt)
    torch.matmul(q[0, :64], k[0, :64].T)  # warm the kernels before timing
    res = {}
    for scheme in schemes:
        idx = partition_indices(s, p, scheme)[rank]
        ti = torch.as_tensor(idx)
        ql, kl, vl = (x.index_select(1, ti).to(device()) for x in (q, k, v))
        cpu, wall, total, tiles = None, None, math.inf, None
        for _ in range(repeats):
            stats: dict = {}
            dist.barrier()
            t0 = time.perf_counter()
            with torch.no_grad():
                out = ring_attention(ql, kl, vl, scheme=scheme, causal=True, tile=tile, stats=stats)
            total = min(total, time.perf_counter() - t0)
            f = stats["forward"]
            cpu = f["compute_cpu_s"] if cpu is None else [min(a, b) for a, b in zip(cpu, f["compute_cpu_s"])]
            wall = f["compute_s"] if wall is None else [min(a, b) for a, b in zip(wall, f["compute_s"])]
            tiles = f["tiles"]
        res[scheme] = {"tiles": tiles, "cpu_s": cpu, "wall_s": wall, "total_wall_s": total, "idx": idx, "out": out}
    return res
