"""How parallel jobs fail (P.14): stragglers, uneven micro-batches, crashes and hangs, checkpoints,
MTBF and the checkpoint interval, reproducibility.

Each failure has a small exact model (pure functions) and a worker function that injects it on
real ranks (run it with :func:`helpers.launcher.launch`); the P.14 notebook puts the two side by
side.

1. **Stragglers**: :func:`straggler_arithmetic` is the section's step/efficiency/idle arithmetic;
   :func:`straggler_worker` slows one rank and records per-rank compute, all-reduce and step
   times; :func:`straggler_from_measurement` recomputes the same figures from what was measured.
   The compute is ``time.sleep`` (on this 2-core machine four busy ranks would fight for the
   cores and blur the straggler); the all-reduce and the waiting are real.
2. **Uneven micro-batches**: sequences of different lengths; the plain average of per-rank
   token-mean gradients against token-weighted gradients (:func:`token_grad_numpy`,
   :func:`uneven_tokens_worker`), and greedy length balancing (:func:`balance_by_tokens`).
3. **Crashes and hangs**: :func:`crash_worker`, :func:`mismatched_collectives_worker`,
   :func:`monitored_barrier_worker`; :func:`classify_failure` sorts a :class:`RankError`'s ranks
   into causes and consequences.
4. **Checkpoints**: :func:`checkpoint_train_worker` trains an FSDP2-sharded model with Adam and
   saves/loads it with ``torch.distributed.checkpoint`` (also on a different world size).
5. **MTBF and the interval**: :func:`cluster_mtbf`, :func:`young_interval`,
   :func:`expected_wall_time` (exact for exponential failures), :func:`first_order_overhead`,
   :func:`simulate_checkpointing` (Monte Carlo, failure by failure).
6. **Reproducibility**: :func:`sum_in_order`, :func:`bits_differ`, :func:`arrival_order_worker`,
   :func:`fixed_order_worker`.
"""
from __future__ import annotations

import math
import time

import numpy as np

from .validate import durations as _durations, equal_parts, integer_at_least as _pos_int, positive_number as _pos_real


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


def straggler_worker(steps: int = 8, base_s: float = 0.100, slow_rank: int | None = 3, slow_factor: float = 1.5,
                     jitter: float = 0.03, allreduce_elems: int = 1 << 20, seed: int = 0):
    """A synchronous data-parallel loop with one slow rank (P.14). Run it on the launcher's ranks.

    Each step: "compute" (``time.sleep`` of ``base_s``, times ``slow_factor`` on ``slow_rank``,
    times ``1 + jitter * N(0, 1)`` per step), then a real all-reduce of ``allreduce_elems`` float32.
    Returns this rank's per-step lists (seconds): ``compute``, ``allreduce`` (time inside the
    all-reduce call, waiting included), ``step`` (step start to all-reduce end) and ``arrive``
    (when the rank reached the all-reduce, relative to the step's start on this rank), plus
    ``arrive_clock`` and ``leave_clock``: the same two moments on ``time.monotonic()``, a clock
    that all processes of one host share (so they compare across ranks only on one host).
    """
    import torch
    import torch.distributed as dist

    from .commlog import span

    steps = _pos_int(steps, "steps")
    rank = dist.get_rank()
    rng = np.random.default_rng([seed, rank])
    grad = torch.ones(allreduce_elems, dtype=torch.float32)
    out = {"compute": [], "allreduce": [], "step": [], "arrive": [], "arrive_clock": [], "leave_clock": []}
    dist.barrier()
    for _ in range(steps):
        t0 = time.perf_counter()
        dur = base_s * (slow_factor if rank == slow_rank else 1.0) * max(0.0, 1.0 + jitter * rng.standard_normal())
        with span("compute"):
            time.sleep(dur)
        t1, c1 = time.perf_counter(), time.monotonic()
        with span("all_reduce"):
            dist.all_reduce(grad)
        t2, c2 = time.perf_counter(), time.monotonic()
        out["compute"].append(t1 - t0)
        out["allreduce"].append(t2 - t1)
        out["step"].append(t2 - t0)
        out["arrive"].append(t1 - t0)
        out["arrive_clock"].append(c1)
        out["leave_clock"].append(c2)
    return out


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


def uneven_tokens_worker(X, y, seq, w, assignment, weighted: bool):
    """Each rank holds the tokens of its sequences; all-reduce their gradient (P.14).

    ``weighted=False``: all-reduce the per-rank token-mean gradients and divide by the world size
    (what DDP does). ``weighted=True``: all-reduce token-sum gradients and the token count, then
    divide: the gradient of the mean over every token in the global batch. Returns the gradient
    and this rank's token count.
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if len(assignment) != world:
        raise ValueError(f"assignment has {len(assignment)} ranks' sequences, the world has {world}")
    m = np.isin(seq, assignment[rank])
    Xr, yr = torch.from_numpy(X[m]), torch.from_numpy(y[m])
    wt = torch.from_numpy(w).requires_grad_(True)
    per_token = 0.5 * (Xr @ wt - yr) ** 2
    loss = per_token.sum() if weighted else per_token.mean()
    loss.backward()
    g = wt.grad.detach().clone()
    count = torch.tensor([float(m.sum())], dtype=torch.float64)
    dist.all_reduce(g)
    if weighted:
        dist.all_reduce(count)
        g /= count
    else:
        g /= world
    return {"grad": g.numpy(), "tokens": int(m.sum())}


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


# ==== 3. crashes and hangs =========================================================================

def crash_worker(fail_rank: int = 2, fail_step: int = 3, steps: int = 6, hard: bool = False):
    """A training loop in which ``fail_rank`` fails at ``fail_step`` (P.14).

    ``hard=False``: it raises (a Python error with a traceback). ``hard=True``: the process ends
    at once with exit code 1 (``os._exit``), as when a device or host is lost or the OOM killer
    strikes: no traceback, its peers just lose the connection. The others are inside an
    all-reduce, waiting for it.
    """
    import os

    import torch
    import torch.distributed as dist

    x = torch.ones(1024)
    for step in range(steps):
        if dist.get_rank() == fail_rank and step == fail_step:
            print(f"step {step}: failing now")
            if hard:
                os._exit(1)
            raise RuntimeError(f"simulated device failure at step {step}")
        dist.all_reduce(x)
        x /= dist.get_world_size()
    return step


def mismatched_collectives_worker(odd_rank: int = 3):
    """Every rank issues the same two collectives, but ``odd_rank`` in the opposite order (P.14).

    The others enter the all-reduce while ``odd_rank`` enters the all-gather: neither can
    complete, nobody raises an error of its own, and only the collective timeout ends the job.
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(8)
    gathered = [torch.empty(8) for _ in range(world)]
    if rank == odd_rank:
        dist.all_gather(gathered, x)
        dist.all_reduce(x)
    else:
        dist.all_reduce(x)
        dist.all_gather(gathered, x)
    return x.sum().item()


def monitored_barrier_worker(stuck_rank: int = 1, timeout_s: float = 2.0, stuck_s: float = 30.0):
    """``stuck_rank`` is busy elsewhere past the barrier's timeout; ``dist.monitored_barrier`` names it (gloo only).

    Rank 0 waits for every other rank in turn and raises, after ``timeout_s``, an error that
    says which rank failed to arrive: the diagnostic a plain collective timeout does not give.
    ``stuck_s`` is how long the stuck rank sleeps first (the launcher kills it when the job fails).
    """
    from datetime import timedelta

    import torch.distributed as dist

    if dist.get_rank() == stuck_rank:
        time.sleep(stuck_s)
    dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
    return dist.get_rank()


_CONSEQUENCE_MARKERS = ("connection closed", "connection reset", "broken pipe", "successfully reached monitoredbarrier")


def classify_failure(err) -> dict[int, str]:
    """Sort every rank named by a :class:`helpers.launcher.RankError` into what happened to it.

    ``died`` (the process ended without a Python error), ``raised`` (its own exception),
    ``timed out`` (a collective timed out waiting), ``names a culprit`` (a monitored barrier
    reported who did not arrive) or ``lost a peer`` (a consequence: connection closed or reset).
    """
    from .launcher import RankError

    if not isinstance(err, RankError):
        raise ValueError(f"classify_failure takes a RankError, got {type(err).__name__}")
    summaries = {err.rank: err.summary, **err.others}
    out = {}
    for r, s in sorted(summaries.items()):
        low = s.lower()
        if "worker process died" in low:
            out[r] = "died"
        elif "failed to pass monitoredbarrier" in low:
            out[r] = "names a culprit"
        elif any(m in low for m in _CONSEQUENCE_MARKERS):
            out[r] = "lost a peer"
        elif "timed out" in low:
            out[r] = "timed out"
        else:
            out[r] = "raised"
    return out


def root_causes(err) -> list[int]:
    """Ranks whose failure is a cause (died or raised), not a consequence of another's."""
    return [r for r, kind in classify_failure(err).items() if kind in ("died", "raised")]


# ==== 4. checkpoint and resume with torch.distributed.checkpoint ===================================

def checkpoint_train_worker(ckpt_dir: str | None, steps: int = 8, save_at: int | None = None, resume: bool = False,
                            with_optimizer: bool = True, batch: int = 32, lr: float = 0.01, sizes=(8, 64, 64, 1)):
    """Train an FSDP2-sharded MLP with Adam for ``steps`` steps; optionally checkpoint or resume (P.14).

    Each rank holds 1/world of every parameter and of Adam's moments (``fully_shard``) and takes its
    ``batch / world`` slice of every (deterministic, step-indexed) batch. ``save_at=k``: after step
    k, save model, optimiser state and the step counter with ``torch.distributed.checkpoint`` into
    ``ckpt_dir`` (every rank writes its own shards) and stop, as a job that is then killed would.
    ``resume=True``: load that checkpoint first (on any world size: DCP reshards) and continue.
    ``with_optimizer=False`` saves/loads the model only (the common mistake). Returns the losses of
    the steps this run did and, if it ran to the end, the full parameters.
    """
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    from .data_parallel import make_batches, make_model, rank_rows

    world = dist.get_world_size()
    mine = rank_rows(batch, dist.get_rank(), world)
    if (save_at is not None or resume) and not ckpt_dir:
        raise ValueError("saving or resuming needs a ckpt_dir")
    model = make_model(0, sizes=sizes)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def state():
        msd, osd = get_state_dict(model, opt)
        return {"model": msd, "step": torch.tensor(0), **({"optim": osd} if with_optimizer else {})}

    start = 0
    if resume:
        sd = state()
        dcp.load(sd, checkpoint_id=ckpt_dir)
        if with_optimizer:
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        else:
            set_model_state_dict(model, sd["model"])
        start = int(sd["step"])
    X, y = make_batches(steps, batch)
    losses = []
    for k in range(start, steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(X[k][mine]), y[k][mine])
        loss.backward()  # FSDP2 reduce-scatters the gradients (average over ranks)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
        if save_at is not None and k + 1 == save_at:
            sd = state()
            sd["step"] = torch.tensor(k + 1)
            dcp.save(sd, checkpoint_id=ckpt_dir)
            local = sum(p.to_local().numel() for p in model.parameters())
            return {"losses": losses, "stopped_after": k + 1, "local_params": local}
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    return {"losses": losses, "params": full, "local_params": sum(p.to_local().numel() for p in model.parameters())}


def max_param_diff(a: dict, b: dict) -> float:
    """Largest absolute difference between two ``{name: tensor}`` parameter dicts."""
    if set(a) != set(b):
        raise ValueError(f"parameter names differ: {sorted(set(a) ^ set(b))}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def bitwise_equal(a: dict, b: dict) -> bool:
    """True when every parameter tensor is identical bit for bit."""
    import torch

    if set(a) != set(b):
        raise ValueError(f"parameter names differ: {sorted(set(a) ^ set(b))}")
    return all(torch.equal(a[k], b[k]) for k in a)


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


def _my_shards(n_shards: int, rank: int, world: int) -> range:
    return equal_parts(n_shards, world, "the world size {k} must divide the {n} micro-shards")[rank]


def allreduce_worker(partials):
    """Reduce the micro-shard partials the usual way: local sum, then ``dist.all_reduce`` (P.14).

    The order of the additions depends on the world size (which shards are summed locally) and on
    the collective's algorithm, so two world sizes give different last bits.
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = _my_shards(len(partials), rank, world)
    local = torch.from_numpy(sum_in_order([partials[i] for i in mine]))
    dist.all_reduce(local)
    return local.numpy()


def arrival_order_worker(partials, delays):
    """Rank 0 adds each rank's local sum in the order the messages arrive (P.14).

    ``delays[r]`` seconds of sleep on rank r before sending set the arrival order (as device speed
    and network do in real jobs). Returns the result and the order on rank 0.
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if len(delays) != world:
        raise ValueError(f"delays must hold one entry per rank ({world}), got {len(delays)}")
    mine = _my_shards(len(partials), rank, world)
    local = torch.from_numpy(sum_in_order([partials[i] for i in mine]))
    if rank != 0:
        time.sleep(delays[rank])
        dist.send(local, 0)
        return None
    time.sleep(delays[0])
    acc, order = local.clone(), [0]
    buf = torch.empty_like(local)
    for _ in range(world - 1):
        src = dist.recv(buf)  # from whichever rank is ready first
        acc += buf
        order.append(src)
    return {"sum": acc.numpy(), "order": order}


def fixed_order_worker(partials):
    """A deterministic reduction: all-gather every micro-shard's partial, add them in index order.

    Each rank owns whole micro-shards; the all-gather places shard i's partial at position i
    whatever the world size, and the additions happen in the same order everywhere, so the
    result is bitwise identical on reruns and on any world size that divides the shard count.
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    n, length = partials.shape
    mine = _my_shards(n, rank, world)
    local = torch.from_numpy(np.ascontiguousarray(partials[mine.start:mine.stop]))
    everything = torch.empty((n, length), dtype=local.dtype)
    dist.all_gather_single(everything, local)
    return sum_in_order(list(everything.numpy()))
