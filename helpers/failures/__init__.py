"""How parallel jobs fail (P.14): stragglers, uneven micro-batches, crashes and hangs, checkpoints,
MTBF and the checkpoint interval, reproducibility.

Each failure has a small exact model (pure functions, in :mod:`helpers.failures.reference`) and a
worker function here that injects it on real ranks (run it with :func:`helpers.launcher.launch`);
the P.14 notebook puts the two side by side. Import everything from here.

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

import contextlib
import os
import time

import numpy as np

from ..data_parallel import make_batches, make_model, rank_rows
from ..launcher import RankError
from ..launcher.commlog import span
from ..validate import equal_parts
from ..validate import integer_at_least as _pos_int
from .reference import (
    balance_by_tokens,
    bits_differ,
    cluster_mtbf,
    expected_wall_time,
    first_order_overhead,
    make_token_batch,
    micro_shard_partials,
    optimal_interval,
    plain_and_weighted,
    sequences_per_rank,
    simulate_checkpointing,
    straggler_arithmetic,
    straggler_from_measurement,
    sum_in_order,
    token_grad_numpy,
    token_imbalance,
    young_interval,
)

__all__ = [
    # failures_numpy
    "straggler_arithmetic", "straggler_from_measurement", "make_token_batch", "token_grad_numpy", "sequences_per_rank",
    "plain_and_weighted", "balance_by_tokens", "token_imbalance", "cluster_mtbf", "young_interval",
    "first_order_overhead", "expected_wall_time", "simulate_checkpointing", "optimal_interval", "sum_in_order",
    "bits_differ", "micro_shard_partials",
    # this module
    "straggler_worker", "uneven_tokens_worker", "crash_worker", "mismatched_collectives_worker",
    "monitored_barrier_worker", "classify_failure", "root_causes", "checkpoint_train_worker", "max_param_diff",
    "bitwise_equal", "allreduce_worker", "arrival_order_worker", "fixed_order_worker",
]


# ==== 1. stragglers ===============================================================================

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


# ==== 2. uneven micro-batches ======================================================================

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
    with _quiet_native_stderr():  # gloo logs the same diagnosis on stderr, in 200-character lines
        dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
    return dist.get_rank()


@contextlib.contextmanager
def _quiet_native_stderr():
    """Send file descriptor 2 (where torch's C++ logging writes) to /dev/null for the block: the
    Python exception carries the diagnosis; Python's own ``sys.stderr`` is untouched."""
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


_CONSEQUENCE_MARKERS = ("connection closed", "connection reset", "broken pipe", "successfully reached monitoredbarrier")


def classify_failure(err) -> dict[int, str]:
    """Sort every rank named by a :class:`helpers.launcher.RankError` into what happened to it.

    ``died`` (the process ended without a Python error), ``raised`` (its own exception),
    ``timed out`` (a collective timed out waiting), ``names a culprit`` (a monitored barrier
    reported who did not arrive) or ``lost a peer`` (a consequence: connection closed or reset).
    """

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


# ==== 6. reproducibility ===========================================================================

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
