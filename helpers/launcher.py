"""Run a worker function on N ranks from a notebook and get every rank's return value back.

Serves every notebook that runs ``torch.distributed`` (P.5 onwards; first used in P.6 and P.7).

    run = launch(fn, *args, world_size=4)      # prints: backend=gloo device=cpu world_size=4 ...
    run.results[r]                             # what fn returned on rank r
    run.comm[r], run.spans[r]                  # what rank r communicated, its named time spans

What it guarantees:

* **Backend from the hardware**: NCCL with one rank per GPU where GPUs are found, gloo on CPU
  processes otherwise (4 ranks by default). Asking for more ranks than GPUs runs CPU ranks and
  says so. One line says what ran.
* **Notebook functions work**: ``fn`` is pickled by value (cloudpickle), so a function defined in
  a notebook cell can be edited and re-run.
* **Output**: what each rank prints comes back and is printed as ``[rank r] ...`` in rank order.
* **Cheap repeats**: worker processes are started once per kernel (with torch imported once in a
  forkserver) and reused; each job gets a fresh process group. A repeat costs well under a second.
* **Bounded failure**: a rank that raises makes :func:`launch` raise :class:`RankError` with the
  rank and its traceback; a rank that hangs makes it raise :class:`LaunchTimeout` after
  ``timeout`` seconds (collectives themselves time out then too). Either way every worker process
  is ended before the call returns, and the next launch starts fresh ones.
* **Concurrency-safe**: each kernel owns a TCPStore on a port the OS picks (port 0); nothing is
  shared between two notebooks running at once.
"""
from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import pickle
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait as _wait_conns

from .commlog import CommOp, Span, summarize

BACKENDS = ("gloo", "nccl")
DEFAULT_CPU_WORLD = 4
MAX_CPU_RANKS = 16  # each CPU rank is a process holding its own torch (~300 MB)
DEFAULT_TIMEOUT = 30.0  # seconds for up to 4 ranks; these demos take well under that
_GRACE = 5.0  # seconds the watchdog waits past ``timeout`` for a rank to report its own timeout
_IDLE_WAIT = 10.0  # seconds a launch waits for the workers to finish tearing down the last job


class RankError(RuntimeError):
    """A rank raised inside the worker function. ``.rank`` and ``.remote_traceback`` say which/why."""

    def __init__(self, rank: int, summary: str, remote_traceback: str, others: dict | None = None):
        self.rank, self.summary, self.remote_traceback = rank, summary, remote_traceback
        self.others = others or {}
        more = "".join(f"\n(rank {r} also failed: {s})" for r, s in sorted(self.others.items()))
        super().__init__(f"rank {rank} raised {summary}\n\n--- traceback on rank {rank} ---\n{remote_traceback}{more}")


class LaunchTimeout(TimeoutError):
    """Some ranks did not finish within the timeout; ``.ranks`` lists them."""

    def __init__(self, ranks: list[int], timeout: float, outputs: dict[int, str]):
        self.ranks, self.timeout = ranks, timeout
        tail = "".join(
            f"\n  rank {r} last printed: {outputs.get(r, '').strip().splitlines()[-1]!r}"
            for r in ranks
            if outputs.get(r, "").strip()
        )
        super().__init__(
            f"ranks {ranks} did not finish within {timeout:g} s (stuck in a collective, or a loop); "
            f"all worker processes were ended{tail}"
        )


@dataclass(frozen=True)
class RankPlan:
    """Where the ranks of a job run: the backend, the device type and how many ranks."""

    backend: str
    device_type: str
    world_size: int
    note: str = ""

    def describe(self) -> str:
        per_rank = "one GPU per rank (cuda:<rank>)" if self.device_type == "cuda" else "CPU processes"
        line = f"backend={self.backend} device={self.device_type} world_size={self.world_size} ({per_rank})"
        return line + (f"; {self.note}" if self.note else "")


def gpu_count() -> int:
    """Number of CUDA devices this process can see (0 without torch.cuda)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_ranks(world_size: int | None = None, backend: str | None = None, gpus: int | None = None) -> RankPlan:
    """Choose backend, device and world size from the hardware (P.6/P.7 notebooks and all later).

    ``backend=None`` picks NCCL with one rank per GPU where ``gpus > 0`` and the world fits on
    them, and gloo on CPU processes otherwise. ``backend="nccl"`` insists on GPUs;
    ``backend="gloo"`` always runs CPU processes. ``gpus`` defaults to the visible GPU count and
    can be given to test the choice without the hardware.
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: allowed are None (choose from the hardware), 'gloo', 'nccl'")
    if world_size is not None and (not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1):
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    gpus = gpu_count() if gpus is None else gpus
    if gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {gpus}")
    if backend == "nccl":
        if gpus == 0:
            raise ValueError("backend='nccl' needs at least one GPU, and none is visible; use backend=None or 'gloo'")
        n = gpus if world_size is None else world_size
        if n > gpus:
            raise ValueError(f"backend='nccl' runs one rank per GPU: world_size={n} needs {n} GPUs, {gpus} visible")
        return RankPlan("nccl", "cuda", n)
    if backend is None and gpus > 0:
        if world_size is None or world_size <= gpus:
            return RankPlan("nccl", "cuda", gpus if world_size is None else world_size)
        note = f"{world_size} ranks asked for, only {gpus} GPU(s) found: running CPU ranks instead"
    elif backend is None:
        note = "no GPU found"
    else:
        note = ""
    n = DEFAULT_CPU_WORLD if world_size is None else world_size
    if n > MAX_CPU_RANKS:
        raise ValueError(f"world_size={n} CPU ranks is more than this launcher allows ({MAX_CPU_RANKS}); each rank is a process")
    return RankPlan("gloo", "cpu", n, note)


def lazy_connect(plan: RankPlan) -> bool:
    """Whether gloo connects each group's pairs on first use rather than at the group's creation.

    Only for gloo jobs of more than 8 ranks: a 16-rank 4-D mesh creates 32 subgroups, and
    connecting all their pairs at once on a loaded 2-core machine sometimes failed
    ("connectFullMesh ... Connection closed by peer"). Smaller jobs keep eager connection, which
    keeps failure diagnostics prompt (a monitored barrier names the missing rank after its own
    timeout instead of waiting on a lazy connection to it).
    """
    return plan.backend == "gloo" and plan.world_size > 8


def default_timeout(world_size: int) -> float:
    """The default job and collective timeout: 30 s up to 4 ranks, then 30 s x world_size / 4."""
    return DEFAULT_TIMEOUT * max(1.0, world_size / 4)


@dataclass
class Run:
    """What a launch brought back: per-rank results, printed output, communication and spans."""

    plan: RankPlan
    results: list
    outputs: list[str]
    comm: list[list[CommOp]]
    spans: list[list[Span]]
    wall_s: float
    started_pool: bool  # True when this launch had to start the worker processes
    rank_times: list[tuple[float, float]] = field(default_factory=list)  # (start, end) per rank, s

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def backend(self) -> str:
        return self.plan.backend

    def comm_summary(self, rank: int = 0) -> dict:
        """Calls, payload bytes and ring-model bytes sent per op name, on one rank."""
        return summarize(self.comm[rank])

    def bytes_sent(self, rank: int = 0) -> int:
        """Bytes rank ``rank`` handed to point-to-point ``send`` calls (exact, not a model)."""
        return sum(o.bytes for o in self.comm[rank] if o.op == "send")

    def count(self, op: str, rank: int = 0) -> int:
        """How many calls of ``op`` (e.g. ``"all_reduce"``) rank ``rank`` made."""
        return sum(1 for o in self.comm[rank] if o.op == op)


class _Pool:
    """The kernel's worker processes, kept between launches."""

    def __init__(self, device_type: str, threads: int):
        import torch.distributed as dist

        self.device_type, self.threads = device_type, threads
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.procs: list = []
        self.conns: list = []
        self.busy: set[int] = set()  # ranks that have not yet reported "idle" after their last job
        self.next_job = 0
        ctx = mp.get_context("forkserver")
        # torch._dynamo too: the communication recorder is a TorchDispatchMode, and the first op
        # under a mode imports torch._dynamo (torch._compile._disable_dynamo), 3-4 s of CPU. Paid
        # once here, not by every rank of every fresh pool (measured: a 1 s monitored barrier
        # took 4.5 s to fail on fresh workers, over 10 s on a loaded two-core machine).
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "cloudpickle", "helpers.worker"])
        self.ctx = ctx

    def grow(self, n: int, deadline: float):
        from . import worker

        new = []
        for rank in range(len(self.procs), n):
            parent, child = self.ctx.Pipe(duplex=True)
            p = self.ctx.Process(
                target=worker.main,
                args=(child, rank, self.device_type, os.getpid(), self.store.port, self.threads),
                daemon=True,
                name=f"helpers-rank-{rank}",
            )
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
            new.append(rank)
        for rank in new:
            conn = self.conns[rank]
            left = deadline - time.monotonic()
            if left <= 0 or not conn.poll(left):
                raise TimeoutError(f"worker process for rank {rank} did not start in time")
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                self.procs[rank].join(timeout=2)
                raise RuntimeError(
                    f"worker process for rank {rank} exited during start-up (exit code {self.procs[rank].exitcode}); "
                    "in a script, call launch() only under `if __name__ == '__main__':`"
                ) from None
            if msg[0] != "ready":  # pragma: no cover - protocol error
                raise RuntimeError(f"worker process for rank {rank} sent {msg[0]!r} instead of 'ready'")

    def wait_idle(self, ranks, limit: float) -> bool:
        """Wait up to ``limit`` s for the given ranks to finish tearing down their last job."""
        deadline = time.monotonic() + limit
        while self.busy & set(ranks):
            waiting = {self.conns[r]: r for r in self.busy & set(ranks)}
            ready = _wait_conns(list(waiting), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                return False
            for c in ready:
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    return False
                if msg[0] == "idle":
                    self.busy.discard(waiting[c])  # anything else is a late message: dropped
        return True

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def close(self):
        for c in self.conns:
            try:
                c.send(("stop",))
            except Exception:
                pass
        for p in self.procs:
            p.join(timeout=0.5)
        self.kill()

    def kill(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=5)
        for c in self.conns:
            c.close()
        self.procs, self.conns = [], []


_POOL: _Pool | None = None


def shutdown():
    """End the kernel's worker processes (the next launch starts new ones)."""
    global _POOL
    if _POOL is not None:
        pool, _POOL = _POOL, None
        pool.close()


atexit.register(shutdown)


def live_worker_pids() -> list[int]:
    """PIDs of this kernel's worker processes that are still alive (for tests and curiosity)."""
    return [p.pid for p in (_POOL.procs if _POOL else []) if p.is_alive()]


def _get_pool(plan: RankPlan, threads: int, deadline: float) -> tuple[_Pool, bool]:
    global _POOL
    started = False
    if _POOL is not None and (_POOL.device_type != plan.device_type or _POOL.threads != threads or not _POOL.alive()):
        shutdown()
    if _POOL is None:
        _POOL = _Pool(plan.device_type, threads)
        started = True
    if len(_POOL.procs) < plan.world_size:
        started = True
        try:
            _POOL.grow(plan.world_size, deadline)
        except BaseException:
            shutdown()
            raise
    return _POOL, started


def launch(
    fn,
    *args,
    world_size: int | None = None,
    backend: str | None = None,
    timeout: float | None = None,
    record: bool = True,
    quiet: bool = False,
    threads: int = 1,
    **kwargs,
) -> Run:
    """Run ``fn(*args, **kwargs)`` on every rank of a fresh process group; return a :class:`Run`.

    ``timeout`` (seconds) bounds the whole job and every collective in it. By default it is
    :func:`default_timeout` of the world size: 30 s up to 4 ranks, growing with the number of
    ranks, since on a small CPU machine the rendezvous of 16 processes is itself slow. ``record`` switches
    the communication log on (every c10d call with its bytes). ``threads`` is the number of torch
    threads per CPU rank. ``quiet`` suppresses the one-line description of what ran (rank output
    is still printed).
    """
    import cloudpickle

    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    if timeout is None:
        timeout = default_timeout(world_size if world_size is not None else DEFAULT_CPU_WORLD)
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not (isinstance(threads, int) and threads >= 1):
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    plan = plan_ranks(world_size, backend)
    if not quiet:
        print(plan.describe())
    t_begin = time.monotonic()
    if _POOL is not None and not _POOL.wait_idle(range(min(plan.world_size, len(_POOL.procs))), _IDLE_WAIT):
        print(f"(worker processes still busy with the last job after {_IDLE_WAIT:g} s: starting fresh ones)", file=sys.stderr)
        shutdown()
    # starting processes gets its own allowance: the first launch imports torch in each worker
    pool, started = _get_pool(plan, threads, t_begin + 120.0)
    payload = cloudpickle.dumps((fn, args, kwargs))
    job_id = pool.next_job
    pool.next_job += 1
    opts = {"backend": plan.backend, "world_size": plan.world_size, "timeout": float(timeout), "record": record,
            "lazy_connect": lazy_connect(plan)}
    n = plan.world_size
    for c in pool.conns[:n]:
        c.send(("job", job_id, payload, opts))  # every receiver is idle, so this cannot block for long
    pool.busy.update(range(n))
    outputs = {r: [] for r in range(n)}
    try:
        done, errors = _collect(pool, n, job_id, time.monotonic() + timeout + _GRACE, outputs)
    except BaseException:  # KeyboardInterrupt in a notebook: leave nothing running
        shutdown()
        raise
    finally:
        _print_outputs(outputs)
    texts = {r: "".join(t for s, t in outputs[r] if s == "stdout") for r in outputs}
    if errors or len(done) < n:
        shutdown()  # peers may sit in a collective forever: end them all
        if errors:
            first = min(errors, key=lambda r: (_is_secondary(errors[r][0]), r))
            others = {r: e[0] for r, e in errors.items() if r != first}
            raise RankError(first, errors[first][0], errors[first][1], others)
        raise LaunchTimeout(sorted(set(range(n)) - set(done)), timeout, texts)
    results, comm, spans, times = [], [], [], []
    t0 = min(meta["t_start"] for _, meta in done.values())
    for r in range(n):
        data, meta = done[r]
        results.append(pickle.loads(data))
        comm.append(meta["ops"])
        spans.append(meta["spans"])
        times.append((meta["t_start"] - t0, meta["t_end"] - t0))
    return Run(plan, results, [texts[r] for r in range(n)], comm, spans, time.monotonic() - t_begin, started, times)


def _collect(pool: "_Pool", n: int, job_id: int, deadline: float, outputs: dict) -> tuple[dict, dict]:
    """Read the ranks' messages for one job until all are done, one fails, or the deadline.

    Returns ``done`` (rank -> (pickled result, meta)) and ``errors`` (rank -> (summary,
    traceback)); printed text is appended to ``outputs`` as it arrives. After the first error the
    peers get one more second to report their own, then collection stops.
    """
    conns = pool.conns[:n]
    done: dict[int, tuple] = {}
    errors: dict[int, tuple[str, str]] = {}
    first_error_at = None
    while len(done) + len(errors) < n:
        if first_error_at is not None and time.monotonic() > first_error_at + 1.0:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            break
        by_conn = {c: r for r, c in enumerate(conns) if r not in done and r not in errors}
        # short slices: a notebook interrupt is noticed at once, however it is delivered
        for c in _wait_conns(list(by_conn), timeout=min(left, 0.2 if errors else 0.5)):
            r = by_conn[c]
            try:
                msg = c.recv()
            except (EOFError, OSError):
                pool.procs[r].join(timeout=1.0)
                code = pool.procs[r].exitcode
                errors[r] = (f"the worker process died (exit code {code})", "(no Python traceback: the process ended)")
                first_error_at = first_error_at or time.monotonic()
                continue
            kind = msg[0]
            if msg[1] != job_id:
                continue  # a late message from an earlier job
            if kind == "idle":
                pool.busy.discard(r)
            elif kind == "out":
                outputs[r].append((msg[2], msg[3]))
            elif kind == "done":
                done[r] = (msg[2], msg[3])
            elif kind == "error":
                errors[r] = (msg[2], msg[3])
                first_error_at = first_error_at or time.monotonic()
    return done, errors


def _is_secondary(summary: str) -> bool:
    """Errors that are usually a consequence of another rank's failure, not the cause."""
    s = summary.lower()
    return any(k in s for k in ("connection closed", "connection reset", "broken pipe", "timed out"))


def _print_outputs(outputs: dict[int, list[tuple[str, str]]]):
    for r in sorted(outputs):
        for stream in ("stdout", "stderr"):
            text = "".join(t for s, t in outputs[r] if s == stream)
            if not text:
                continue
            target = sys.stdout if stream == "stdout" else sys.stderr
            lines = text.rstrip("\n").split("\n")
            target.write("".join(f"[rank {r}] {line}\n" for line in lines))
    sys.stdout.flush()
