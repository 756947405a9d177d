"""The messages between the kernel and its worker processes: one frozen dataclass per kind.

Serves :mod:`helpers.launcher`, :mod:`helpers.launcher.pool` and :mod:`helpers.launcher.collect` (the kernel's end of
each worker's pipe) and :mod:`helpers.launcher.worker` (the rank's end). Each message crosses the pipe by
pickle, so it is defined here, in a module both sides import (plain Python, no torch), and matched
by type on arrival. A job's life, seen from the pipe of one rank::

    kernel -> rank   Job                  (helpers.launcher, through Pool.start_job)
    rank -> kernel   Output ...           (whenever the job prints)
    rank -> kernel   Done | Failed        (the job ended)
    rank -> kernel   Idle                 (process group torn down: ready for the next Job)

Beside it, at any time: ``StatusQuery`` from the kernel, answered with ``Status`` by the rank's
lifeline thread; and once per worker, at start-up, ``Ready``. Every message from a rank but
``Ready`` names its job, so the kernel can drop a late message from an earlier one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# ---- kernel -> rank ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """Run one job. Sent by the launcher to ranks ``0..world_size-1``, each idle, at every launch.

    The rank unpickles ``payload`` (``(fn, args, kwargs)``, by cloudpickle), joins a fresh process
    group on the store prefix ``job<job_id>/``, runs the function, and answers ``Done`` or
    ``Failed``, then ``Idle``. The job's own timeout is the kernel's business (it stops waiting and
    ends the workers); the rank only bounds its collectives, by ``collective_timeout`` seconds,
    which the launcher sets a few seconds later so that it speaks first.
    """

    job_id: int
    payload: bytes
    backend: str  # "gloo" or "nccl", as the launcher planned it
    world_size: int
    record: bool  # record every c10d call in the communication log
    collective_timeout: float  # seconds, the process group's timeout
    lazy_connect: bool  # gloo connects each pair on first use (see launcher.lazy_connect)
    profile_dir: str | None  # where each rank writes its profiler trace, None: no profiling


@dataclass(frozen=True)
class StatusQuery:
    """Where are you? Sent by the kernel to the ranks a job waits for, after its deadline or a
    failed start. The rank's lifeline thread answers ``Status`` at once, even while the main
    thread is blocked in a collective."""

    job_id: int


# ---- rank -> kernel ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """A worker process has started and connected to the store. Sent once, before any job; the
    pool waits for it from every new worker before it hands out a job."""

    pid: int


@dataclass(frozen=True)
class Output:
    """Text the job printed, sent as it is written. The kernel prints it as ``[rank r] ...``."""

    job_id: int
    stream: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True)
class Done:
    """The job returned on this rank: its pickled result and what the rank recorded.

    The launcher unpickles ``result`` into ``Run.results`` and keeps the rest (``Run.comm``,
    ``Run.spans``, ``Run.rank_times``, the merged trace).
    """

    job_id: int
    result: bytes  # the return value, tensors moved to the CPU, pickled
    ops: list  # the communication log: one helpers.launcher.commlog.CommOp per call
    spans: list  # the named time spans (helpers.launcher.commlog.Span)
    t_start: float  # time.perf_counter() when the function started and ended on this rank
    t_end: float
    trace: tuple | None  # (path, wall_us) of this rank's profiler trace, None when not profiled


@dataclass(frozen=True)
class Failed:
    """The job raised on this rank, or never started. The launcher raises :class:`RankError`.

    ``stage`` says when: ``"unpickle"`` (the function or an argument did not unpickle: nothing
    started, the worker stays reusable), ``"init"`` (joining the process group failed), ``"run"``
    (the function raised; the kernel also writes this one for a worker that died). After
    ``"init"`` or ``"run"`` the worker ends: a failed job may leave a collective half done.
    """

    job_id: int
    summary: str  # "ExceptionType: message"
    traceback: str
    stage: Literal["unpickle", "init", "run"]


@dataclass(frozen=True)
class Idle:
    """This rank has torn its process group down and waits for the next ``Job``. The pool marks
    it idle; a launch waits for it (a rank still busy after a while is replaced)."""

    job_id: int


@dataclass(frozen=True)
class Status:
    """The answer to ``StatusQuery``: where this rank is (``phase``, ``dist_call``, ``where``, the
    communication log's last call and counts...; :mod:`helpers.launcher.hang` reads it)."""

    job_id: int
    state: dict
