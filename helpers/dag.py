"""Work, span and greedy scheduling of a task graph (P.1; the embedding job is reused in P.4).

A job is a directed acyclic graph (:class:`DAG`): nodes are tasks with a duration, an edge
``u -> v`` says that ``v`` needs the result of ``u``. From the graph alone:

* work ``T1`` -- the sum of all durations (one worker does everything);
* span ``T_inf`` -- the longest chain of dependent tasks (the critical path);
* ``T1 / T_inf`` -- the largest speedup any number of workers can reach.

:func:`list_schedule` simulates a greedy list scheduler on ``N`` identical workers (whenever a
worker is free and a task is ready, the worker takes it) and returns the :class:`Schedule`
(task, worker, start, end). :func:`execute` runs a graph for real on a process pool with the same
greedy rule and returns the measured schedule in the same form, so :func:`gantt` draws both.

The chapter's job (:func:`embedding_job`): 100 embeddings of 2 s each, a 10 s merge that needs
all of them, and a 20 s index build that needs the merge.
"""
from __future__ import annotations

import heapq
import os
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .launcher.commlog import span as timed_span  # dag.span is T_inf
from .validate import integer_at_least, positive_number

PRIORITIES = ("order", "longest", "critical")


# ---- the graph ---------------------------------------------------------------------------------

class DAG:
    """A task graph: ``durations`` maps task name -> duration (>= 0), ``edges`` are ``(u, v)``
    pairs meaning "v needs the result of u".

    Raises ``ValueError`` for a negative or non-finite duration, an edge naming an unknown task,
    a self-loop or any cycle (the message names the tasks on the cycle).
    """

    def __init__(self, durations: dict, edges=()):
        if not isinstance(durations, dict) or not durations:
            raise ValueError("durations must be a non-empty dict {task name: duration}")
        self.durations: dict[str, float] = {}
        for name, d in durations.items():
            positive_number(d, f"the duration of task {name!r}", allow_zero=True)
            self.durations[name] = d
        self.preds: dict[str, list[str]] = {n: [] for n in self.durations}
        self.succs: dict[str, list[str]] = {n: [] for n in self.durations}
        seen = set()
        for e in edges:
            if len(e) != 2:
                raise ValueError(f"an edge must be a pair (u, v), got {e!r}")
            u, v = e
            for x in (u, v):
                if x not in self.durations:
                    raise ValueError(f"edge {u!r} -> {v!r} names task {x!r}, which has no duration")
            if u == v:
                raise ValueError(f"the graph must be acyclic: task {u!r} depends on itself")
            if (u, v) in seen:
                continue
            seen.add((u, v))
            self.succs[u].append(v)
            self.preds[v].append(u)
        self.edges: list[tuple[str, str]] = [(u, v) for u in self.durations for v in self.succs[u]]
        self.order: list[str] = self._topological_order()

    def _topological_order(self) -> list[str]:
        indeg = {n: len(p) for n, p in self.preds.items()}
        queue = deque(n for n in self.durations if indeg[n] == 0)
        order = []
        while queue:
            u = queue.popleft()
            order.append(u)
            for v in self.succs[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    queue.append(v)
        if len(order) < len(self.durations):
            cycle = self._find_cycle({n for n in self.durations if indeg[n] > 0})
            raise ValueError("the graph must be acyclic; it has the cycle " + " -> ".join(map(str, cycle)))
        return order

    def _find_cycle(self, left: set) -> list[str]:
        """A cycle among the tasks Kahn's algorithm could not order (each has a predecessor in ``left``)."""
        start = next(n for n in self.durations if n in left)
        path, pos, u = [], {}, start
        while u not in pos:  # walk backwards along predecessors that are themselves unordered
            pos[u] = len(path)
            path.append(u)
            u = next(p for p in self.preds[u] if p in left)
        cyc = path[pos[u]:] + [u]
        return cyc[::-1]

    def __len__(self) -> int:
        return len(self.durations)

    def __repr__(self) -> str:
        return f"DAG({len(self)} tasks, {len(self.edges)} edges, work={self.work():g}, span={self.span():g})"

    # ---- work and span --------------------------------------------------------------------------

    def work(self) -> float:
        """T1: total duration of all tasks, the time on one worker."""
        return sum(self.durations.values())

    def finish_times(self) -> dict[str, float]:
        """Earliest finish time of every task with unlimited workers (longest path ending there)."""
        fin: dict[str, float] = {}
        for u in self.order:
            fin[u] = max((fin[p] for p in self.preds[u]), default=0) + self.durations[u]
        return fin

    def span(self) -> float:
        """T_inf: the length of the longest chain of dependent tasks."""
        return max(self.finish_times().values())

    def critical_path(self) -> list[str]:
        """One longest chain (the first found in task order), from a source to a sink."""
        fin = self.finish_times()
        u = max(self.order, key=lambda n: (fin[n], -self.order.index(n)))
        path = [u]
        while self.preds[u]:
            start = fin[u] - self.durations[u]
            u = next(p for p in self.preds[u] if fin[p] == start)
            path.append(u)
        return path[::-1]

    def bottom_levels(self) -> dict[str, float]:
        """Longest path from each task to the end, its own duration included (scheduling priority)."""
        lvl: dict[str, float] = {}
        for u in reversed(self.order):
            lvl[u] = self.durations[u] + max((lvl[v] for v in self.succs[u]), default=0)
        return lvl

    def parallelism(self) -> float:
        """T1 / T_inf: the best speedup any number of workers can reach."""
        s = self.span()
        if s == 0:
            raise ValueError("span is 0 (every duration is 0): T1/T_inf is undefined")
        return self.work() / s

    def scaled(self, factor: float) -> "DAG":
        """The same graph with every duration multiplied by ``factor`` (> 0)."""
        positive_number(factor, "factor")
        return DAG({n: d * factor for n, d in self.durations.items()}, self.edges)


def work(dag: DAG) -> float:
    """T1 of ``dag``."""
    return dag.work()


def span(dag: DAG) -> float:
    """T_inf of ``dag``."""
    return dag.span()


def kind(task: str) -> str:
    """The task's family: ``"embed[37]"`` -> ``"embed"`` (used to colour Gantt charts)."""
    return str(task).split("[")[0]


def embedding_job(n_chunks: int = 100, embed_s: float = 2.0, merge_s: float = 10.0, index_s: float = 20.0) -> DAG:
    """The P.1 job: ``n_chunks`` independent embeddings -> one merge -> one index build."""
    integer_at_least(n_chunks, "n_chunks")
    durations = {f"embed[{i}]": embed_s for i in range(n_chunks)}
    durations["merge"] = merge_s
    durations["index"] = index_s
    edges = [(f"embed[{i}]", "merge") for i in range(n_chunks)] + [("merge", "index")]
    return DAG(durations, edges)


def bounds(dag: DAG, workers: int) -> dict[str, float]:
    """What any schedule on ``workers`` workers must obey, and what a greedy one guarantees.

    ``lower``: max(T1/N, T_inf), no schedule is faster. ``greedy_upper``: (T1 - T_inf)/N + T_inf,
    no greedy list schedule is slower (Graham's bound). ``speedup_bound``: min(N, T1/T_inf).
    """
    n = integer_at_least(workers, "the number of workers N")
    t1, tinf = dag.work(), dag.span()
    return {
        "lower": max(t1 / n, tinf),
        "greedy_upper": (t1 - tinf) / n + tinf,
        "speedup_bound": min(n, t1 / tinf) if tinf > 0 else float(n),
    }


# ---- schedules ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Slot:
    """One task placed on one worker from ``start`` to ``end``."""

    task: str
    worker: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Schedule:
    """Where and when every task ran (simulated by :func:`list_schedule` or measured by :func:`execute`)."""

    workers: int
    slots: list[Slot]
    work: float  # T1 of the graph (sum of durations, modelled), for speedup/efficiency
    results: dict = field(default_factory=dict, repr=False)  # task -> return value (measured runs)

    @property
    def makespan(self) -> float:
        """Time from the first start to the last end (0 at the start of the job)."""
        return max((s.end for s in self.slots), default=0.0)

    @property
    def speedup(self) -> float:
        """T1 / makespan."""
        if self.makespan <= 0:
            raise ValueError("the makespan is 0 (every duration is 0): speedup is undefined")
        return self.work / self.makespan

    @property
    def efficiency(self) -> float:
        return self.speedup / self.workers

    def busy(self) -> list[float]:
        """Busy time of each worker."""
        out = [0.0] * self.workers
        for s in self.slots:
            out[s.worker] += s.duration
        return out

    def idle(self) -> list[float]:
        """Idle time of each worker up to the makespan."""
        return [self.makespan - b for b in self.busy()]

    def idle_fraction(self) -> float:
        """Share of worker-time spent idle: 1 - efficiency for a simulated schedule."""
        return sum(self.idle()) / (self.workers * self.makespan)

    def tasks_per_worker(self, of_kind: str | None = None) -> list[int]:
        out = [0] * self.workers
        for s in self.slots:
            if of_kind is None or kind(s.task) == of_kind:
                out[s.worker] += 1
        return out

    def slot(self, task: str) -> Slot:
        return next(s for s in self.slots if s.task == task)

    def check(self, dag: DAG, tol: float = 0.0) -> None:
        """Raise ``ValueError`` unless every task runs once, no worker runs two tasks at once, and
        every task starts after all its predecessors ended (within ``tol`` seconds)."""
        names = [s.task for s in self.slots]
        if sorted(names) != sorted(dag.durations):
            raise ValueError("every task of the graph must appear exactly once in the schedule")
        by_task = {s.task: s for s in self.slots}
        for u, v in dag.edges:
            if by_task[v].start + tol < by_task[u].end:
                raise ValueError(f"dependency violated: {v!r} starts at {by_task[v].start} before {u!r} ends at {by_task[u].end}")
        for w in range(self.workers):
            mine = sorted((s for s in self.slots if s.worker == w), key=lambda s: s.start)
            for a, b in zip(mine, mine[1:]):
                if b.start + tol < a.end:
                    raise ValueError(f"worker {w} runs {a.task!r} and {b.task!r} at the same time")


def _priority_key(dag: DAG, priority: str):
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
    rank = {n: i for i, n in enumerate(dag.durations)}
    if priority == "order":
        return lambda n: (rank[n],)
    if priority == "longest":
        return lambda n: (-dag.durations[n], rank[n])
    lvl = dag.bottom_levels()
    return lambda n: (-lvl[n], rank[n])


def list_schedule(dag: DAG, workers: int, priority: str = "order") -> Schedule:
    """Greedy list scheduling of ``dag`` on ``workers`` identical workers (P.1).

    At every moment when tasks finish, all tasks whose predecessors are done join the ready list;
    each idle worker (lowest index first) takes the ready task that comes first by ``priority``:
    ``"order"`` (the graph's task order), ``"longest"`` (longest duration first) or ``"critical"``
    (longest path to the end first). No worker stays idle while a task is ready.
    """
    n = integer_at_least(workers, "the number of workers N")
    if not isinstance(dag, DAG):
        raise ValueError(f"dag must be a helpers.dag.DAG, got {type(dag).__name__}")
    key = _priority_key(dag, priority)
    indeg = {t: len(p) for t, p in dag.preds.items()}
    ready: list = []
    for t in dag.durations:
        if indeg[t] == 0:
            heapq.heappush(ready, (key(t), t))
    idle = list(range(n))  # a heap of idle worker ids
    running: list = []  # heap of (end, worker, task)
    slots: list[Slot] = []
    now = 0
    while ready or running:
        while ready and idle:
            _, t = heapq.heappop(ready)
            w = heapq.heappop(idle)
            end = now + dag.durations[t]
            slots.append(Slot(t, w, now, end))
            heapq.heappush(running, (end, w, t))
        now = running[0][0]
        while running and running[0][0] == now:  # every task that ends now, before anyone picks
            _, w, t = heapq.heappop(running)
            heapq.heappush(idle, w)
            for v in dag.succs[t]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    heapq.heappush(ready, (key(v), v))
    return Schedule(n, slots, dag.work())


def makespan_table(dag: DAG, workers_list, priority: str = "order") -> list[dict]:
    """One row per N: makespan, speedup, efficiency and the two bounds (for tables and plots)."""
    rows = []
    for n in workers_list:
        s = list_schedule(dag, n, priority)
        b = bounds(dag, n)
        rows.append({"N": n, "makespan": s.makespan, "speedup": s.speedup, "efficiency": s.efficiency,
                     "lower": b["lower"], "greedy_upper": b["greedy_upper"]})
    return rows


# ---- running a graph for real ------------------------------------------------------------------

def burn(seconds: float) -> int:
    """Busy the calling process's CPU for ``seconds`` of CPU time (not wall time); return loop count.

    Counting CPU time makes a task a fixed amount of work: when more processes than cores share
    the machine, each task takes longer in wall time, as real compute would.
    """
    positive_number(seconds, "seconds", allow_zero=True)
    end = time.process_time() + seconds
    n = 0
    while time.process_time() < end:
        n += 1
    return n


def embedding_task(task: str, duration: float, inputs: dict, dim: int = 16):
    """What each task of the embedding job computes (stand-ins, but real data flows along edges).

    ``embed[i]``: a deterministic vector for chunk i. ``merge``: the vectors stacked in chunk order
    and L2-normalised. ``index``: for each vector, the chunk whose vector is most similar (cosine).
    Each task also burns ``duration`` seconds of CPU.
    """
    burn(duration)
    k = kind(task)
    if k == "embed":
        i = int(task[len("embed["):-1])
        return np.random.default_rng(i).normal(size=dim)
    if k == "merge":
        keys = sorted(inputs, key=lambda t: int(t[len("embed["):-1]))
        m = np.stack([inputs[t] for t in keys])
        return m / np.linalg.norm(m, axis=1, keepdims=True)
    if k == "index":
        (m,) = inputs.values()
        sim = m @ m.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(axis=1)
    raise ValueError(f"embedding_task does not know task {task!r}")


def embedding_reference(n_chunks: int = 100, dim: int = 16) -> np.ndarray:
    """The index the embedding job must produce, computed serially with no burning."""
    embs = {f"embed[{i}]": embedding_task(f"embed[{i}]", 0, {}, dim) for i in range(n_chunks)}
    merged = embedding_task("merge", 0, embs, dim)
    return embedding_task("index", 0, {"merge": merged}, dim)


def _timed_call(fn, task, duration, inputs):
    t0 = time.perf_counter()  # CLOCK_MONOTONIC on Linux: comparable across processes
    out = fn(task, duration, inputs)
    return os.getpid(), t0, time.perf_counter(), out


def start_pool(workers: int):
    """A process pool of ``workers`` processes (spawn start method), started and warmed up.

    Returns ``(pool, seconds it took to start)``. Close it with ``pool.shutdown()``.
    """
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    n = integer_at_least(workers, "the number of workers N")
    t0 = time.perf_counter()
    pool = ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn"))
    list(pool.map(burn, [0.02] * n))  # every process up and helpers imported
    return pool, time.perf_counter() - t0


def execute(dag: DAG, workers: int, fn=embedding_task, pool=None) -> Schedule:
    """Run ``dag`` for real on a process pool of ``workers`` processes with the greedy rule.

    ``fn(task, duration, inputs)`` computes one task; ``inputs`` maps each predecessor to its
    result. Ready tasks are submitted in graph order as soon as their predecessors are done; the
    pool hands each to the next free process. Returns the *measured* :class:`Schedule` (times in
    seconds from the first submission; worker = process, numbered by first appearance), with
    every task's return value in ``.results``. Pass a warm ``pool`` (from :func:`start_pool`) to
    keep process start-up out of the measurement.
    """
    from concurrent.futures import FIRST_COMPLETED, wait

    n = integer_at_least(workers, "the number of workers N")
    own = pool is None
    if own:
        pool, _ = start_pool(n)
    try:
        indeg = {t: len(p) for t, p in dag.preds.items()}
        results: dict = {}
        pending = {}
        t0 = time.perf_counter()

        def submit(t):
            inputs = {p: results[p] for p in dag.preds[t]}
            pending[pool.submit(_timed_call, fn, t, dag.durations[t], inputs)] = t

        for t in dag.durations:
            if indeg[t] == 0:
                submit(t)
        raw = []
        while pending:
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for f in sorted(done, key=lambda f: dag.order.index(pending[f])):
                t = pending.pop(f)
                pid, a, b, out = f.result()
                results[t] = out
                raw.append((t, pid, a - t0, b - t0))
                for v in dag.succs[t]:
                    indeg[v] -= 1
                    if indeg[v] == 0:
                        submit(v)
    finally:
        if own:
            pool.shutdown()
    wid: dict[int, int] = {}
    for _, pid, a, _ in sorted(raw, key=lambda r: r[2]):
        wid.setdefault(pid, len(wid))
    slots = [Slot(t, wid[pid], a, b) for t, pid, a, b in raw]
    return Schedule(max(n, len(wid)), slots, dag.work(), results)


def median_schedule(schedules: list[Schedule]) -> Schedule:
    """The schedule with the median makespan (the lower middle one for an even count)."""
    if not schedules:
        raise ValueError("need at least one schedule")
    ordered = sorted(schedules, key=lambda s: s.makespan)
    return ordered[(len(ordered) - 1) // 2]


def embedding_job_worker(n_chunks: int = 100, embed_s: float = 0.01, merge_s: float = 0.05,
                         index_s: float = 0.1, dim: int = 16):
    """The embedding job on launcher ranks (P.1): rank r embeds chunks r, r+W, r+2W, ...
    (the greedy schedule's assignment when all embeddings take equal time), rank 0 gathers the
    vectors, merges and builds the index. Returns the index on rank 0, None elsewhere; each
    phase is a :func:`helpers.launcher.commlog.span`.
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = {}
    for i in range(rank, n_chunks, world):
        t = f"embed[{i}]"
        with timed_span("embed"):
            mine[t] = embedding_task(t, embed_s, {}, dim)
    gathered = [None] * world if rank == 0 else None
    with timed_span("gather"):
        dist.gather_object(mine, gathered, dst=0)
    if rank != 0:
        return None
    embs = {k: v for part in gathered for k, v in part.items()}
    with timed_span("merge"):
        merged = embedding_task("merge", merge_s, embs, dim)
    with timed_span("index"):
        return embedding_task("index", index_s, {"merge": merged}, dim)


# ---- drawing (in helpers.plots) --------------------------------------------------------------------

def gantt(schedule: Schedule, ax=None, title: str | None = None, colors: dict | None = None):
    """Draw a schedule as a Gantt chart: one row per worker, one bar per task, coloured by kind
    (:func:`kind`); drawn by :func:`helpers.plots.task_gantt`."""
    from .plots import task_gantt

    return task_gantt(schedule, kind, ax, title=title, colors=colors)
