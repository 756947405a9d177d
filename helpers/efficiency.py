"""Where efficiency goes (P.5): the four losses beyond Amdahl's serial fraction, as experiments.

Each loss has a small model (pure functions, exact) and a worker function that shows it on real
ranks (run it with :func:`helpers.launcher.launch`); the notebook puts the two side by side and
computes the measured Karp-Flatt serial fraction of each (:func:`helpers.amdahl.karp_flatt`).

1. **Synchronisation**: ranks meet at a barrier; each waits for the slowest
   (:func:`barrier_waits`, :func:`barrier_worker`).
2. **Load imbalance**: indivisible tasks (100 tasks on 8 workers: 13 on the busiest, 12.5 on
   average) (:func:`task_counts`, :func:`imbalance_worker`).
3. **Launch overhead**: a fixed cost per operation that a shrinking slice no longer amortises;
   time per element ``a/k + b`` for a slice of ``k`` elements (:func:`fit_overhead`,
   :func:`overhead_worker`).
4. **Communication**: an all-reduce per step that does not shrink as workers are added
   (:func:`comm_worker`).

Where a worker "computes" with ``time.sleep`` it says so: on this 2-core machine four busy ranks
would contend for the cores and that contention would blur the loss being shown. The waits, the
collectives, the per-op overhead and the communication are always real.
"""
from __future__ import annotations

import time

import numpy as np

from .launcher.commlog import span
from .launcher.worker import device
from .validate import durations as _durations
from .validate import integer_at_least as _positive_int

# ---- 1. synchronisation: the barrier ---------------------------------------------------------

def barrier_waits(durations) -> list[float]:
    """Each worker's wait at a barrier: the slowest one's time minus its own (P.5, item 1)."""
    d = _durations(durations)
    return [max(d) - x for x in d]


def idle_fraction(durations) -> float:
    """Waiting worker-time over all worker-time, ``sum(waits) / (N * max)`` (P.5, P.14)."""
    d = _durations(durations)
    if max(d) == 0:
        raise ValueError("at least one duration must be > 0 to define an idle fraction")
    return sum(barrier_waits(d)) / (len(d) * max(d))


def barrier_speedup(durations) -> float:
    """Speedup of a barrier-ended step over running all the work on one worker: sum / max."""
    d = _durations(durations)
    if max(d) == 0:
        raise ValueError("at least one duration must be > 0 to define a speedup")
    return sum(d) / max(d)


def barrier_worker(durations, repeats: int = 1):
    """Rank r "computes" for ``durations[r]`` seconds (a sleep), then waits at ``dist.barrier()``.

    Returns this rank's measured compute and wait times per repeat (lists of seconds). The ranks
    are lined up by a barrier before each repeat, so a wait is only the gap to the slowest.
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    d = _durations(durations)
    if len(d) != world:
        raise ValueError(f"need one duration per rank: {len(d)} given for world size {world}")
    repeats = _positive_int(repeats, "repeats")
    compute, wait = [], []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        with span("compute"):
            time.sleep(d[rank])
        t1 = time.perf_counter()
        with span("wait"):
            dist.barrier()
        t2 = time.perf_counter()
        compute.append(t1 - t0)
        wait.append(t2 - t1)
    return {"compute": compute, "wait": wait}


# ---- 2. load imbalance: indivisible tasks ----------------------------------------------------

def task_counts(tasks: int, workers: int) -> list[int]:
    """Tasks per worker when ``tasks`` equal, indivisible tasks are dealt out round-robin (P.5)."""
    tasks, workers = _positive_int(tasks, "tasks"), _positive_int(workers, "workers")
    q, r = divmod(tasks, workers)
    return [q + 1 if w < r else q for w in range(workers)]


def imbalance_speedup(tasks: int, workers: int) -> float:
    """Speedup of equal indivisible tasks: tasks / ceil(tasks / workers) (100 on 8: 100/13)."""
    return tasks / max(task_counts(tasks, workers))


def imbalance_worker(tasks: int, task_s: float):
    """Rank r takes tasks r, r+N, r+2N, ... of ``tasks`` equal tasks (each a sleep of ``task_s``).

    Returns how many tasks it did, its busy time and its wait at the closing barrier.
    """
    tasks = _positive_int(tasks, "tasks")
    (task_s,) = _durations([task_s], "task_s")
    n, t0, t1, t2 = round_robin_tasks(tasks, task_s, "tasks")
    return {"tasks": n, "busy": t1 - t0, "wait": t2 - t1, "step": t2 - t0}


def round_robin_tasks(tasks: int, task_s: float, label: str) -> tuple[int, float, float, float]:
    """On the launcher's ranks, after a barrier: rank r sleeps ``task_s`` for each of tasks r, r+N,
    r+2N, ... of ``tasks`` (in a span ``label``), then waits for the others at a barrier (span
    "wait"). Returns its task count and the times it started, ended its tasks and left the barrier
    (for :func:`imbalance_worker` and :func:`helpers.amdahl.amdahl_job_worker`; they validate)."""
    import torch.distributed as dist

    mine = range(dist.get_rank(), tasks, dist.get_world_size())
    dist.barrier()
    t0 = time.perf_counter()
    with span(label):
        for _ in mine:
            time.sleep(task_s)
    t1 = time.perf_counter()
    with span("wait"):
        dist.barrier()
    return len(mine), t0, t1, time.perf_counter()


# ---- 3. launch overhead vs slice size --------------------------------------------------------

def fit_overhead(sizes, times) -> tuple[float, float]:
    """Least-squares ``t(k) = a + b k``: fixed cost per operation ``a``, cost per element ``b``."""
    k = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if k.shape != t.shape or k.ndim != 1 or len(k) < 2:
        raise ValueError(f"sizes and times must be 1-D, of equal length >= 2, got {k.shape} and {t.shape}")
    if np.any(k < 1) or np.any(t <= 0):
        raise ValueError("slice sizes must be >= 1 element and times > 0")
    # relative least squares (weights 1/t) so the small slices, where a dominates, count
    w = 1 / t
    A = np.stack([np.ones_like(k), k], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    return float(a), float(b)


def overhead_speedup(a: float, b: float, total: int, n):
    """Speedup of splitting ``total`` elements over ``n`` devices, one op each: (a + bM)/(a + bM/n).

    Its Karp-Flatt fraction is exactly ``a / (a + b M)`` for every n: launch overhead behaves as
    a serial fraction (:func:`overhead_serial_fraction`).
    """
    from .amdahl import check_workers

    if a < 0 or b < 0 or (a == 0 and b == 0):
        raise ValueError(f"the overhead a and per-element cost b must be >= 0, not both 0, got a={a}, b={b}")
    total = _positive_int(total, "total")
    n = check_workers(n)
    out = (a + b * total) / (a + b * total / n)
    return float(out) if out.ndim == 0 else out


def overhead_serial_fraction(a: float, b: float, total: int) -> float:
    """a / (a + b M): the share of one op's time on the whole array that is fixed overhead."""
    if a < 0 or b < 0 or (a == 0 and b == 0):
        raise ValueError(f"the overhead a and per-element cost b must be >= 0, not both 0, got a={a}, b={b}")
    return a / (a + b * _positive_int(total, "total"))


def time_op(x, reps: int, samples: int = 7) -> float:
    """Seconds per ``x.mul_(1.0).add_(0.0)`` pair (two operations), median of ``samples`` blocks of
    ``reps`` calls, timed in CPU time of the calling thread (``time.thread_time``): on a shared
    machine wall time would also count the moments another job held the core. (With one torch
    thread per rank, as the launcher sets, the ops run in the calling thread.)"""
    out = []
    for _ in range(samples):
        t0 = time.thread_time()
        for _ in range(reps):
            x.mul_(1.0).add_(0.0)
        out.append((time.thread_time() - t0) / reps)
    return float(np.median(out))


def overhead_worker(sizes, budget_elems: int = 2_000_000, max_reps: int = 400):
    """Time one elementwise op pair on slices of each size in ``sizes`` (P.5, item 3), in CPU time.

    Every rank measures the same sizes at the same time (a barrier between sizes), each on its
    own core when the world size is at most the core count. Returns ``{size: seconds per op}``.
    """
    import torch
    import torch.distributed as dist

    out = {}
    for k in sizes:
        k = _positive_int(k, "slice size")
        x = torch.ones(k, dtype=torch.float32, device=device())
        reps = max(10, min(max_reps, budget_elems // k))
        time_op(x, 5)  # warm-up
        dist.barrier()
        out[k] = time_op(x, reps)
    return out


# ---- 4. communication share of a step ---------------------------------------------------------

def comm_worker(total_compute_s: float, grad_elems: int, steps: int = 5):
    """Strong scaling of a step: rank r "computes" ``total_compute_s / N`` (a sleep), then all-reduces
    a gradient of ``grad_elems`` float32 values (real gloo traffic). Returns per-step times.

    The compute shrinks as 1/N; the all-reduce does not, so its share of the step grows with N.
    """
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    (total_compute_s,) = _durations([total_compute_s], "total_compute_s")
    steps = _positive_int(steps, "steps")
    grad = torch.ones(_positive_int(grad_elems, "grad_elems"), dtype=torch.float32, device=device())
    dist.all_reduce(grad)  # warm-up: the first collective sets up connections
    compute, comm, step = [], [], []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        with span("compute"):
            time.sleep(total_compute_s / world)
        t1 = time.perf_counter()
        with span("all_reduce"):
            if world > 1:
                dist.all_reduce(grad)
        t2 = time.perf_counter()
        compute.append(t1 - t0)
        comm.append(t2 - t1)
        step.append(t2 - t0)
    return {"compute": compute, "comm": comm, "step": step}
