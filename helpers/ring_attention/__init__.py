"""Context parallelism: ring attention on the launcher's ranks, and its cost models (P.10, 12.3.2).

The public face of the sections: import everything from here. The pieces live in modules that
each read in one sitting:

* :mod:`helpers.ring_attention.partition` (numpy, torch-free): partitions of the sequence over ranks
  (``contiguous``, ``striped``, ``zigzag``), padding for a length that does not divide, the
  causal work each rank does (unmasked query/key pairs, tiles), and the cost models: K/V memory,
  ring bytes, all-gather and all-to-all (Ulysses) bytes, attention FLOPs;
* :mod:`helpers.ring_attention.kernel`: a tiled block kernel that skips fully masked tiles, the online-softmax
  merge in torch, and a meter of the K/V bytes alive on a rank;
* :mod:`helpers.ring_attention.core`: the forward and backward rings as a ``torch.autograd.Function``
  (:func:`ring_attention`);
* this module: seeded inputs, single-process references, and the worker functions for
  :func:`helpers.launcher.launch` (also runnable under torchrun): the ring itself, the two other
  designs (all-gather K/V, Ulysses all-to-all of heads), the causal load balance of the schemes,
  the ring on its own CP group beside a TP group, and the ring with and without overlap.
  The numpy version of the merge is :mod:`helpers.attention_numpy`.

Tensor layout on a rank: ``(heads, tokens, head_dim)``.
"""
from __future__ import annotations

import math
import time

import numpy as np

from ..launcher.commlog import mark, ops_since
from ..launcher.worker import device
from ..validate import integer_at_least
from .core import RingConfig, ring_attention, ring_backward, ring_forward
from .kernel import (
    BufferMeter,
    acc_dtype,
    block_backward,
    block_forward,
    merge_into,
    tile_plan,
    tolerance,
    track,
)
from .partition import (
    SCHEMES,
    allgather_kv_bytes_per_rank,
    allowed,
    attention_flops,
    kv_bytes,
    padded_length,
    partition_indices,
    ring_backward_bytes_per_rank,
    ring_bytes_per_rank,
    ring_step_times,
    score_matrix_bytes,
    tile_ok,
    ulysses_bytes_per_rank,
    work_table,
)

__all__ = [
    # ring_partition
    "SCHEMES", "padded_length", "partition_indices", "allowed", "tile_ok", "work_table", "score_matrix_bytes", "kv_bytes",
    "ring_bytes_per_rank", "ring_backward_bytes_per_rank", "allgather_kv_bytes_per_rank", "ulysses_bytes_per_rank",
    "attention_flops", "ring_step_times",
    # ring_kernel
    "tolerance", "acc_dtype", "tile_plan", "block_forward", "merge_into", "block_backward", "BufferMeter", "track",
    # ring_core
    "RingConfig", "ring_forward", "ring_backward", "ring_attention",
    # this module
    "make_inputs", "reference_attention", "single_process_attention", "assemble", "ring_attention_worker",
    "compare_results", "designs_worker", "causal_balance_worker", "cp_tp_worker", "output_projection", "overlap_worker",
]


# ---- inputs, references and assembling results ----------------------------------------------

def make_inputs(s: int, heads: int, d: int, seed: int = 0, dtype=None):
    """Global q, k, v and an upstream gradient dout, each ``(heads, s, d)``, identical on every rank."""
    import torch

    integer_at_least(s, "s")
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
    """Ring-model bytes this rank sent since the :func:`helpers.launcher.commlog.mark` ``start`` (nan outside a job)."""

    return float(sum(o.model_sent for o in ops_since(start))) if start.log is not None else float("nan")


def designs_worker(s: int, heads: int, d: int, *, causal: bool = False, seed: int = 0, dtype: str = "float32"):
    """Attention on the same ranks three ways, forward pass (12.3.2, P.10): ring, all-gather K/V, Ulysses.

    For each: this rank's output rows, the bytes it sent (from the communication log: send bytes
    for the ring, ring-model bytes of each collective) and the peak bytes of K/V it held (own shard
    included), measured by :class:`BufferMeter`. Contiguous partition for all three.
    """
    import torch
    import torch.distributed as dist

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
    full = track(meter, torch.empty((p * 2,) + tuple(kv.shape[1:]), dtype=kv.dtype, device=dev), "kv")
    dist.all_gather_single(full, kv)
    del kv
    parts = full.view((p, 2) + tuple(full.shape[1:]))  # (rank, k/v, heads, n, d)
    kf = parts[:, 0].permute(1, 0, 2, 3).reshape(heads, s, d)
    vf = parts[:, 1].permute(1, 0, 2, 3).reshape(heads, s, d)
    plan = tile_plan(idx, np.arange(s), causal, None, n)
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
    kh = track(meter, to_heads(kl), "kv")
    vh = track(meter, to_heads(vl), "kv")
    plan = tile_plan(np.arange(s), np.arange(s), causal, None, s)
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


def cp_tp_worker(s: int, heads: int, d: int, *, cp: int, tp: int, scheme: str = "zigzag", causal: bool = True,
                 seed: int = 0):
    """Attention with context and tensor parallelism on separate process groups (12.3.2), float64, forward.

    ``init_device_mesh`` lays the world out as CP x TP (TP innermost). TP rank t holds heads
    ``t H/tp ... (t+1) H/tp - 1`` and the matching rows of the output projection ``W_o``; CP rank c
    holds the tokens of ``partition_indices(s, cp, scheme)[c]``. The K/V ring runs over the CP
    group only; the row-parallel output projection is summed by an all-reduce over the TP group
    only. Returns this rank's ``idx``, its rows of ``attention @ W_o`` and its two groups' members.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if heads % tp:
        raise ValueError(f"tensor parallelism over heads needs tp={tp} to divide heads={heads}")
    dm = init_device_mesh(device().type, (cp, tp), mesh_dim_names=("cp", "tp"))
    cp_group, tp_group = dm.get_group("cp"), dm.get_group("tp")
    c, t = dist.get_rank(cp_group), dist.get_rank(tp_group)
    q, k, v, _ = make_inputs(s, heads, d, seed, torch.float64)
    w_o = output_projection(heads, d, seed)
    hp = heads // tp
    idx = partition_indices(s, cp, scheme)[c]
    ti, hs = torch.as_tensor(idx), slice(t * hp, (t + 1) * hp)
    ql, kl, vl = (x[hs].index_select(1, ti).to(device()) for x in (q, k, v))
    with torch.no_grad():
        out = ring_attention(ql, kl, vl, scheme=scheme, causal=causal, group=cp_group)  # (hp, n, d)
        y = out.permute(1, 0, 2).reshape(len(idx), hp * d) @ w_o[t * hp * d:(t + 1) * hp * d].to(device())
        dist.all_reduce(y, group=tp_group)  # partial sums of the row-parallel projection
    return {"idx": idx, "y": y, "coord": {"cp": c, "tp": t},
            "groups": {"cp": sorted(dist.get_process_group_ranks(cp_group)), "tp": sorted(dist.get_process_group_ranks(tp_group))}}


def output_projection(heads: int, d: int, seed: int = 0):
    """The seeded output projection ``W_o`` of :func:`cp_tp_worker`, ``(heads d, heads d)``, float64."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(heads * d, heads * d, generator=g, dtype=torch.float64) / math.sqrt(heads * d)


def overlap_worker(s: int, heads: int, d: int, *, repeats: int = 5, seed: int = 0, dtype: str = "float32"):
    """Ring attention forward with the transfers overlapped and not (12.3.2), non-causal, timed.

    Alternates ``overlap=False`` (wait for each K/V transfer, then compute) and ``overlap=True``
    (post the transfer, compute, then wait), ``repeats`` times each. Per mode: ``total_s`` (the
    whole ring, min over repeats), per step the smallest ``compute_s`` and ``wait_s`` (with
    overlap off the wait is the transfer itself), and the output rows (``idx``, ``out``).
    """
    import torch
    import torch.distributed as dist

    integer_at_least(repeats, "repeats")
    rank, p = dist.get_rank(), dist.get_world_size()
    q, k, v, _ = make_inputs(s, heads, d, seed, getattr(torch, dtype))
    idx = partition_indices(s, p, "contiguous")[rank]
    ti = torch.as_tensor(idx)
    ql, kl, vl = (x.index_select(1, ti).to(device()) for x in (q, k, v))
    res = {mode: {"total_s": math.inf, "compute_s": None, "wait_s": None} for mode in ("off", "on")}
    for _ in range(repeats):
        for mode in ("off", "on"):
            stats: dict = {}
            dist.barrier()
            t0 = time.perf_counter()
            with torch.no_grad():
                out = ring_attention(ql, kl, vl, stats=stats, overlap=mode == "on")
            r, f = res[mode], stats["forward"]
            r["total_s"] = min(r["total_s"], time.perf_counter() - t0)
            for key in ("compute_s", "wait_s"):
                r[key] = f[key] if r[key] is None else [min(a, b) for a, b in zip(r[key], f[key])]
            r["idx"], r["out"] = idx, out
    return res
