"""Concurrency versus parallelism, measured (P.2).

* Waiting overlapped on one thread: the section's two calls (policy search ~120 ms, order lookup
  ~200 ms) issued with ``asyncio.gather`` take about max(120, 200) ms, not the sum. The model for
  any set of independent calls, with or without a limit on how many may be in flight, is a greedy
  schedule of a task graph (:mod:`helpers.dag`).
* Computing in parallel: the same CPU-bound work run serially, on threads and on processes. In
  CPython a thread runs Python bytecode only while it holds the interpreter lock, so pure-Python
  work does not speed up on threads; processes (one interpreter each) or native code that releases
  the lock (hashing a large buffer, most numpy/torch kernels) do.
* Measurement helpers: :func:`measure` (warm-up, repeats, median and spread) and :func:`run_on`.
"""
from __future__ import annotations

import asyncio
import hashlib
import statistics
import threading
import time
from dataclasses import dataclass

from .dag import DAG, list_schedule
from .validate import integer_at_least, positive_number

KINDS = ("serial", "threads", "processes")


# ---- asyncio: overlapping waits -------------------------------------------------------------------

async def retrieve_policy(delay: float = 0.120):
    """Stand-in for the vector-store call of P.2 (waits ``delay`` seconds)."""
    await asyncio.sleep(delay)
    return ["POL-EU-009#c0002"]


async def lookup_order(delay: float = 0.200):
    """Stand-in for the order-lookup tool call of P.2 (waits ``delay`` seconds)."""
    await asyncio.sleep(delay)
    return {"order": "A-1042", "status": "shipped"}


def _check_delays(delays) -> dict:
    if isinstance(delays, dict):
        items = dict(delays)
    else:
        items = {f"call{i}": d for i, d in enumerate(delays)}
    if not items:
        raise ValueError("need at least one call")
    for k, d in items.items():
        positive_number(d, f"the delay (seconds) of call {k!r}", allow_zero=True)
    return items


def _check_limit(limit):
    if limit is not None:
        integer_at_least(limit, "limit (None for no limit)")


async def run_calls(delays, limit: int | None = None, concurrent: bool = True) -> dict:
    """Issue independent waiting calls (``asyncio.sleep``) and time them.

    ``delays``: a list of seconds or a dict name -> seconds. ``concurrent=False`` awaits them one
    after the other; otherwise they are gathered, with at most ``limit`` in flight (a semaphore).
    Returns ``{"total": s, "calls": {name: (start, end)}, "threads": set of thread ids, "cpu": s}``.
    """
    items = _check_delays(delays)
    _check_limit(limit)
    sem = asyncio.Semaphore(limit) if limit else None
    t0 = time.perf_counter()
    c0 = time.process_time()
    calls, threads = {}, set()

    async def one(name, d):
        if sem is not None:
            await sem.acquire()
        try:
            a = time.perf_counter() - t0
            threads.add(threading.get_ident())
            await asyncio.sleep(d)
            calls[name] = (a, time.perf_counter() - t0)
        finally:
            if sem is not None:
                sem.release()

    if concurrent:
        await asyncio.gather(*(one(k, d) for k, d in items.items()))
    else:
        for k, d in items.items():
            await one(k, d)
    return {"total": time.perf_counter() - t0, "calls": calls, "threads": threads, "cpu": time.process_time() - c0}


def model_calls(delays, limit: int | None = None, concurrent: bool = True, edges=()) -> float:
    """Predicted seconds for the calls: the sum when sequential; otherwise the makespan of a greedy
    schedule with ``limit`` lanes (unlimited: the span of the graph, max of the delays when
    there are no ``edges`` between calls)."""

    items = _check_delays(delays)
    _check_limit(limit)
    if not concurrent:
        return float(sum(items.values()))
    g = DAG(items, edges)
    return float(g.span() if limit is None else list_schedule(g, limit).makespan)


def run_coro(coro):
    """Run a coroutine to completion from ordinary code, also inside Jupyter.

    ``asyncio.run`` refuses to start while an event loop is already running in the thread (a
    Jupyter kernel runs one); then the coroutine runs in a fresh loop on a helper thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box = {}

    def target():
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:  # re-raised in the caller
            box["error"] = e

    th = threading.Thread(target=target)
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


# ---- CPU-bound work: threads versus processes -------------------------------------------------

def count_mod7(n: int) -> int:
    """Pure-Python CPU work (the loop of the chapter's scaling experiment): sum of i*i % 7 over range(n)."""
    integer_at_least(n, "n", 0)
    return count_mod7_range(0, n)


def count_mod7_range(start: int, stop: int) -> int:
    """Sum of i*i % 7 for i in range(start, stop): a slice of :func:`count_mod7`'s work."""
    for name, v in (("start", start), ("stop", stop)):
        integer_at_least(v, name, 0)
    if stop < start:
        raise ValueError(f"need start <= stop, got start={start}, stop={stop}")
    s = 0
    for i in range(start, stop):
        s += i * i % 7
    return s


def count_mod7_exact(n: int) -> int:
    """Closed form of :func:`count_mod7` (i*i % 7 has period 7: 0,1,4,2,2,4,1)."""
    integer_at_least(n, "n", 0)
    cycle = (0, 1, 4, 2, 2, 4, 1)
    q, r = divmod(n, 7)
    return q * sum(cycle) + sum(cycle[:r])


_BUF: bytes | None = None


def sha_rounds(rounds: int, mib: int = 4) -> str:
    """Native work that releases the interpreter lock: SHA-256 of a ``mib`` MiB buffer, ``rounds`` times."""
    global _BUF
    integer_at_least(rounds, "rounds", 0)
    if _BUF is None or len(_BUF) != mib << 20:
        _BUF = bytes(mib << 20)
    h = hashlib.sha256()
    for _ in range(rounds):
        h.update(_BUF)  # hashlib drops the GIL for buffers over 2 KiB
    return h.hexdigest()


def sleep_for(seconds: float) -> float:
    """Waiting, not computing (a blocking I/O stand-in)."""
    time.sleep(seconds)
    return seconds


def _noop(x=None):
    return x


def start_processes(workers: int):
    """A warm process pool (spawn): returns ``(pool, start-up seconds)``; ``pool.shutdown()`` ends it."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    integer_at_least(workers, "workers")
    t0 = time.perf_counter()
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    list(pool.map(_noop, range(workers)))
    return pool, time.perf_counter() - t0


def run_on(kind: str, fn, args: list, workers: int = 2, pool=None) -> tuple[float, list]:
    """Run ``fn(a)`` for every ``a`` in ``args`` serially, on a thread pool or on a process pool of
    ``workers``; return ``(wall seconds, results in order)``. For ``"processes"`` pass a warm
    ``pool`` (:func:`start_processes`) to keep start-up out of the time."""
    from concurrent.futures import ThreadPoolExecutor

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    integer_at_least(workers, "workers")
    if kind == "serial":
        t0 = time.perf_counter()
        out = [fn(a) for a in args]
        return time.perf_counter() - t0, out
    if kind == "threads":
        with ThreadPoolExecutor(workers) as ex:
            t0 = time.perf_counter()
            out = list(ex.map(fn, args))
            return time.perf_counter() - t0, out
    own = pool is None
    if own:
        pool, _ = start_processes(workers)
    try:
        t0 = time.perf_counter()
        out = list(pool.map(fn, args))
        return time.perf_counter() - t0, out
    finally:
        if own:
            pool.shutdown()


@dataclass(frozen=True)
class Timing:
    """Repeated wall-clock measurements of one thing: median, spread, all samples (seconds)."""

    samples: tuple

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        return max(self.samples) - min(self.samples)

    def __str__(self) -> str:
        return f"{self.median * 1e3:8.1f} ms (spread {self.spread * 1e3:.1f} ms, n={len(self.samples)})"


def measure(fn, *args, repeats: int = 3, warmup: int = 1, **kwargs) -> Timing:
    """Call ``fn(*args, **kwargs)`` ``warmup`` times (discarded), then ``repeats`` times, timing each."""
    integer_at_least(repeats, "repeats")
    integer_at_least(warmup, "warmup", 0)
    for _ in range(warmup):
        fn(*args, **kwargs)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        out.append(time.perf_counter() - t0)
    return Timing(tuple(out))


def calibrate(fn, target_s: float, start: int = 1000, max_n: int = 10**9) -> int:
    """The argument ``n`` for which ``fn(n)`` takes about ``target_s`` seconds here (doubling, then scaling)."""
    positive_number(target_s, "target_s")
    n = start
    while True:
        t0 = time.perf_counter()
        fn(n)
        dt = time.perf_counter() - t0
        if dt > target_s / 8 or n >= max_n:
            return max(1, min(max_n, int(n * target_s / max(dt, 1e-9))))
        n *= 2


# ---- batching: one matrix product instead of many vector products -----------------------------

def loop_vs_batch(n_vectors: int = 256, d: int = 256, seed: int = 0, repeats: int = 5) -> dict:
    """Apply a d x d matrix to ``n_vectors`` vectors one at a time (a Python loop of mat-vecs) and
    as one batch (a single mat-mat), each timed ``repeats`` times, alternating. Returns both
    timings and the max difference of the results."""
    import numpy as np

    integer_at_least(n_vectors, "n_vectors")
    integer_at_least(d, "d")
    integer_at_least(repeats, "repeats")
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(d, d))
    X = rng.normal(size=(n_vectors, d))
    pairs = [(measure(lambda: np.stack([W @ x for x in X]), repeats=1).samples[0],
              measure(lambda: X @ W.T, repeats=1).samples[0]) for _ in range(repeats)]
    loop, batch = Timing(tuple(p[0] for p in pairs)), Timing(tuple(p[1] for p in pairs))
    diff = float(np.abs(np.stack([W @ x for x in X]) - X @ W.T).max())
    return {"loop": loop, "batch": batch, "max_abs_diff": diff}
