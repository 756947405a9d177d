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
from .launcher.commlog import span
from .launcher.worker import device
from .validate import integer_at_least, one_of

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
    """α (s) and β (bytes/s) of the ring model fitted to measured all-reduce times (P.7).

    Least squares on *relative* residuals, (model - t) / t: timing noise grows with the time, and
    so weighted the small messages fix α while the large ones fix β (unweighted, the largest
    message's noise alone sets α). α is kept >= 0: when the free fit gives α < 0, β is refitted
    with α = 0, the constrained least-squares optimum. ValueError when the times do not grow with
    the message size (a bandwidth term that is not positive): such timings are noise, and the
    message says so with the smallest and largest sizes' times.
    """
    sizes_bytes, times_s = np.asarray(sizes_bytes, float), np.asarray(times_s, float)
    integer_at_least(n, "N (fitting needs two devices or more)", 2)
    if sizes_bytes.ndim != 1 or sizes_bytes.shape != times_s.shape or len(sizes_bytes) < 2:
        raise ValueError("need at least two (size, time) pairs of equal length")
    if not (np.all(np.isfinite(times_s)) and np.all(times_s > 0)):
        raise ValueError(f"times must be finite and > 0 seconds, got {times_s.tolist()}")
    if not (np.all(np.isfinite(sizes_bytes)) and np.all(sizes_bytes >= 0)) or np.ptp(sizes_bytes) == 0:
        raise ValueError(f"sizes must be finite, >= 0 and not all equal, got {sizes_bytes.tolist()}")
    A = np.column_stack([np.full_like(sizes_bytes, costs.ring_steps("all_reduce", n)),
                         ring_allreduce_bytes(n, 1.0) * sizes_bytes]) / times_s[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(A, np.ones_like(times_s), rcond=None)
    if inv_beta <= 0:
        lo, hi = np.argmin(sizes_bytes), np.argmax(sizes_bytes)
        raise ValueError(
            f"the fitted bandwidth term is not positive: the measured times do not grow with message size "
            f"({sizes_bytes[lo]:.0f} B: {times_s[lo] * 1e3:.3g} ms, {sizes_bytes[hi]:.0f} B: {times_s[hi] * 1e3:.3g} ms); "
            "they are noise, not a transfer cost (a loaded machine?): measure larger messages, or take the minimum of more repeats")
    if alpha < 0:  # the boundary α = 0: one-parameter least squares for 1/β
        alpha, x = 0.0, A[:, 1]
        inv_beta = float(x.sum() / (x @ x))
    return float(alpha), float(1.0 / inv_beta)


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

    g = torch.Generator().manual_seed(seed + dist.get_rank())
    x = torch.randn(numel, generator=g, dtype=torch.float64).to(device())
    mine, reference = x.clone(), x.clone()
    ring_all_reduce(mine)
    dist.all_reduce(reference)
    return {"max_abs_diff": (mine - reference).abs().max().item(), "numel": numel}


def _synchronize(dev) -> None:
    """Wait until the GPU has done the work queued on ``dev`` (NCCL collectives return as soon as
    they are queued); nothing to wait for on a CPU rank, whose gloo calls return when done."""
    if dev.type == "cuda":
        import torch

        torch.cuda.synchronize(dev)


def time_allreduce_worker(sizes_bytes=(1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 24), repeats: int = 5,
                          hand: bool = False, statistic: str = "min"):
    """Seconds of one all-reduce (library or hand ring) per message size, on this rank: the
    fastest of ``repeats`` calls (``statistic="min"``) or their median.

    The minimum is the default because load only ever adds time: a rank waiting for a core stalls
    the whole ring, so the fastest repeat is the nearest to the collective's own cost. (On two
    shared cores at load ~17, the median of 7 repeats of a 1 KB all-reduce ranged 2-15 ms, more than
    a 4 MB message's bandwidth term, and P.7's fit once found no bandwidth term; the minimum
    stayed within 1.2-2 ms.) float32 messages; one warm-up call per size; the ranks lined up by a
    barrier before each call; on a GPU the device is synchronised before the clock starts and
    before it stops (:func:`helpers.launcher.worker.device` says which).
    """
    import statistics
    import time

    import torch
    import torch.distributed as dist

    integer_at_least(repeats, "repeats")
    pick = {"min": min, "median": statistics.median}[one_of(statistic, "statistic", ("min", "median"))]
    dev = device()
    op = ring_all_reduce if hand else dist.all_reduce
    out = {}
    for size in sizes_bytes:
        x = torch.ones(max(1, int(size) // 4), device=dev)
        op(x)  # warm-up
        _synchronize(dev)
        times = []
        for _ in range(repeats):
            dist.barrier()
            _synchronize(dev)
            t0 = time.perf_counter()
            op(x)
            _synchronize(dev)
            times.append(time.perf_counter() - t0)
        out[int(size)] = pick(times)
    return out
