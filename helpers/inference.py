"""Parallelism in inference (P.12): replicas, tensor-parallel serving latency, continuous batching.

Three mechanisms, three different quantities (:data:`MECHANISMS`):

* **replicas** (data parallelism behind a load balancer) raise throughput and cut queueing delay;
  they leave one request's time per token alone;
* **tensor parallelism** cuts the time per token of single-sequence decode, which is bound by
  reading the weights (:func:`decode_time_per_token`), at the price of two latency-bound
  all-reduces per layer per token;
* **continuous batching** (request-level concurrency) raises utilisation and throughput of one
  device during memory-bound decode, at a small price in time per token.

Pieces:

1. The latency model of the section (:func:`decode_time_per_token`, :func:`book_tp_serving`,
   :func:`largest_tp_for_efficiency`) and a per-step cost model for batched decode
   (:class:`StepCost`, :func:`step_cost_from_model`, :func:`kv_bytes_per_token`).
2. A real tensor-parallel decode step with a KV cache on the launcher's ranks, built from the
   Megatron block of :mod:`helpers.tensor_parallel` (its :class:`~helpers.tensor_parallel.ParallelBlock`
   with column- and row-parallel layers): :func:`decode_block`, :func:`tp_decode_worker`, with
   each token's time split into compute and all-reduce.
3. A discrete-event simulation of a request queue served with static or continuous batching on
   one or more replicas (:func:`poisson_workload`, :func:`simulate_serving`, :class:`SimResult`).
"""
from __future__ import annotations

import heapq
import math
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from . import costs
from .launcher.commlog import span
from .validate import index_below
from .validate import integer_at_least as _int
from .validate import positive_number as _pos

MECHANISMS = {
    "replicas": {"improves": "throughput and queueing delay (requests wait less)",
                 "does not change": "time per output token of one request",
                 "costs": "a full copy of the weights per replica"},
    "tensor parallelism": {"improves": "time per output token (each device reads 1/t of the weights); "
                                       "also lets a model too big for one device fit",
                           "does not change": "the number of queues and batches (still one replica)",
                           "costs": "2 all-reduces per layer per token, latency-bound (alpha)"},
    "continuous batching": {"improves": "utilisation and throughput of each device (one weight read "
                                        "serves many requests; slots refilled every step)",
                            "does not change": "the weight-read floor of each step",
                            "costs": "slightly longer steps as the batch grows (KV reads, prefills)"},
}




# ==== 1. the latency model =========================================================================

def hidden_message_bytes(hidden: int = 4096, bytes_per_element: int = 2, tokens: int = 1) -> int:
    """Bytes of the all-reduce payload of one decode step: one hidden vector per token (P.12)."""
    return _int(hidden, "hidden") * _int(bytes_per_element, "bytes_per_element") * _int(tokens, "tokens")


def decode_time_per_token(weight_bytes: float, mem_bw: float, tp: int = 1, layers: int = 32,
                          allreduces_per_layer: int = 2, alpha: float = 15e-6, message_bytes: float = 0.0,
                          link_bw: float | None = None) -> dict:
    """Time per token of single-sequence decode, memory-bound, on ``tp`` tensor-parallel devices (P.12).

    Each device reads ``weight_bytes / tp`` per token at ``mem_bw``. With ``tp > 1`` every layer
    adds ``allreduces_per_layer`` all-reduces of ``message_bytes``, each costing ``alpha`` plus,
    if ``link_bw`` is given, the ring's 2(t-1)/t x message / link_bw. Returns the memory and
    communication parts, the total, and speedup and efficiency against one device.
    """
    W, B = _pos(weight_bytes, "weight_bytes"), _pos(mem_bw, "mem_bw")
    t = _int(tp, "tp (the tensor-parallel degree)")
    L, k = _int(layers, "layers"), _int(allreduces_per_layer, "allreduces_per_layer", 0)
    a, S = _pos(alpha, "alpha", True), _pos(message_bytes, "message_bytes", True)
    per_ar = a + (costs.allreduce_bytes(t, S) / _pos(link_bw, "link_bw") if link_bw is not None else 0.0)
    n_ar = L * k if t > 1 else 0
    memory, comm = W / t / B, n_ar * per_ar
    total = memory + comm
    speedup = (W / B) / total
    return {"tp": t, "memory_s": memory, "allreduces": n_ar, "per_allreduce_s": per_ar if t > 1 else 0.0,
            "comm_s": comm, "total_s": total, "speedup": speedup, "efficiency": speedup / t}


def book_tp_serving() -> dict:
    """The section's example: 14 GB of weights, 1,000 GB/s, TP 4, 32 layers x 2 all-reduces of 15 us."""
    out = decode_time_per_token(14e9, 1000e9, tp=4, layers=32, allreduces_per_layer=2, alpha=15e-6,
                                message_bytes=hidden_message_bytes(4096, 2))
    out["one_device_s"] = 14e9 / 1000e9
    out["message_bytes"] = hidden_message_bytes(4096, 2)
    return out


def largest_tp_for_efficiency(min_efficiency: float, weight_bytes: float, mem_bw: float, layers: int = 32,
                              alpha: float = 15e-6, degrees=(1, 2, 4, 8, 16, 32, 64, 128)) -> int:
    """The largest degree in ``degrees`` whose decode efficiency is still >= ``min_efficiency``."""
    e = _pos(min_efficiency, "min_efficiency")
    if e > 1:
        raise ValueError(f"min_efficiency must be in (0, 1], got {min_efficiency}")
    ok = [t for t in degrees if decode_time_per_token(weight_bytes, mem_bw, t, layers, 2, alpha)["efficiency"] >= e]
    if not ok:
        raise ValueError(f"no degree in {tuple(degrees)} reaches efficiency {e}")
    return max(ok)


def kv_bytes_per_token(layers: int = 32, hidden: int = 4096, bytes_per_element: int = 2) -> int:
    """KV-cache bytes one token of context adds: a key and a value vector per layer (P.12, P.3)."""
    return 2 * _int(layers, "layers") * _int(hidden, "hidden") * _int(bytes_per_element, "bytes_per_element")


@dataclass(frozen=True)
class StepCost:
    """Seconds for one batched decode step: ``fixed + per_seq * batch + prefill * admitted``.

    ``fixed`` is what a step costs whatever the batch (reading the weights, the TP all-reduces),
    ``per_seq`` what each sequence adds (reading its KV cache), ``prefill`` what admitting a new
    request costs in the step it joins (processing its prompt).
    """

    fixed: float
    per_seq: float = 0.0
    prefill: float = 0.0

    def __post_init__(self):
        _pos(self.fixed, "fixed")
        _pos(self.per_seq, "per_seq", True)
        _pos(self.prefill, "prefill", True)

    def __call__(self, batch: int, admitted: int = 0) -> float:
        return self.fixed + self.per_seq * batch + self.prefill * admitted


def step_cost_from_model(weight_bytes: float = 14e9, mem_bw: float = 1000e9, tp: int = 1,
                         kv_bytes_per_seq: float = 1000 * kv_bytes_per_token(), layers: int = 32,
                         alpha: float = 15e-6, prefill_s: float = 0.0) -> StepCost:
    """A :class:`StepCost` from the memory-bound model: weights and KV cache split over ``tp`` devices.

    Default: the section's 7B model (14 GB) on 1,000 GB/s devices with 1,000 tokens of context per
    sequence (0.52 GB of KV cache each, 0.52 ms per step to read). ``prefill_s`` is the prompt cost
    on one device (divided by ``tp`` too).
    """
    t = _int(tp, "tp")
    base = decode_time_per_token(weight_bytes, mem_bw, t, layers, 2, alpha)
    return StepCost(base["total_s"], _pos(kv_bytes_per_seq, "kv_bytes_per_seq", True) / t / mem_bw,
                    _pos(prefill_s, "prefill_s", True) / t)


# ==== 2. a real tensor-parallel decode step =========================================================

def decode_block(block, x, cache: dict):
    """One decode step of a :class:`helpers.tensor_parallel.ParallelBlock` with a KV cache.

    ``x`` is (1, b, h): the new token of each of b sequences, replicated on every rank of the
    block's group. The column-parallel QKV layer gives this rank's heads; their keys and values are
    appended to ``cache`` (``"k"``, ``"v"``: (b, local heads, tokens so far, d)); the new token
    attends to every cached position (decode is causal by construction); the row-parallel output
    projection and the MLP's row-parallel layer each end with the block's all-reduce. Returns the
    (1, b, h) output.
    """
    import torch
    import torch.nn.functional as F

    cfg = block.cfg
    s, b, h = x.shape
    if s != 1 or h != cfg.h:
        raise ValueError(f"a decode step takes one token per sequence, shape (1, b, {cfg.h}); got {tuple(x.shape)}")
    d = cfg.head_dim
    qkv = block.qkv(block.ln1(x))  # column-parallel: no communication
    local = qkv.shape[-1] // (3 * d)
    q, k, v = (z.reshape(b, local, 1, d) for z in qkv.split(local * d, dim=-1))
    cache["k"] = k if cache.get("k") is None else torch.cat([cache["k"], k], dim=2)
    cache["v"] = v if cache.get("v") is None else torch.cat([cache["v"], v], dim=2)
    probs = torch.softmax(q @ cache["k"].transpose(-1, -2) / math.sqrt(d), dim=-1)  # (b, local, 1, T)
    ctx = (probs @ cache["v"]).reshape(1, b, local * d)
    h1 = x + block.o(ctx)  # row-parallel: all-reduce
    return h1 + block.fc2(F.gelu(block.fc1(block.ln2(h1)), approximate="tanh"))  # all-reduce


def build_decoder(cfg, layers: int, seed: int = 0, dtype=None, group=None) -> list:
    """``layers`` Megatron blocks (:class:`helpers.tensor_parallel.ParallelBlock`) on ``group``.

    Layer l's full weights come from seed ``seed + l``, the same on every rank; each rank keeps
    its shard. Outside torch.distributed the blocks hold the full weights (t = 1).
    """
    import torch

    from .tensor_parallel.block import ParallelBlock, make_block_params

    if cfg.p_drop != 0:
        raise ValueError("inference runs without dropout: use a BlockConfig with p_drop=0")
    dtype = torch.float64 if dtype is None else dtype
    with torch.no_grad():
        return [ParallelBlock(make_block_params(cfg, seed + l, dtype=dtype), cfg, group) for l in range(_int(layers, "layers"))]


def decode_inputs(cfg, steps: int, batch: int = 1, seed: int = 1, dtype=None):
    """The (steps, 1, batch, h) stream of new-token vectors fed to the decoder (embeddings stand-in)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(_int(steps, "steps"), 1, _int(batch, "batch"), cfg.h, generator=g, dtype=torch.float64)
    return x.to(torch.float64 if dtype is None else dtype)


@contextmanager
def timed_all_reduces(durations: list):
    """Time every all-reduce the tensor-parallel layers issue (appends seconds to ``durations``).

    Wraps :func:`helpers.tensor_parallel.layers.all_reduce_sum`, the one function through which the
    row-parallel layers all-reduce, for the duration of the ``with`` block. Calls on a group of
    one rank (no communication) are not counted.
    """
    from .tensor_parallel import layers as tpmod

    original = tpmod.all_reduce_sum

    def timed(x, group=None):
        if tpmod.tp_rank_size(group)[1] == 1:
            return original(x, group)  # a group of one: no communication, nothing to time
        t0 = time.perf_counter()
        out = original(x, group)
        durations.append(time.perf_counter() - t0)
        return out

    tpmod.all_reduce_sum = timed
    try:
        yield durations
    finally:
        tpmod.all_reduce_sum = original


def run_decoder(blocks, xs, timed: bool = False) -> dict:
    """Feed ``xs`` (steps, 1, b, h) through ``blocks`` one token at a time with KV caches.

    Returns the (steps, 1, b, h) outputs and, with ``timed=True``, per token the wall time, the
    time spent inside all-reduces and their number.
    """
    import torch

    caches = [{} for _ in blocks]
    outs, tok_s, ar_s, ar_n = [], [], [], []
    with torch.no_grad():
        for x in xs:
            durations: list = []
            t0 = time.perf_counter()
            with timed_all_reduces(durations):
                for blk, cache in zip(blocks, caches):
                    x = decode_block(blk, x, cache)
            tok_s.append(time.perf_counter() - t0)
            ar_s.append(sum(durations))
            ar_n.append(len(durations))
            outs.append(x)
    return {"out": torch.stack(outs), "token_s": tok_s, "allreduce_s": ar_s, "allreduces": ar_n}


def tp_decode_worker(cfg, layers: int = 4, steps: int = 24, warmup: int = 8, batch: int = 1, seed: int = 0,
                     dtype_name: str = "float32", input_seed: int = 1):
    """Tensor-parallel decode on the launcher's ranks (P.12): every rank holds 1/t of each block.

    Decodes ``steps`` tokens for ``batch`` sequences; the first ``warmup`` tokens (the "prompt",
    fed one at a time) fill the KV cache and warm the machine and are left out of the timings. Returns the outputs (replicated on every
    rank; the same as :func:`run_decoder` on :func:`build_decoder` and :func:`decode_inputs` with
    the same seeds on one process) and, per timed token, wall time, all-reduce time (waiting for the other ranks included)
    and all-reduce count, plus this rank's weight bytes.
    """
    import torch

    dtype = getattr(torch, dtype_name)
    index_below(warmup, "warmup (steps not timed)", steps)
    blocks = build_decoder(cfg, layers, seed, dtype)
    xs = decode_inputs(cfg, steps, batch, input_seed, dtype)
    with span("decode"):
        res = run_decoder(blocks, xs, timed=True)
    weight_bytes = sum(p.numel() * p.element_size() for blk in blocks for p in blk.parameters())
    return {"out": res["out"], "token_s": res["token_s"][warmup:], "allreduce_s": res["allreduce_s"][warmup:],
            "allreduces": res["allreduces"][warmup:], "weight_bytes": weight_bytes}


def split_token_time(results: list[dict]) -> dict:
    """Median time per token, its all-reduce part and the rest (compute), from every rank's records.

    A token is done when the slowest rank is done, so per token the maximum over ranks is taken.
    """
    tok = np.max([r["token_s"] for r in results], axis=0)
    ar = np.array([r["allreduce_s"] for r in results])
    slowest = np.argmax([r["token_s"] for r in results], axis=0)
    ar_of_slowest = ar[slowest, np.arange(tok.size)]
    n = results[0]["allreduces"][0]
    return {"token_s": float(np.median(tok)), "allreduce_s": float(np.median(ar_of_slowest)),
            "compute_s": float(np.median(tok - ar_of_slowest)), "allreduces_per_token": n,
            "per_allreduce_s": float(np.median(ar_of_slowest)) / n if n else 0.0}


# ==== 3. serving a request queue: static vs continuous batching ======================================

@dataclass(frozen=True)
class Workload:
    """Requests: arrival times (s, sorted) and output lengths (tokens, >= 1)."""

    arrivals: np.ndarray
    lengths: np.ndarray

    def __post_init__(self):
        a, n = np.asarray(self.arrivals, dtype=float), np.asarray(self.lengths)
        if a.ndim != 1 or a.shape != n.shape or a.size == 0:
            raise ValueError("arrivals and lengths must be 1-D arrays of the same, non-zero length")
        if np.any(np.diff(a) < 0) or np.any(a < 0):
            raise ValueError("arrival times must be >= 0 and sorted")
        if not np.issubdtype(n.dtype, np.integer) or np.any(n < 1):
            raise ValueError("every output length must be an integer >= 1 token")
        object.__setattr__(self, "arrivals", a)
        object.__setattr__(self, "lengths", n.astype(np.int64))


def poisson_workload(n: int, rate: float, mean_tokens: float = 64, seed: int = 0) -> Workload:
    """``n`` requests arriving as a Poisson process of ``rate`` per second, output lengths geometric
    with mean ``mean_tokens`` (many short answers, a few long ones)."""
    n = _int(n, "n")
    rate, mean = _pos(rate, "rate"), _pos(mean_tokens, "mean_tokens")
    if mean < 1:  # a geometric length of mean < 1 token does not exist
        raise ValueError(f"mean_tokens must be >= 1, got {mean_tokens}")
    rng = np.random.default_rng(seed)
    return Workload(np.cumsum(rng.exponential(1 / rate, n)), rng.geometric(1 / mean, n))


@dataclass
class SimResult:
    """Per-request times of a simulated serving run, and what the servers did."""

    policy: str
    max_batch: int
    replicas: int
    workload: Workload
    admitted: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    steps: int = 0
    slot_steps: int = 0  # sum over steps of the batch size (padding included)
    busy_s: float = 0.0  # server-seconds spent in steps
    batch_sizes: list = field(default_factory=list)

    @property
    def latency(self) -> np.ndarray:
        return self.finish - self.workload.arrivals

    @property
    def queue_wait(self) -> np.ndarray:
        return self.admitted - self.workload.arrivals

    @property
    def ttft(self) -> np.ndarray:
        """Time to first token."""
        return self.first_token - self.workload.arrivals

    @property
    def tpot(self) -> np.ndarray:
        """Time per output token after the first (requests of more than one token)."""
        n = self.workload.lengths
        m = n > 1
        return (self.finish[m] - self.first_token[m]) / (n[m] - 1)

    @property
    def tokens(self) -> int:
        return int(self.workload.lengths.sum())

    @property
    def throughput(self) -> float:
        """Output tokens per second, from the first arrival to the last finish."""
        return self.tokens / (self.finish.max() - self.workload.arrivals.min())

    @property
    def useful_fraction(self) -> float:
        """Tokens produced over batch slots stepped (static batching pads finished sequences)."""
        return self.tokens / self.slot_steps

    @property
    def mean_batch(self) -> float:
        return self.slot_steps / self.steps

    def percentiles(self, what: str = "latency", ps=(50, 90, 99)) -> dict:
        values = getattr(self, what)
        return {f"p{p}": float(np.percentile(values, p)) for p in ps}


def simulate_serving(workload: Workload, policy: str, max_batch: int, cost: StepCost, replicas: int = 1) -> SimResult:
    """Serve ``workload`` with ``replicas`` servers sharing one FIFO queue (P.12).

    Every decode step produces one token for each sequence in the batch and takes
    ``cost(batch, admitted)`` seconds. A request's tokens stream out as they are produced.

    * ``"static"``: an idle server takes up to ``max_batch`` waiting requests and runs them until
      the longest is done; finished sequences keep their slot (padding) and nobody joins.
    * ``"continuous"``: at every step boundary the server retires finished sequences and admits
      waiting requests into free slots.

    A server with nothing to do sleeps until the next arrival. Event times are exact (no time grid).
    """
    if policy not in ("static", "continuous"):
        raise ValueError(f"policy must be 'static' or 'continuous', got {policy!r}")
    B, R = _int(max_batch, "max_batch"), _int(replicas, "replicas")
    if not isinstance(cost, StepCost):
        raise ValueError("cost must be a StepCost")
    arr, lens = workload.arrivals, workload.lengths
    n = arr.size
    admitted, first, finish = (np.full(n, np.nan) for _ in range(3))
    remaining = lens.copy()
    res = SimResult(policy, B, R, workload, admitted, first, finish)
    queue: deque = deque()
    nxt = 0
    active = [[] for _ in range(R)]
    heap = [(float(arr[0]), s) for s in range(R)]
    heapq.heapify(heap)
    while heap:
        t, s = heapq.heappop(heap)
        while nxt < n and arr[nxt] <= t:
            queue.append(nxt)
            nxt += 1
        if policy == "continuous":
            active[s] = [r for r in active[s] if remaining[r] > 0]
            new = []
            while queue and len(active[s]) < B:
                r = queue.popleft()
                admitted[r] = t
                active[s].append(r)
                new.append(r)
            if not active[s]:
                if nxt < n:
                    heapq.heappush(heap, (float(arr[nxt]), s))
                continue
            b = len(active[s])
            end = t + cost(b, len(new))
            for r in active[s]:
                remaining[r] -= 1
                if np.isnan(first[r]):
                    first[r] = end
                if remaining[r] == 0:
                    finish[r] = end
            res.steps += 1
            res.slot_steps += b
            res.busy_s += end - t
            res.batch_sizes.append(b)
            heapq.heappush(heap, (end, s))
        else:
            if not queue:
                if nxt < n:
                    heapq.heappush(heap, (float(arr[nxt]), s))
                continue
            batch = [queue.popleft() for _ in range(min(B, len(queue)))]
            b = len(batch)
            first_step, later = cost(b, b), cost(b, 0)
            longest = int(lens[batch].max())
            for r in batch:
                admitted[r] = t
                first[r] = t + first_step
                finish[r] = t + first_step + (lens[r] - 1) * later
                remaining[r] = 0
            end = t + first_step + (longest - 1) * later
            res.steps += longest
            res.slot_steps += longest * b
            res.busy_s += end - t
            res.batch_sizes += [b] * longest
            heapq.heappush(heap, (end, s))
    return res


def capacity(policy: str, max_batch: int, cost: StepCost, mean_tokens: float = 64, n: int = 2000,
             replicas: int = 1, seed: int = 0) -> float:
    """Saturated throughput (tokens/s): every request is already waiting at t = 0."""
    w = poisson_workload(n, 1.0, mean_tokens, seed)
    return simulate_serving(Workload(np.zeros(n), w.lengths), policy, max_batch, cost, replicas).throughput


def summary_row(res: SimResult) -> dict:
    """The quantities P.12 ties the mechanisms to, for one simulated run (seconds, tokens/s)."""
    return {"queue p50": float(np.median(res.queue_wait)), "TTFT p50": float(np.median(res.ttft)),
            "per token p50": float(np.median(res.tpot)), "latency p50": res.percentiles()["p50"],
            "latency p99": res.percentiles()["p99"], "throughput": res.throughput, "mean batch": res.mean_batch,
            "useful slots": res.useful_fraction}
