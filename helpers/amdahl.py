"""Amdahl's law, Gustafson's scaled speedup and the Karp-Flatt serial fraction (P.4, P.5, P.13).

A job takes ``T1`` on one worker; a fraction ``p`` of that time parallelises perfectly and the
rest, ``1 - p``, is strictly serial. On ``N`` workers (P.4):

    T(N) = T1 * ((1 - p) + p / N)
    S(N) = 1 / ((1 - p) + p / N)          speedup
    E(N) = S(N) / N                        efficiency
    S(inf) = 1 / (1 - p)                   ceiling

Gustafson (weak scaling, each worker gets a problem of the base size): ``N - (1 - p)(N - 1)``.
Karp-Flatt (P.5, P.13), from a *measured* speedup: ``e = (1/S - 1/N) / (1 - 1/N)``. It is the
exact inverse of Amdahl's law: on Amdahl data ``e == 1 - p`` for every ``N``.

Every function takes scalars or numpy arrays (for curves) and rejects bad input with a
``ValueError`` that names the constraint: ``p`` in [0, 1], ``N >= 1``, speedups > 0, ...
"""
from __future__ import annotations

import numpy as np

from .efficiency import round_robin_tasks
from .launcher.commlog import span
from .validate import durations, integer_at_least


def _arr(x, name: str) -> np.ndarray:
    if isinstance(x, bool) or (isinstance(x, np.ndarray) and x.dtype == bool):
        raise ValueError(f"{name} must be a number, got a boolean {x!r}")
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number (or an array of them), got {x!r}") from None
    if np.any(np.isnan(a)):
        raise ValueError(f"{name} must not be NaN, got {x!r}")
    return a


def _out(a: np.ndarray):
    return float(a) if a.ndim == 0 else a


def check_p(p) -> np.ndarray:
    """``p`` as an array; ValueError unless 0 <= p <= 1 (p is the parallel fraction of T1)."""
    a = _arr(p, "p")
    if np.any(a < 0) or np.any(a > 1):
        raise ValueError(f"p (the parallel fraction) must lie in [0, 1], got {p!r}")
    return a


def check_workers(n, name: str = "N", minimum: float = 1) -> np.ndarray:
    """``N`` as an array; ValueError unless N >= 1 and finite (real N is allowed, for curves)."""
    a = _arr(n, name)
    if np.any(~np.isfinite(a)) or np.any(a < minimum):
        raise ValueError(f"{name} (the number of workers) must be a finite number >= {minimum:g}, got {n!r}")
    return a


def check_speedup(s, name: str = "S") -> np.ndarray:
    a = _arr(s, name)
    if np.any(~np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{name} (a speedup) must be a finite number > 0, got {s!r}")
    return a


# ---- Amdahl (P.4) ---------------------------------------------------------------------------

def time_on(t1, p, n):
    """T(N) = T1 ((1 - p) + p/N): Amdahl's predicted time on N workers (P.4)."""
    t = _arr(t1, "T1")
    if np.any(t < 0) or np.any(~np.isfinite(t)):
        raise ValueError(f"T1 (the one-worker time) must be a finite number >= 0, got {t1!r}")
    p, n = check_p(p), check_workers(n)
    return _out(t * ((1 - p) + p / n))


def speedup(p, n):
    """Amdahl's speedup S(N) = 1 / ((1 - p) + p/N) (P.4)."""
    p, n = check_p(p), check_workers(n)
    return _out(1.0 / ((1 - p) + p / n))


def efficiency(p, n):
    """Parallel efficiency E(N) = S(N)/N under Amdahl (P.4)."""
    n_ = check_workers(n)
    return _out(np.asarray(speedup(p, n)) / n_)


def ceiling(p):
    """S(inf) = 1/(1 - p); ``inf`` for p = 1 (P.4)."""
    p = check_p(p)
    with np.errstate(divide="ignore"):
        return _out(np.where(p == 1, np.inf, 1.0 / np.where(p == 1, 1.0, 1 - p)))


def wasted_workers(p, n):
    """N - S(N): how many of the N workers are, in effect, idle (P.4: 8 - 4.7 = 3.3)."""
    return _out(check_workers(n) - np.asarray(speedup(p, n)))


def table(p, ns=(1, 2, 4, 8, 16, 32, 64, 128)) -> list[dict]:
    """Rows of N, T(N)/T1, speedup, efficiency, wasted workers for one p (P.4's lost table)."""
    if np.ndim(p) != 0:
        raise ValueError(f"p must be a single number for a table, got {p!r}")
    p_ = float(check_p(p))
    rows = []
    for n in ns:
        n_ = float(check_workers(n))
        rows.append({"N": n, "time_fraction": time_on(1.0, p_, n_), "speedup": speedup(p_, n_),
                     "efficiency": efficiency(p_, n_), "wasted": wasted_workers(p_, n_)})
    return rows


def p_for_speedup(s, n):
    """The parallel fraction p that Amdahl needs for speedup ``s`` on ``n`` workers (P.4).

    Solves 1/s = (1 - p) + p/n: p = (1 - 1/s) / (1 - 1/n). Needs n > 1 and 1 <= s <= n
    (a speedup below 1 or above n has no p in [0, 1]).
    """
    s, n = check_speedup(s, "s"), check_workers(n, "n")
    if np.any(n <= 1):
        raise ValueError(f"n must be > 1 to solve for p (on one worker every p gives speedup 1), got {n!r}")
    if np.any(s < 1) or np.any(s > n):
        raise ValueError(f"the target speedup must satisfy 1 <= s <= n for p to lie in [0, 1], got s={s!r}, n={n!r}")
    return _out((1 - 1 / s) / (1 - 1 / n))


def p_for_efficiency(e, n):
    """The p needed for efficiency ``e`` on ``n`` workers (P.4: 90% on 8 workers needs p = 0.984).

    Efficiency must satisfy 1/n <= e <= 1 (E = S/n with 1 <= S <= n).
    """
    e_, n_ = _arr(e, "e"), check_workers(n, "n")
    if np.any(e_ <= 0) or np.any(e_ > 1) or np.any(e_ * n_ < 1 - 1e-12):
        raise ValueError(f"the target efficiency must satisfy 1/n <= e <= 1, got e={e!r}, n={n!r}")
    return p_for_speedup(np.maximum(e_ * n_, 1.0), n_)


# ---- Gustafson (P.4) ------------------------------------------------------------------------

def gustafson(p, n):
    """Scaled speedup N - (1 - p)(N - 1) = (1 - p) + pN (P.4, weak scaling).

    Here ``p`` is the parallel share of the time of the run on N workers, which equals the
    base problem's parallel share on one worker when each worker gets one base-sized problem.
    """
    p, n = check_p(p), check_workers(n)
    return _out(n - (1 - p) * (n - 1))


def gustafson_serial_fraction(scaled_speedup, n):
    """Invert Gustafson: 1 - p = (N - S_scaled)/(N - 1), from a measured scaled speedup (P.13)."""
    s, n = check_speedup(scaled_speedup, "scaled_speedup"), check_workers(n)
    if np.any(n <= 1):
        raise ValueError(f"N must be > 1 to infer a serial fraction, got {n!r}")
    return _out((n - s) / (n - 1))


# ---- Karp-Flatt (P.5, P.13) -----------------------------------------------------------------

def karp_flatt(s, n):
    """The experimentally determined serial fraction e = (1/S - 1/N) / (1 - 1/N) (P.5, P.13).

    Needs N > 1 (at N = 1 it is 0/0). A superlinear speedup (S > N) gives e < 0, returned as is.
    On Amdahl data, ``karp_flatt(speedup(p, n), n) == 1 - p`` for every n > 1.
    """
    s, n = check_speedup(s), check_workers(n)
    if np.any(n <= 1):
        raise ValueError(f"N must be > 1 for the Karp-Flatt metric (it is 0/0 at N = 1), got {n!r}")
    return _out((1 / s - 1 / n) / (1 - 1 / n))


def fit_amdahl(ns, speedups) -> float:
    """Least-squares p of Amdahl's law through measured (N, S) points (P.13).

    1/S = (1 - p) + p/N is linear in 1/N; fit 1/S - 1 = p (1/N - 1) through the origin.
    The result is not clipped, so a fit outside [0, 1] shows the data are not Amdahl-shaped.
    """
    n = check_workers(ns, "ns")
    s = check_speedup(speedups, "speedups")
    if n.shape != s.shape or n.ndim != 1:
        raise ValueError(f"ns and speedups must be 1-D and of equal length, got {n.shape} and {s.shape}")
    x, y = 1 / n - 1, 1 / s - 1
    if not np.any(x != 0):
        raise ValueError("need at least one point with N > 1 to fit p")
    return float(np.dot(x, y) / np.dot(x, x))



# ---- granularity, and the law on real ranks (P.4) -------------------------------------------

def granular_time(n_tasks: int, task_s: float, serial_s: float, n: int) -> float:
    """Time of ``n_tasks`` equal, indivisible tasks on ``n`` workers, then a serial tail (P.4).

    ceil(n_tasks / n) * task_s + serial_s: the embedding job's 13 rounds x 2 s + 30 s on 8 workers.
    Amdahl's ``time_on`` divides the parallel part as if it were a fluid: n_tasks * task_s / n.
    """
    for name, v in (("n_tasks", n_tasks), ("n", n)):
        integer_at_least(v, name)
    durations([task_s, serial_s], "the durations task_s and serial_s")
    return -(-n_tasks // n) * task_s + serial_s


def amdahl_job_worker(n_tasks: int, task_s: float, serial_s: float):
    """An Amdahl-shaped job on the launcher's ranks (P.4): ``n_tasks`` tasks of ``task_s`` seconds
    dealt round-robin (rank r takes r, r+N, ...), then a serial tail of ``serial_s`` on rank 0
    while the others wait. Work is a sleep, so ranks do not compete for this machine's 2 cores.

    Returns this rank's task count, its busy time and the job's elapsed time as it saw it.
    """
    import time

    import torch.distributed as dist

    granular_time(n_tasks, task_s, serial_s, dist.get_world_size())  # validates
    tasks, t0, t1, _ = round_robin_tasks(n_tasks, task_s, "parallel")  # the serial tail needs every task's result
    if dist.get_rank() == 0:
        with span("serial"):
            time.sleep(serial_s)
    with span("wait"):
        dist.barrier()  # the job ends when the tail ends
    return {"tasks": tasks, "busy": t1 - t0, "elapsed": time.perf_counter() - t0}
