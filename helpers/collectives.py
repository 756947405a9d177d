"""Collectives (P.7, and 12.1.2's all-reduce = reduce-scatter + all-gather).

numpy side: the ring all-reduce over N devices stepped through exactly (reduce-scatter, then
all-gather, N-1 steps each), reduce-scatter and all-gather on their own, the bytes each device
sends, and the α-β time model with a least-squares fit to measured times.
torch side: a hand-written ring all-reduce over ``isend``/``irecv`` that must match
``dist.all_reduce``, and workers that check it and time both over message sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import costs
from .validate import integer_at_least


# ---- numpy: the ring, step by step -----------------------------------------------------------

@dataclass
class RingStep:
    """The state of every device after one ring step (P.7's figure, with real numbers)."""

    phase: str  # "start", "reduce-scatter" or "all-gather"
    step: int  # 1..N-1 within the phase (0 for "start")
    chunks: np.ndarray  # shape (N devices, N chunks, chunk length): what each device holds
    sends: list[tuple[int, int, int]]  # (from device, to device, chunk index) in this step


def _chunk(buffers: np.ndarray) -> np.ndarray:
    buffers = np.asarray(buffers, dtype=float)
    if buffers.ndim != 2:
        raise ValueError(f"buffers must be 2-D (devices x elements), got shape {buffers.shape}")
    n, length = buffers.shape
    if n < 2:
        raise ValueError(f"a ring needs at least 2 devices, got {n}")
    if length % n:
        raise ValueError(f"{n} devices do not divide a message of {length} elements into equal chunks")
    return buffers.reshape(n, n, length // n).copy()


def ring_allreduce_steps(buffers) -> list[RingStep]:
    """Every state of a ring all-reduce (sum) of ``buffers[d]`` over devices d = 0..N-1.

    In reduce-scatter step s (0-based), device d sends chunk (d - s) mod N to device d+1, which
    adds it to its own copy; after N-1 steps device d owns the full sum of chunk (d+1) mod N.
    In all-gather step s, device d sends chunk (d + 1 - s) mod N, which the receiver overwrites.
    """
    chunks = _chunk(buffers)
    n = chunks.shape[0]
    states = [RingStep("start", 0, chunks.copy(), [])]
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            offset = -s if phase == "reduce-scatter" else 1 - s
            sends = [(d, (d + 1) % n, (d + offset) % n) for d in range(n)]
            payload = [chunks[src, c].copy() for src, _, c in sends]  # all send at once
            for (src, dst, c), data in zip(sends, payload):
                chunks[dst, c] = chunks[dst, c] + data if phase == "reduce-scatter" else data
            states.append(RingStep(phase, s + 1, chunks.copy(), sends))
    return states


def ring_allreduce(buffers) -> np.ndarray:
    """The result of the ring all-reduce on every device, shape (N, elements)."""
    final = ring_allreduce_steps(buffers)[-1].chunks
    return final.reshape(final.shape[0], -1)


def reduce_scatter(buffers) -> np.ndarray:
    """Device d ends with chunk d of the elementwise sum (shape N x chunk)."""
    chunks = _chunk(buffers)
    return chunks.sum(axis=0)


def all_gather(pieces) -> np.ndarray:
    """Every device ends with the concatenation of all devices' pieces (shape N x N*chunk)."""
    pieces = np.asarray(pieces, dtype=float)
    if pieces.ndim != 2:
        raise ValueError(f"pieces must be 2-D (devices x chunk), got shape {pieces.shape}")
    return np.tile(pieces.reshape(1, -1), (pieces.shape[0], 1))


def bytes_sent_per_device(states: list[RingStep], bytes_per_element: int = 8) -> np.ndarray:
    """Bytes each device sent over a recorded ring run (counted from the sends, not a formula)."""
    n, _, chunk = states[0].chunks.shape
    sent = np.zeros(n)
    for st in states:
        for src, _, _ in st.sends:
            sent[src] += chunk * bytes_per_element
    return sent


# ---- the α-β model -----------------------------------------------------------------------------

def ring_allreduce_bytes(n: int, size_bytes: float) -> float:
    """Bytes each device sends in a ring all-reduce of ``size_bytes``: 2(N-1)/N * S (P.7;
    :func:`helpers.costs.allreduce_bytes`)."""
    return costs.allreduce_bytes(n, size_bytes)


def alpha_beta_time(n: int, size_bytes, alpha: float, beta: float):
    """T = 2(N-1) α + 2(N-1)/N · S / β (P.7): α seconds per step, β bytes per second per link.

    ``size_bytes`` may be a number, a list or an array (:func:`helpers.costs.alpha_beta_time`).
    """
    return costs.alpha_beta_time(n, np.asarray(size_bytes, dtype=float), alpha, beta)


def fit_alpha_beta(n: int, sizes_bytes, times_s) -> tuple[float, float]:
    """Least-squares α (s) and β (bytes/s) of the ring model from measured all-reduce times."""
    sizes_bytes, times_s = np.asarray(sizes_bytes, float), np.asarray(times_s, float)
    integer_at_least(n, "N (fitting needs two devices or more)", 2)
    if sizes_bytes.shape != times_s.shape or len(sizes_bytes) < 2:
        raise ValueError("need at least two (size, time) pairs of equal length")
    A = np.column_stack([np.full_like(sizes_bytes, costs.ring_steps("all_reduce", n)), ring_allreduce_bytes(n, 1.0) * sizes_bytes])
    (alpha, inv_beta), *_ = np.linalg.lstsq(A, times_s, rcond=None)
    if inv_beta <= 0:
        raise ValueError("the fitted bandwidth term is not positive: measure larger messages")
    return max(alpha, 0.0), 1.0 / inv_beta


# ---- torch: a ring all-reduce by hand ------------------------------------------------------------

def ring_all_reduce(tensor, group=None):
    """Sum ``tensor`` over all ranks in place with a ring of isend/irecv (P.7), and return it.

    The flat tensor is cut into N chunks (the last ones may be shorter). Reduce-scatter: in step
    s, rank r sends chunk (r - s) mod N to rank r+1 and adds chunk (r - s - 1) mod N from rank
    r-1. All-gather: the same ring, copying instead of adding. Each rank sends 2(N-1)/N of the
    tensor in total.
    """
    import torch
    import torch.distributed as dist

    from .commlog import span

    n = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if n == 1:
        return tensor
    peers = [dist.get_global_rank(group, i) if group is not None else i for i in range(n)]
    right, left = peers[(rank + 1) % n], peers[(rank - 1) % n]
    flat = tensor.view(-1)
    chunks = list(torch.tensor_split(flat, n))
    recv_buf = torch.empty_like(chunks[0])
    for phase in ("reduce-scatter", "all-gather"):
        with span(phase):  # recorded when run under the launcher, a no-op elsewhere
            for s in range(n - 1):
                send_idx = (rank - s) % n if phase == "reduce-scatter" else (rank + 1 - s) % n
                recv_idx = (send_idx - 1) % n
                incoming = recv_buf[: chunks[recv_idx].numel()]
                reqs = [dist.isend(chunks[send_idx], right, group=group), dist.irecv(incoming, left, group=group)]
                for req in reqs:
                    req.wait()
                if phase == "reduce-scatter":
                    chunks[recv_idx].add_(incoming)
                else:
                    chunks[recv_idx].copy_(incoming)
    return tensor


def ring_check_worker(numel: int = 1 << 12, seed: int = 0):
    """Compare the hand ring with ``dist.all_reduce`` on this rank's random tensor (P.7)."""
    import torch
    import torch.distributed as dist

    from .worker import device

    g = torch.Generator().manual_seed(seed + dist.get_rank())
    x = torch.randn(numel, generator=g, dtype=torch.float64).to(device())
    mine, reference = x.clone(), x.clone()
    ring_all_reduce(mine)
    dist.all_reduce(reference)
    return {"max_abs_diff": (mine - reference).abs().max().item(), "numel": numel}


def time_allreduce_worker(sizes_bytes=(1 << 10, 1 << 16, 1 << 20, 1 << 22), repeats: int = 5, hand: bool = False):
    """Median wall time of an all-reduce (library or hand ring) per message size, on this rank.

    float32 messages; one warm-up call per size; the same clock on every rank around a barrier.
    """
    import statistics
    import time

    import torch
    import torch.distributed as dist

    from .worker import device

    integer_at_least(repeats, "repeats")
    out = {}
    for size in sizes_bytes:
        x = torch.ones(max(1, int(size) // 4), device=device())
        op = ring_all_reduce if hand else dist.all_reduce
        op(x)  # warm-up
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            op(x)
            times.append(time.perf_counter() - t0)
        out[int(size)] = statistics.median(times)
    return out
