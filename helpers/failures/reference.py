"""How parallel jobs fail, on paper and in numpy (P.14): the exact models beside the injected failures.

Torch-free. The workers that inject each failure on real ranks are :mod:`helpers.failures`.

1. **Stragglers**: :func:`straggler_arithmetic` is the section's step/efficiency/idle arithmetic;
   :func:`straggler_from_measurement` recomputes the same figures from what the ranks measured.
2. **Uneven micro-batches**: sequences of different lengths; the plain average of per-rank
   token-mean gradients against token-weighted gradients (:func:`token_grad_numpy`,
   :func:`plain_and_weighted`), and greedy length balancing (:func:`balance_by_tokens`).
5. **MTBF and the interval**: :func:`cluster_mtbf`, :func:`young_interval`,
   :func:`expected_wall_time` (exact for exponential failures), :func:`first_order_overhead`,
   :func:`simulate_checkpointing` (Monte Carlo, failure by failure), :func:`optimal_interval`.
6. **Reproducibility**: :func:`sum_in_order`, :func:`bits_differ`, :func:`micro_shard_partials`.
"""
from __future__ import annotations

import math

import numpy as np

from ..validate import durations as _durations
from ..validate import integer_at_least as _pos_int
from ..validate import positive_number as _pos_real

# ==== 1. stragglers ===============================================================================

def straggler_arithmetic(compute, allreduce: float, nominal: float | None = None) -> dict:
    """The section's straggler arithmetic for one synchronous step (P.14).

    ``compute`` holds each worker's compute time, ``allreduce`` the all-reduce time that follows.
    Every worker leaves the step when the last one arrives, so the step takes ``max + allreduce``.
    ``nominal`` is the compute time a healthy worker takes (default: the median), so the step
    without the straggler takes ``nominal + allreduce``. Returns:

    * ``step`` and ``nominal_step``; ``efficiency = nominal_step / step``;
    * ``idle``: worker-time spent waiting for the slowest, ``sum(max - c_i)``, out of
      ``worker_time = N * step``; ``idle_fraction``;
    * ``excess``: the time the slow workers spent beyond ``nominal`` (busy, but slowly);
      ``(idle + excess) / worker_time`` equals ``1 - efficiency`` when only one rank is slow;
    * ``mean_compute`` and ``slowest``.
    """
    c = _durations(compute, "compute")
    ar = _pos_real(allreduce, "allreduce", allow_zero=True)
    nom = float(np.median(c)) if nominal is None else _pos_real(nominal, "nominal", allow_zero=True)
    slowest = max(c)
    step = slowest + ar
    if step == 0:
        raise ValueError("the step must take some time: compute and all-reduce are all zero")
    n = len(c)
    idle = sum(slowest - x for x in c)
    excess = sum(max(x - nom, 0.0) for x in c)
    return {
        "workers": n, "step": step, "nominal_step": nom + ar, "efficiency": (nom + ar) / step,
        "idle": idle, "worker_time": n * step, "idle_fraction": idle / (n * step),
        "excess": excess, "lost_fraction": (idle + excess) / (n * step),
        "mean_compute": sum(c) / n, "slowest": slowest,
    }


def straggler_from_measurement(results: list[dict], nominal: float | None = None) -> dict:
    """The section's arithmetic recomputed from :func:`straggler_worker`'s per-rank records.

    Per step, the rank that arrived last spent only the pure all-reduce time inside the call, so
    its all-reduce time is taken as the collective's own cost; every other rank's extra time in
    the call is waiting. Averages over steps are fed to :func:`straggler_arithmetic`, and the
    directly measured idle (sum of waits) and step times are returned beside it.

    ``release_after_last_arrival`` (per step, seconds) is the first rank's exit from the
    all-reduce minus the last rank's entry, on the shared host clock: an all-reduce cannot
    return anywhere before every rank has contributed, so on one host it is never negative.
    Per-rank step *durations* do not obey such a bound: each rank starts its step when it left
    the previous all-reduce, and ranks leave a collective up to a few ms apart under load.
    """
    if not results or any(set(r) < {"compute", "allreduce", "step"} for r in results):
        raise ValueError("results must be the list of per-rank dicts that straggler_worker returns")
    comp = np.array([r["compute"] for r in results])  # (ranks, steps)
    ar = np.array([r["allreduce"] for r in results])
    step = np.array([r["step"] for r in results])
    last = comp.argmax(axis=0)  # per step: the rank that arrived last
    pure = ar[last, np.arange(comp.shape[1])]
    waits = ar - pure  # >= 0 up to clock noise
    model = straggler_arithmetic(comp.mean(axis=1), float(pure.mean()), nominal)
    measured_step = float(step.mean())
    release = None
    if all("arrive_clock" in r and "leave_clock" in r for r in results):
        arrive_c = np.array([r["arrive_clock"] for r in results])
        leave_c = np.array([r["leave_clock"] for r in results])
        release = (leave_c.min(axis=0) - arrive_c.max(axis=0)).tolist()
    return {
        "model": model,
        "measured_step": measured_step,
        "measured_idle_fraction": float(np.clip(waits, 0, None).sum() / step.sum()),  # step.sum(): all ranks' time
        "measured_efficiency": model["nominal_step"] / measured_step,
        "pure_allreduce": float(pure.mean()),
        "mean_compute_per_rank": comp.mean(axis=1).tolist(),
        "mean_step_per_rank": step.mean(axis=1).tolist(),
        "release_after_last_arrival": release,
    }


# ==== 2. uneven micro-batches ======================================================================

def make_token_batch(lengths, features: int = 4, seed: int = 0):
    """Sequences of the given lengths as a token-level regression problem (P.14).

    Returns ``X`` (tokens, features), ``y`` (tokens,), ``seq`` (tokens,) the sequence each token
    belongs to, and ``w`` (features,) the current weights.
    """
    lengths = [_pos_int(x, "every sequence length") for x in lengths]
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    X = rng.normal(size=(n, features))
    y = X @ rng.normal(size=features) + rng.normal(size=n)
    seq = np.repeat(np.arange(len(lengths)), lengths)
    return X, y, seq, rng.normal(size=features)


def token_grad_numpy(X, y, w) -> np.ndarray:
    """Gradient of the per-token mean loss 0.5 * mean((X w - y)^2) over the given tokens."""
    if len(y) == 0:
        raise ValueError("need at least one token")
    return X.T @ (X @ w - y) / len(y)


def sequences_per_rank(n_seqs: int, ranks: int) -> list[list[int]]:
    """Sequence indices dealt out to ranks in equal-count contiguous blocks (the usual sampler)."""
    n_seqs, ranks = _pos_int(n_seqs, "n_seqs"), _pos_int(ranks, "ranks")
    if n_seqs % ranks:
        raise ValueError(f"{ranks} ranks must divide the {n_seqs} sequences (equal sequence counts per rank)")
    k = n_seqs // ranks
    return [list(range(r * k, (r + 1) * k)) for r in range(ranks)]


def plain_and_weighted(X, y, seq, w, assignment) -> tuple[np.ndarray, np.ndarray]:
    """numpy version of the two reductions: (mean of per-rank token means, token-weighted mean)."""
    grads, counts = [], []
    for seqs in assignment:
        m = np.isin(seq, seqs)
        grads.append(token_grad_numpy(X[m], y[m], w))
        counts.append(int(m.sum()))
    counts = np.array(counts, dtype=float)
    plain = np.mean(grads, axis=0)
    weighted = (np.array(grads) * counts[:, None]).sum(axis=0) / counts.sum()
    return plain, weighted


def balance_by_tokens(lengths, ranks: int) -> list[list[int]]:
    """Greedy length balancing: longest sequence first, to the rank with fewest tokens so far.

    The remedy the section calls length-bucketed batching in its simplest form; returns the
    sequence indices per rank (counts may differ, token totals are close).
    """
    lengths = [_pos_int(x, "every sequence length") for x in lengths]
    ranks = _pos_int(ranks, "ranks")
    if len(lengths) < ranks:
        raise ValueError(f"need at least as many sequences ({len(lengths)}) as ranks ({ranks})")
    loads, out = [0] * ranks, [[] for _ in range(ranks)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(ranks), key=lambda r: (loads[r], r))
        out[r].append(i)
        loads[r] += lengths[i]
    return [sorted(s) for s in out]


def token_imbalance(lengths, assignment) -> dict:
    """Tokens per rank, and the step efficiency mean/max they imply when time is proportional to tokens."""
    tokens = [sum(lengths[i] for i in seqs) for seqs in assignment]
    if max(tokens) == 0:
        raise ValueError("no tokens assigned")
    return {"tokens": tokens, "max_over_mean": max(tokens) / np.mean(tokens), "efficiency": np.mean(tokens) / max(tokens)}


# ==== 5. MTBF and the checkpoint interval ==========================================================

def cluster_mtbf(device_mtbf: float, devices: int) -> float:
    """Mean time between failures of a job on ``devices`` independent devices: MTBF / N (P.14)."""
    return _pos_real(device_mtbf, "device_mtbf") / _pos_int(devices, "devices")


def young_interval(ckpt_cost: float, mtbf: float) -> float:
    """Young's first-order optimal checkpoint interval sqrt(2 C M) (P.14)."""
    return math.sqrt(2 * _pos_real(ckpt_cost, "ckpt_cost") * _pos_real(mtbf, "mtbf"))


def first_order_overhead(interval: float, ckpt_cost: float, mtbf: float, restart: float = 0.0) -> float:
    """Wasted time per unit of useful work, to first order: C/tau + (tau/2 + R)/M.

    C/tau for writing checkpoints; each failure (one per M) loses half an interval of work on
    average plus the restart time. Minimising over tau gives Young's sqrt(2 C M).
    """
    tau = _pos_real(interval, "interval")
    C, M = _pos_real(ckpt_cost, "ckpt_cost", True), _pos_real(mtbf, "mtbf")
    R = _pos_real(restart, "restart", True)
    return C / tau + (tau / 2 + R) / M


def _segments(work: float, interval: float) -> np.ndarray:
    W, tau = _pos_real(work, "work"), _pos_real(interval, "interval")
    n_full = int(W // tau)
    rest = W - n_full * tau
    segs = [tau] * n_full + ([rest] if rest > 1e-9 * tau else [])
    return np.array(segs)


def expected_wall_time(work: float, interval: float, ckpt_cost: float, mtbf: float, restart: float = 0.0) -> float:
    """Exact expected wall time of a job with exponential failures (rate 1/M) and checkpointing.

    The job is ``work`` seconds of computation cut into segments of ``interval``; each segment is
    followed by a checkpoint of ``ckpt_cost`` seconds and counts only when both finish without a
    failure. A failure loses the segment in progress and costs ``restart`` seconds (failure-free).
    A segment of length s = tau + C then takes (M + R)(exp(s/M) - 1) on average: the expected
    number of failures before it gets through is exp(s/M) - 1, each costing R plus the time it
    ran, and the memorylessness of the exponential makes the segments independent.
    """
    C, M = _pos_real(ckpt_cost, "ckpt_cost", True), _pos_real(mtbf, "mtbf")
    R = _pos_real(restart, "restart", True)
    s = _segments(work, interval) + C
    return float(((M + R) * np.expm1(s / M)).sum())


def simulate_checkpointing(work: float, interval: float, ckpt_cost: float, mtbf: float, restart: float = 0.0,
                           runs: int = 2000, seed: int = 0) -> dict:
    """Monte Carlo of the same job, failure by failure (P.14).

    For every run, every segment is attempted until an exponential time-to-failure (mean
    ``mtbf``) exceeds the segment plus its checkpoint; each failed attempt adds the time it ran
    (lost work, or an interrupted checkpoint) and the restart. Returns per-run arrays ``wall`` and
    ``lost`` (time spent on attempts that failed) and ``failures``, and the totals of
    ``checkpointing`` and ``restarts``.
    """
    C, M = _pos_real(ckpt_cost, "ckpt_cost", True), _pos_real(mtbf, "mtbf")
    R = _pos_real(restart, "restart", True)
    runs = _pos_int(runs, "runs")
    rng = np.random.default_rng(seed)
    segs = _segments(work, interval)
    lost = np.zeros(runs)
    fails = np.zeros(runs, dtype=np.int64)
    for seg in segs:
        s = seg + C
        pending = np.ones(runs, dtype=bool)
        while pending.any():
            t = rng.exponential(M, size=int(pending.sum()))
            failed = t < s
            idx = np.flatnonzero(pending)
            lost[idx[failed]] += t[failed]
            fails[idx[failed]] += 1
            pending[idx[~failed]] = False
    ckpt = len(segs) * C
    wall = float(segs.sum()) + ckpt + lost + R * fails
    return {"wall": wall, "lost": lost, "failures": fails, "checkpointing": ckpt, "restarts": R * fails,
            "work": float(segs.sum())}


def optimal_interval(work: float, ckpt_cost: float, mtbf: float, restart: float = 0.0, lo: float | None = None,
                     hi: float | None = None) -> float:
    """The interval that minimises :func:`expected_wall_time`'s per-work overhead, found numerically.

    Uses the per-segment rate (M + R)(exp((tau + C)/M) - 1) / tau, which ignores the last partial
    segment, minimised by golden-section search on [lo, hi] (default: Young's value /20 .. x20).
    """
    C, M = _pos_real(ckpt_cost, "ckpt_cost"), _pos_real(mtbf, "mtbf")
    R = _pos_real(restart, "restart", True)
    _pos_real(work, "work")
    y = young_interval(C, M)
    a, b = (y / 20 if lo is None else lo), (y * 20 if hi is None else hi)
    f = lambda tau: (M + R) * math.expm1((tau + C) / M) / tau
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(200):
        if f(c) < f(d):
            b, d = d, c
            c = b - g * (b - a)
        else:
            a, c = c, d
            d = a + g * (b - a)
    return (a + b) / 2


# ==== 6. reproducibility ===========================================================================

def sum_in_order(parts, order=None) -> np.ndarray:
    """Add float32 arrays one at a time in ``order`` (default: as given), in float32 (P.14)."""
    parts = [np.asarray(p, dtype=np.float32) for p in parts]
    if not parts:
        raise ValueError("need at least one array to sum")
    order = list(range(len(parts))) if order is None else list(order)
    if sorted(order) != list(range(len(parts))):
        raise ValueError(f"order must be a permutation of 0..{len(parts) - 1}, got {order}")
    acc = parts[order[0]].copy()
    for i in order[1:]:
        acc = acc + parts[i]
    return acc


def bits_differ(a, b) -> dict:
    """How many float32 elements of a and b differ in their bits, and by how many units in the last place."""
    a32, b32 = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    if a32.shape != b32.shape:
        raise ValueError(f"shapes differ: {a32.shape} vs {b32.shape}")
    ia, ib = a32.view(np.int32).astype(np.int64), b32.view(np.int32).astype(np.int64)
    # map the sign-magnitude bit patterns onto a monotone integer line, so the difference counts ulps
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    d = np.abs(ia - ib)
    return {"elements": int(a32.size), "differ": int((d > 0).sum()), "max_ulps": int(d.max(initial=0))}


def micro_shard_partials(n_shards: int = 8, length: int = 4096, seed: int = 0) -> np.ndarray:
    """``n_shards`` float32 partial gradients of different magnitudes, one per fixed micro-shard."""
    n_shards, length = _pos_int(n_shards, "n_shards"), _pos_int(length, "length")
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.uniform(-2, 2, size=(n_shards, 1))
    return (rng.normal(size=(n_shards, length)) * scales).astype(np.float32)
