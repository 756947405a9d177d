"""The scaling experiment (P.13): a reusable protocol and its analysis.

Protocol (P.13, steps 1-4), as :func:`run_protocol`:

1. fix the workload and say which mode ran: ``"strong"`` (total work fixed) or ``"weak"``
   (work per worker fixed);
2. warm up and discard the first run(s), repeat each setting (>= 5 times by default), report the
   median and the spread (min, max), not the best run;
3. time each phase separately (:class:`PhaseTimer`) and keep per-worker times so imbalance shows;
4. derive speedup, efficiency and the Karp-Flatt serial fraction (:func:`analyze`).

A *measure* function ``measure(n, count)`` runs the workload ``count`` times on ``n`` workers and
returns ``count`` :class:`Trial` objects (phase times and per-worker times). Three are provided:
:func:`serial_measure` (the best single-worker implementation: a plain loop, no pool),
:func:`pool_measure` (the chapter's ``multiprocessing.Pool`` code, with its timers fixed so
pool teardown is not booked as "combine") and :func:`rank_measure` (the same work on the
launcher's ``torch.distributed`` ranks, combined with an all-reduce).
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from .amdahl import gustafson_serial_fraction, karp_flatt
from .launcher import launch
from .launcher.commlog import span
from .validate import durations, integer_at_least, positive_number

MODES = ("strong", "weak")


def _mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES} (strong: total work fixed; weak: work per worker fixed), got {mode!r}")
    return mode


# ---- the workload (the chapter's) ----------------------------------------------------------------

def work(n: int) -> int:
    """The chapter's CPU-bound task: a pure-Python loop of ``n`` iterations (P.13)."""
    s = 0
    for i in range(n):
        s += i * i % 7
    return s


def work_reference(n: int) -> int:
    """``work(n)`` in closed form (sum of i*i % 7 over i < n), to check results exactly."""
    integer_at_least(n, "n", 0)
    period = [i * i % 7 for i in range(7)]  # i*i % 7 depends only on i % 7
    q, r = divmod(n, 7)
    return q * sum(period) + sum(period[:r])


def task_sizes(mode: str, workers: int, tasks: int, size: int) -> list[int]:
    """The task list for one setting: ``tasks`` tasks in strong mode, ``tasks * workers`` in weak."""
    _mode(mode)
    workers, tasks, size = (integer_at_least(v, k) for v, k in ((workers, "workers"), (tasks, "tasks"), (size, "size")))
    return [size] * (tasks if mode == "strong" else tasks * workers)


def _timed_work(n: int):
    import os

    t0, c0 = time.perf_counter(), time.process_time()
    out = work(n)
    return out, os.getpid(), time.perf_counter() - t0, time.process_time() - c0


# ---- phase timers and trials ---------------------------------------------------------------------

class PhaseTimer:
    """Accumulates wall time per named phase: ``with timer.phase("compute"): ...`` (P.13 step 3)."""

    def __init__(self):
        self.phases: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0


@dataclass(frozen=True)
class Trial:
    """One run of the workload: seconds per phase, each worker's busy (wall) seconds and, where
    measured, each worker's CPU seconds over the same stretch (CPU < wall: it waited for a core)."""

    phases: dict
    per_worker: tuple = ()
    result: object = None
    per_worker_cpu: tuple = ()

    def __post_init__(self):
        if not self.phases:
            raise ValueError("a trial needs at least one timed phase")
        durations(self.phases.values(), "phase times")
        if self.per_worker or self.per_worker_cpu:
            durations(self.per_worker + self.per_worker_cpu, "per-worker times")
        if self.per_worker_cpu and len(self.per_worker_cpu) != len(self.per_worker):
            raise ValueError("per_worker_cpu must have one entry per worker, like per_worker")

    @property
    def total(self) -> float:
        return sum(self.phases.values())


def _median_spread(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


@dataclass
class Setting:
    """All trials at one worker count: the kept ones and the discarded warm-up(s)."""

    workers: int
    trials: list
    warmup: list = field(default_factory=list)

    def values(self, phase: str | None = None) -> list[float]:
        if phase is not None and any(phase not in t.phases for t in self.trials):
            raise ValueError(f"phase {phase!r} is not timed in every trial; phases: {sorted(self.trials[0].phases)}")
        return [t.total if phase is None else t.phases[phase] for t in self.trials]

    def median(self, phase: str | None = None) -> float:
        """Median over kept trials of the total (or of one phase)."""
        return statistics.median(self.values(phase))

    def spread(self, phase: str | None = None) -> tuple[float, float]:
        """(min, max) over kept trials: report it beside the median, never the best run alone."""
        v = self.values(phase)
        return min(v), max(v)

    def phase_medians(self) -> dict[str, float]:
        return {p: self.median(p) for p in self.trials[0].phases}

    def per_worker_median(self) -> list[float]:
        """Each worker's median busy time over kept trials (empty if the measure gave none)."""
        k = {len(t.per_worker) for t in self.trials}
        if k == {0}:
            return []
        if len(k) != 1:
            raise ValueError("trials disagree on the number of workers")
        return [statistics.median(t.per_worker[w] for t in self.trials) for w in range(k.pop())]

    def cpu_share(self) -> float:
        """Median over trials of (CPU seconds / busy wall seconds), summed over workers.

        About 1.0: every worker had a core while busy. About cores / workers (0.5 for 4 workers on
        2 cores): the workers took turns. Lower still: other jobs were using the cores too.
        """
        shares = [sum(t.per_worker_cpu) / sum(t.per_worker) for t in self.trials
                  if t.per_worker_cpu and sum(t.per_worker) > 0]
        if not shares:
            raise ValueError("no per-worker CPU times were measured")
        return statistics.median(shares)

    def imbalance(self) -> float:
        """max / mean of the per-worker median busy times (1.0 is perfect balance)."""
        pw = self.per_worker_median()
        if not pw or sum(pw) == 0:
            raise ValueError("no per-worker times to judge imbalance")
        return max(pw) / (sum(pw) / len(pw))


@dataclass
class Experiment:
    """What :func:`run_protocol` measured: the mode, one :class:`Setting` per worker count, and
    the machine it ran on (``environment``: usable cores, 1-minute load average before and after)."""

    mode: str
    settings: dict
    environment: dict = field(default_factory=dict)

    def times(self, phase: str | None = None) -> dict[int, float]:
        """Median time per worker count."""
        return {n: s.median(phase) for n, s in sorted(self.settings.items())}

    def analysis(self, baseline: float | None = None) -> list[dict]:
        """:func:`analyze` of the median totals (``baseline``: a better one-worker time, if any)."""
        return analyze(self.times(), baseline=baseline, mode=self.mode)

    def summary(self) -> list[dict]:
        """One row per setting: median, spread, phase medians, per-worker medians."""
        rows = []
        for n, s in sorted(self.settings.items()):
            lo, hi = s.spread()
            cpu = s.cpu_share() if all(t.per_worker_cpu for t in s.trials) else None
            rows.append({"workers": n, "median": s.median(), "min": lo, "max": hi, "repeats": len(s.trials),
                         "phases": s.phase_medians(), "per_worker": s.per_worker_median(), "cpu_share": cpu})
        return rows


def environment() -> dict:
    """What shares the machine (P.13 step 2): usable cores and the 1-minute load average."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {"cores": cores, "load": load}


def run_protocol(measure, workers=(1, 2, 4), repeats: int = 5, warmup: int = 1, mode: str = "strong",
                 interleave: bool = False) -> Experiment:
    """Run the P.13 protocol: for each worker count, ``warmup + repeats`` runs, warm-up discarded.

    ``measure(n, count)`` must return ``count`` :class:`Trial` objects for ``n`` workers. ``mode``
    only labels the experiment and chooses the analysis (the measure decides the workload; the
    provided measures take the mode too). ``interleave=True`` measures the settings round-robin
    (1, 2, 4, 1, 2, 4, ... one run at a time), so a change in what else loads the machine
    affects every setting alike instead of biasing whichever ran during it.
    """
    _mode(mode)
    repeats = integer_at_least(repeats, "repeats")
    integer_at_least(warmup, "warmup", 0)
    workers = list(workers)
    if not workers:
        raise ValueError("workers must list at least one worker count")
    for n in workers:
        integer_at_least(n, "each worker count")
    if len(set(workers)) != len(workers):
        raise ValueError(f"worker counts must be distinct, got {workers}")
    def call(n, count):
        got = list(measure(n, count))
        if len(got) != count or not all(isinstance(t, Trial) for t in got):
            raise ValueError(f"measure({n}, {count}) must return {count} Trial objects, got {len(got)}")
        return got

    before = environment()
    runs: dict[int, list] = {n: [] for n in workers}
    if interleave:
        for _ in range(warmup + repeats):
            for n in workers:
                runs[n] += call(n, 1)
    else:
        for n in workers:
            runs[n] = call(n, warmup + repeats)
    settings = {n: Setting(n, runs[n][warmup:], runs[n][:warmup]) for n in workers}
    env = {"cores": before["cores"], "load_before": before["load"], "load_after": environment()["load"]}
    return Experiment(mode, settings, env)


# ---- analysis (P.13 step 4) ------------------------------------------------------------------------

def analyze(times, baseline: float | None = None, mode: str = "strong") -> list[dict]:
    """Speedup, efficiency and serial fraction per worker count from ``{N: time}``.

    Strong scaling: ``S = T_base / T(N)``, ``E = S / N``, Karp-Flatt ``e = (1/S - 1/N)/(1 - 1/N)``.
    Weak scaling: scaled speedup ``S = N T_base / T(N)``, ``E = T_base / T(N)``, and Gustafson's
    serial fraction ``(N - S)/(N - 1)``. ``T_base`` is ``baseline`` if given (the best single-worker
    implementation, which P.4 calls the honest baseline), else ``T(1)``. ``e`` is None at N = 1.
    """

    _mode(mode)
    if not times:
        raise ValueError("times must map at least one worker count to a time")
    for n, t in times.items():
        integer_at_least(n, "each worker count")
        positive_number(t, f"the time T({n})")
    if baseline is None:
        if 1 not in times:
            raise ValueError("no baseline: give times[1] (one worker) or baseline=")
        baseline = times[1]
    positive_number(baseline, "baseline (the one-worker time)")
    rows = []
    for n in sorted(times):
        t = times[n]
        if mode == "strong":
            s = baseline / t
            e = s / n
            frac = karp_flatt(s, n) if n > 1 else None
        else:
            s = n * baseline / t
            e = baseline / t
            frac = gustafson_serial_fraction(s, n) if n > 1 else None
        rows.append({"N": n, "time": t, "speedup": s, "efficiency": e, "serial_fraction": frac})
    return rows


def karp_flatt_range(t1: float, tn: float, n: int, half_width: float) -> tuple[float, float]:
    """The Karp-Flatt e's range when ``t1`` and ``tn`` are known only to +-``half_width`` (rounding).

    e = (T(N)/T(1) - 1/N)/(1 - 1/N) grows with T(N) and falls with T(1), so the extremes sit at
    the corners. (P.13's table gives whole seconds: half_width = 0.5.)
    """

    positive_number(half_width, "half_width", allow_zero=True)
    if t1 - half_width <= 0 or tn - half_width <= 0:
        raise ValueError("times must exceed half_width")
    lo = karp_flatt((t1 + half_width) / (tn - half_width), n)
    hi = karp_flatt((t1 - half_width) / (tn + half_width), n)
    return lo, hi


# ---- measures -----------------------------------------------------------------------------------

def serial_measure(tasks: int = 16, size: int = 100_000, mode: str = "strong"):
    """The best single-worker implementation: a plain loop in this process, no pool (P.13)."""
    _mode(mode)

    def measure(n: int, count: int) -> list[Trial]:
        out = []
        for _ in range(count):
            timer = PhaseTimer()
            c0 = time.process_time()
            with timer.phase("compute"):
                result = sum(work(k) for k in task_sizes(mode, n, tasks, size))
            out.append(Trial(timer.phases, (timer.phases["compute"],), result, (time.process_time() - c0,)))
        return out

    return measure


def pool_measure(tasks: int = 16, size: int = 100_000, mode: str = "strong", start_method: str = "forkserver"):
    """The chapter's ``multiprocessing.Pool`` experiment, with four timers instead of three.

    Phases: ``startup`` (creating the pool), ``parallel`` (``pool.map``), ``teardown`` (leaving
    the ``with`` block, which terminates the workers) and ``combine`` (the serial sum). The
    chapter's code books teardown under "combine". Per-worker times: each process's busy seconds.
    ``forkserver`` (or ``spawn``) keeps it safe inside a kernel that already ran torch threads.
    """
    import multiprocessing as mp

    _mode(mode)
    ctx = mp.get_context(start_method)

    def measure(n: int, count: int) -> list[Trial]:
        out = []
        for _ in range(count):
            sizes = task_sizes(mode, n, tasks, size)
            timer = PhaseTimer()
            with timer.phase("startup"):
                pool = ctx.Pool(n)
            with pool:
                with timer.phase("parallel"):
                    timed = pool.map(_timed_work, sizes, chunksize=1)
                t_exit = time.perf_counter()
            timer.phases["teardown"] = time.perf_counter() - t_exit
            with timer.phase("combine"):
                result = sum(r for r, _, _, _ in timed)
            busy: dict[int, list] = {}
            for _, pid, dt, dc in timed:
                acc = busy.setdefault(pid, [0.0, 0.0])
                acc[0] += dt
                acc[1] += dc
            pairs = sorted(busy.values(), reverse=True) + [[0.0, 0.0]] * (n - len(busy))
            out.append(Trial(timer.phases, tuple(w for w, _ in pairs), result, tuple(c for _, c in pairs)))
        return out

    return measure


def scaling_worker(tasks: int, size: int, count: int, mode: str = "strong"):
    """On the launcher's ranks: ``count`` runs of the workload; rank r does tasks r, r+N, ...,
    then the partial sums are combined with an all-reduce. Returns per run
    (compute, combine, sum, compute CPU seconds).

    Runs are lined up by a barrier, so a run's time is the slowest rank's compute plus the
    combine (which includes waiting for that slowest rank).
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = task_sizes(mode, world, tasks, size)
    runs = []
    for _ in range(integer_at_least(count, "count")):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        with span("compute"):
            part = sum(work(k) for k in sizes[rank::world])
        t1, c1 = time.perf_counter(), time.process_time()
        with span("combine"):
            total = torch.tensor([part], dtype=torch.int64)
            dist.all_reduce(total)
        t2 = time.perf_counter()
        runs.append((t1 - t0, t2 - t1, int(total.item()), c1 - c0))
    return runs


def rank_measure(tasks: int = 16, size: int = 100_000, mode: str = "strong", timeout: float = 60.0):
    """The workload on ``n`` launcher ranks, all runs of a setting in one launch (P.13).

    A trial's phases: ``compute`` (the slowest rank's compute) and ``combine`` (the rest of the
    run: waiting for the slowest, then the all-reduce). Per-worker: each rank's compute time.
    Process start-up and ``init_process_group`` happen once per launch and are not in the trials.
    """
    _mode(mode)

    def measure(n: int, count: int) -> list[Trial]:
        run = launch(scaling_worker, tasks, size, count, mode, world_size=n, quiet=True, record=False, timeout=timeout)
        out = []
        for i in range(count):
            comp = [run.results[r][i][0] for r in range(n)]
            step = max(run.results[r][i][0] + run.results[r][i][1] for r in range(n))
            cpu = tuple(run.results[r][i][3] for r in range(n))
            out.append(Trial({"compute": max(comp), "combine": step - max(comp)}, tuple(comp), run.results[0][i][2], cpu))
        return out

    return measure
