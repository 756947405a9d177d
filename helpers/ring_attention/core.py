"""Ring attention on the launcher's ranks: the forward and backward rings (12.3.2, P.10).

The sequence is cut into ``p`` shards, one per rank. Each rank keeps its query shard and passes
key/value shards around a ring (to rank ``r+1``, from rank ``r-1``), with the send of the block it
is working on and the receive of the next one in flight while it computes (two buffers,
"ping-pong"). Partial results are merged with the online softmax (:mod:`helpers.ring_attention.kernel`).
The backward pass goes round the ring again: K/V travel as in the forward pass, and the dK/dV
accumulators travel with them, collecting every rank's contribution, until they arrive home.
:func:`ring_attention` wraps both as a ``torch.autograd.Function``.

Tensor layout on a rank: ``(heads, tokens, head_dim)``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..launcher.commlog import span
from .kernel import BufferMeter, acc_dtype, block_backward, block_forward, merge_into, tile_plan, track
from .partition import SCHEMES, partition_indices

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
    group: object = None  # the context-parallel process group (None: the whole world)


def _ring_exchange(send_buf, recv_buf, rank, p, group=None):
    """Post send to ring position rank+1 and receive from rank-1 (non-blocking); return the requests.

    ``rank`` and ``p`` are positions in ``group`` (the world when None); the peers are named by
    their global ranks, as ``P2POp`` wants them.
    """
    import torch.distributed as dist

    def peer(i):
        return i % p if group is None else dist.get_global_rank(group, i % p)

    ops = [dist.P2POp(dist.isend, send_buf, peer(rank + 1), group), dist.P2POp(dist.irecv, recv_buf, peer(rank - 1), group)]
    return dist.batch_isend_irecv(ops)


def _ring_setup(q, cfg):
    """What the forward and the backward ring both start from: rank, ring size, shapes, this
    rank's token positions, tile size, softmax scale and accumulation dtype."""
    import torch.distributed as dist

    rank, p = dist.get_rank(cfg.group), dist.get_world_size(cfg.group)
    H, n, d = q.shape
    tile = n if cfg.tile is None else cfg.tile
    return rank, p, H, n, d, _positions(n, p, cfg), tile, 1.0 / math.sqrt(d), acc_dtype(q.dtype)


def _positions(n_local, p, cfg):
    return partition_indices(n_local * p, p, cfg.scheme)


def _span(name):

    return span(name)


def ring_forward(q, k, v, cfg: RingConfig):
    """Forward ring on this rank: returns ``(out, lse)``; ``out`` in q's dtype, ``lse`` in float32/64."""
    import torch

    rank, p, H, n, d, pos, tile, scale, acc = _ring_setup(q, cfg)
    out = torch.zeros(H, n, v.shape[-1], dtype=acc, device=q.device)
    lse = torch.full((H, n), -math.inf, dtype=acc, device=q.device)
    st = cfg.stats.setdefault("forward", {"compute_s": [], "compute_cpu_s": [], "wait_s": [], "tiles": [], "src": []})
    cur = track(cfg.meter, torch.stack([k, v]), "kv")  # the outgoing buffer for step 0
    for j in range(p):
        src = (rank - j) % p
        reqs, nxt = None, None
        if j < p - 1:
            nxt = track(cfg.meter, torch.empty_like(cur), "kv")
            if cfg.overlap:
                reqs = _ring_exchange(cur, nxt, rank, p, cfg.group)
            else:
                t0 = time.perf_counter()
                for r in _ring_exchange(cur, nxt, rank, p, cfg.group):
                    r.wait()
                st["wait_s"].append(time.perf_counter() - t0)
        plan = tile_plan(pos[rank], pos[src], cfg.causal, cfg.valid_len, tile)
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
    cur = track(cfg.meter, torch.stack([k, v]), "kv")
    dcur = track(cfg.meter, torch.zeros((2,) + tuple(k.shape), dtype=acc, device=q.device), "dkv")
    d_reqs = dnxt = None
    for j in range(p):
        src = (rank - j) % p
        reqs, nxt = None, None
        if j < p - 1:
            nxt = track(cfg.meter, torch.empty_like(cur), "kv")
            reqs = _ring_exchange(cur, nxt, rank, p, cfg.group)
        plan = tile_plan(pos[rank], pos[src], cfg.causal, cfg.valid_len, tile)
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
                dcur, dnxt = dnxt, None  # the arrived buffer is the accumulator now
            if bq is not None:
                dq += bq
                dcur[0] += bk
                dcur[1] += bv
                del bq, bk, bv
            if p > 1:
                dnxt = track(cfg.meter, torch.empty_like(dcur), "dkv")
                d_reqs = _ring_exchange(dcur, dnxt, rank, p, cfg.group)
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
                   overlap: bool = True, group=None):
    """Ring attention over the ranks of ``group`` (default: the world) on this rank's shards
    ``q, k, v`` of ``(heads, s/p, d)``; ring position and ``p`` are this rank's in ``group``.

    Differentiable: ``backward`` runs the backward ring. ``scheme`` says which token positions
    each rank holds (the same on all ranks); ``valid_len`` hides padding keys; ``tile`` enables
    skipping of fully masked tiles; ``meter`` records the K/V buffers' lifetimes; ``stats`` (a
    dict) receives per-step compute and wait times and tile counts; ``overlap=False`` waits for
    each transfer before computing (the baseline the overlap is measured against).
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
    cfg = RingConfig(scheme, causal, valid_len, tile, meter, {} if stats is None else stats, overlap, group)
    return _FN.apply(q, k, v, cfg)
