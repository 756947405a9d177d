"""Run a worker function on N ranks from a notebook and get every rank's return value back.

Serves every notebook that runs ``torch.distributed`` (P.5 onwards; first used in P.6 and P.7).

    run = launch(fn, *args, world_size=4)      # prints: backend=gloo device=cpu world_size=4 ...
    run.results[r]                             # what fn returned on rank r
    run.comm[r], run.spans[r]                  # what rank r communicated, its named time spans

What it guarantees (the README gives the measured figures):

* **Backend from the hardware**: NCCL with one rank per GPU where GPUs are found (and gloo in the
  same group for CPU tensors), gloo on CPU processes otherwise (4 ranks by default). Asking for
  more ranks than GPUs runs CPU ranks and says so. One line says what ran.
* **Notebook functions work**: ``fn`` is pickled by value (cloudpickle), so a function defined in
  a notebook cell can be edited and re-run. A function or argument that fails to unpickle on the
  ranks raises :class:`RankError` with the real exception, and the workers stay.
* **Output**: what each rank prints comes back and is printed as ``[rank r] ...`` in rank order.
* **Cheap repeats**: worker processes are started once per kernel (with torch imported once in a
  forkserver) and reused; each job gets a fresh process group.
* **Bounded failure**: a rank that raises makes :func:`launch` raise :class:`RankError` with the
  rank and its traceback; a job that has not finished after ``timeout`` seconds raises
  :class:`LaunchTimeout` within a second more, naming where each rank was (the collective it
  waits in, or the rank that never entered it; :mod:`helpers.launcher.hang`). Either way every worker
  process is ended before the call returns, and the next launch starts fresh ones.
* **Interrupts**: a kernel interrupt raises ``KeyboardInterrupt`` at once and ends every worker;
  more interrupts while that happens are absorbed, so none leaves a worker behind.
* **No orphans**: a worker ends by itself as soon as its kernel is gone (the pipe to it closes),
  even while the dead kernel is an unreaped zombie.
* **Loopback only**: the rendezvous store listens on 127.0.0.1 only, and gloo's sockets are
  bound to the loopback interface.
* **No litter**: everything the launcher and multiprocessing's forkserver write lives in one
  private folder per kernel, ``$TMPDIR/helpers-launcher-<pid>-<start>``, removed when the kernel
  exits; a folder whose kernel was killed is removed by the next launch on the machine.
* **Traces**: ``launch(..., profile=True)`` records ``torch.profiler`` on every rank and merges
  the ranks into one Chrome/Perfetto trace, ``run.trace_path`` (:mod:`helpers.launcher.traces`).

Where it lives: this module is the public face (the plan, the errors, :func:`launch`);
:mod:`helpers.launcher.pool` keeps the kernel's worker processes (start, reuse, interrupts, teardown, the
private folder); :mod:`helpers.launcher.collect` reads a job back from the ranks; :mod:`helpers.launcher.worker` is
the rank side; :mod:`helpers.launcher.protocol` defines the messages between them; :mod:`helpers.launcher.hang`
diagnoses a timeout; :mod:`helpers.launcher.traces` merges traces.
"""
from __future__ import annotations

import numbers
import os
import pickle
import sys
import time
from dataclasses import dataclass, field

from ..validate import integer_at_least, positive_number
from . import pool as kernel_pool
from .collect import ask_status, collect, print_outputs
from .commlog import CommOp, Span, summarize
from .hang import diagnose
from .pool import Interrupts
from .pool import kernel_dir as kernel_dir  # public here too: notebooks import them from launcher
from .pool import live_worker_pids as live_worker_pids
from .pool import shutdown as shutdown
from .protocol import Job
from .traces import merge_rank_traces

BACKENDS = ("gloo", "nccl")
DEFAULT_CPU_WORLD = 4
MAX_CPU_RANKS = 16  # each CPU rank is a process holding its own torch (~300 MB)
DEFAULT_TIMEOUT = 30.0  # seconds for up to 4 ranks; these demos take well under that
MAX_TIMEOUT = 7 * 86400.0  # a week: beyond it a timeout is a typo (and inf overflows the collectives)
_GRACE = 1.0  # LaunchTimeout comes at most this long after ``timeout``: asking the ranks, ending them
_COLLECTIVE_MARGIN = 5.0  # collectives time out this much later than the job: the launcher speaks first


class RankError(RuntimeError):
    """A rank raised inside the worker function. ``.rank`` and ``.remote_traceback`` say which/why.

    ``.workers_kept`` is True when the failure came before any rank started the job (the function
    or an argument failed to unpickle on every rank): then the workers stay for the next launch.
    """

    workers_kept = False

    def __init__(self, rank: int, summary: str, remote_traceback: str, others: dict | None = None):
        self.rank, self.summary, self.remote_traceback = rank, summary, remote_traceback
        self.others = others or {}
        more = "".join(f"\n(rank {r} also failed: {s})" for r, s in sorted(self.others.items()))
        super().__init__(f"rank {rank} raised {summary}\n\n--- traceback on rank {rank} ---\n{remote_traceback}{more}")


class LaunchTimeout(TimeoutError):
    """Some ranks neither finished nor failed within the timeout.

    ``.ranks`` lists them; ``.blamed`` the ranks the diagnosis points at (those that never
    entered the call the others wait in); ``.diagnosis`` (a :class:`helpers.launcher.hang.Diagnosis`)
    says where each rank was: its headline is the first line of the message.
    """

    def __init__(self, ranks: list[int], timeout: float, outputs: dict[int, str], diagnosis=None):
        self.ranks, self.timeout, self.diagnosis = ranks, timeout, diagnosis
        self.blamed = list(diagnosis.blamed) if diagnosis is not None else list(ranks)
        head = diagnosis.headline if diagnosis is not None else f"ranks {ranks} did not finish"
        detail = "".join(f"\n  {line}" for line in diagnosis.lines) if diagnosis is not None else ""
        tail = "".join(
            f"\n  rank {r} last printed: {outputs.get(r, '').strip().splitlines()[-1]!r}"
            for r in ranks
            if outputs.get(r, "").strip()
        )
        super().__init__(
            f"{head}\n(ranks {ranks} neither finished nor failed within {timeout:g} s; "
            f"all worker processes were ended){detail}{tail}"
        )


@dataclass(frozen=True)
class RankPlan:
    """Where the ranks of a job run: the backend, the device type and how many ranks."""

    backend: str
    device_type: str
    world_size: int
    note: str = ""

    def describe(self) -> str:
        per_rank = "one GPU per rank (cuda:<rank>), CPU tensors through gloo" if self.device_type == "cuda" else "CPU processes"
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
    """The default job timeout: 30 s up to 4 ranks, then 30 s x world_size / 4."""
    return DEFAULT_TIMEOUT * max(1.0, integer_at_least(world_size, "world_size") / 4)


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
    trace_path: str | None = None  # profile=True: the merged Chrome/Perfetto trace of all ranks

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



def job_plan(world_size: int | None = None, backend: str | None = None, timeout: float | None = None,
             gpus: int | None = None) -> tuple[RankPlan, float]:
    """The job's :class:`RankPlan` and its timeout, whose default follows the world size the plan
    resolves (``world_size=None`` on 8 GPUs: 8 ranks, 60 s), not the one asked for."""
    plan = plan_ranks(world_size, backend, gpus)
    return plan, float(default_timeout(plan.world_size) if timeout is None else timeout)


def _check_arguments(fn, world_size, timeout, threads, record, quiet, profile):
    """Every argument checked before anything starts: ValueError/TypeError naming it."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    if world_size is not None:
        integer_at_least(world_size, "world_size")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
        positive_number(timeout, "timeout")
        if timeout > MAX_TIMEOUT:
            raise ValueError(f"timeout must be at most {MAX_TIMEOUT:g} s (a week), got {timeout!r}")
    integer_at_least(threads, "threads")
    for name, value in (("record", record), ("quiet", quiet)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    if not isinstance(profile, (bool, str, os.PathLike)):
        raise TypeError(f"profile must be True, False or a folder path, got {profile!r}")


def launch(
    fn,
    *args,
    world_size: int | None = None,
    backend: str | None = None,
    timeout: float | None = None,
    record: bool = True,
    quiet: bool = False,
    threads: int = 1,
    profile: bool | str | os.PathLike = False,
    **kwargs,
) -> Run:
    """Run ``fn(*args, **kwargs)`` on every rank of a fresh process group; return a :class:`Run`.

    ``timeout`` (seconds) bounds the job: after it, :class:`LaunchTimeout` says where each rank
    was. By default it is :func:`default_timeout` of the world size the plan resolves: 30 s up to
    4 ranks, growing with the number of ranks, since on a small CPU machine the rendezvous of 16
    processes is itself slow. ``record`` switches the communication log on (every c10d call with
    its bytes). ``threads`` is the number of torch threads per CPU rank. ``quiet`` suppresses the
    one-line description of what ran (rank output is still printed). ``profile=True`` records a
    ``torch.profiler`` trace on every rank and merges them into ``run.trace_path`` (in the
    kernel's launcher folder, kept until the kernel exits); ``profile="some/folder"`` writes it
    there instead.
    """
    import cloudpickle

    _check_arguments(fn, world_size, timeout, threads, record, quiet, profile)
    plan, timeout = job_plan(world_size, backend, timeout)
    if not quiet:
        print(plan.describe())
    with Interrupts() as guard:
        try:
            return _launch(cloudpickle.dumps((fn, args, kwargs)), plan, timeout, record, threads, profile, guard)
        except BaseException as exc:
            if not getattr(exc, "workers_kept", False):
                with guard.held():  # any failure, an interrupt too: leave nothing running
                    kernel_pool.discard_pool()
            raise


def _launch(payload: bytes, plan: RankPlan, timeout: float, record: bool, threads: int, profile, guard,
            attempt: int = 0) -> Run:
    t_begin = time.monotonic()
    # starting processes gets its own allowance: the first launch imports torch in each worker
    pool, started = kernel_pool.get_pool(plan.device_type, plan.world_size, threads, t_begin + 120.0, guard)
    job_id = pool.new_job_id()
    trace_dir = None
    if profile is not False:
        trace_dir = os.path.join(pool.folder, f"trace-job{job_id}") if profile is True else os.fspath(profile)
        os.makedirs(trace_dir, exist_ok=True)
    pool.start_job(Job(job_id, payload, plan.backend, plan.world_size, record,
                       collective_timeout=timeout + _COLLECTIVE_MARGIN, lazy_connect=lazy_connect(plan),
                       profile_dir=trace_dir))
    n = plan.world_size
    outputs = {r: [] for r in range(n)}
    try:
        done, errors, states = collect(pool, n, job_id, time.monotonic() + timeout, outputs)
    finally:
        print_outputs(outputs)
    texts = {r: "".join(t for s, t in outputs[r] if s == "stdout") for r in outputs}
    if errors and len(errors) == n and all(e.stage == "unpickle" for e in errors.values()):
        # nothing started on any rank: the workers are idle again and stay
        others = {r: e.summary for r, e in errors.items() if r != 0}
        err = RankError(0, errors[0].summary, errors[0].traceback, others)
        err.workers_kept = True
        raise err
    if errors and not done and attempt == 0 and all(e.stage == "init" for e in errors.values()):
        # gloo failed to connect the ranks before any of them ran the function (seen on a loaded
        # machine with fresh workers: "connectFullMesh ... Connection closed by peer"); when every
        # other rank is still starting its process group, nothing ran: try once more, fresh
        others = [r for r in range(n) if r not in errors]
        states = ask_status(pool, others, job_id, outputs)
        if all(states.get(r, {}).get("phase") == "starting the process group" for r in others):
            first = min(errors)
            print(f"(rank {first} could not connect to its peers ({errors[first].summary.splitlines()[0][:120]}); "
                  "starting fresh workers and running the job again)", file=sys.stderr)
            with guard.held():
                kernel_pool.discard_pool()
            return _launch(payload, plan, timeout, record, threads, profile, guard, attempt=1)
    if errors:
        first = min(errors, key=lambda r: (_is_secondary(errors[r].summary), r))
        others = {r: e.summary for r, e in errors.items() if r != first}
        raise RankError(first, errors[first].summary, errors[first].traceback, others)
    if len(done) < n:

        stuck = sorted(set(range(n)) - set(done))
        raise LaunchTimeout(stuck, timeout, texts, diagnose(states, stuck, finished=done))
    results, comm, spans, times = [], [], [], []
    t0 = min(d.t_start for d in done.values())
    for r in range(n):
        results.append(pickle.loads(done[r].result))
        comm.append(done[r].ops)
        spans.append(done[r].spans)
        times.append((done[r].t_start - t0, done[r].t_end - t0))
    trace_path = None
    if trace_dir is not None:

        trace_path = os.path.join(trace_dir, "trace.json")
        merge_rank_traces({r: done[r].trace for r in range(n)}, trace_path)
    return Run(plan, results, [texts[r] for r in range(n)], comm, spans, time.monotonic() - t_begin, started, times,
               trace_path)


def _is_secondary(summary: str) -> bool:
    """Errors that are usually a consequence of another rank's failure, not the cause."""
    s = summary.lower()
    return any(k in s for k in ("connection closed", "connection reset", "broken pipe", "timed out"))

