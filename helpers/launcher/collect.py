"""Read one job back from its ranks: the launcher's end of the pipe to each worker.

Serves :mod:`helpers.launcher` (every notebook that runs ``torch.distributed``, P.5 onwards; the
timeout diagnosis is shown in P.14). :mod:`helpers.launcher.worker` is the other end: per job a rank sends
``Output`` (what it prints, as it prints it), then ``Done`` (its pickled result and what it
recorded) or ``Failed`` (summary, traceback and the stage it failed in), then ``Idle`` once its
process group is torn down; its lifeline thread answers ``StatusQuery`` with ``Status`` (where it
is) at any time. The messages are defined in :mod:`helpers.launcher.protocol`.

What it guarantees:

* **Bounded**: :func:`collect` stops at the job's deadline (then asks the stuck ranks where they
  are, for at most ``_STATUS_WAIT`` s) or one second after the first error (time for the peers to
  report their own).
* **Interruptible**: it waits in slices of at most half a second, so a notebook interrupt is
  noticed at once however it is delivered.
* **A dead worker is an error**: a rank whose pipe closes is reported with its exit code.
* **Output in rank order**: :func:`print_outputs` prints each rank's text as ``[rank r] ...``.
"""
from __future__ import annotations

import sys
import time
from multiprocessing.connection import wait as _wait_conns
from typing import TYPE_CHECKING

from .protocol import Done, Failed, Idle, Output, Status, StatusQuery

if TYPE_CHECKING:
    from .pool import Pool

_STATUS_WAIT = 0.5  # seconds the diagnosis waits for the stuck ranks to say where they are


def collect(pool: Pool, n: int, job_id: int, deadline: float, outputs: dict) -> tuple[dict, dict, dict]:
    """Read the ranks' messages for one job until all are done, one fails, or the deadline.

    Returns ``done`` (rank -> its :class:`~helpers.launcher.protocol.Done`), ``errors`` (rank -> its
    :class:`~helpers.launcher.protocol.Failed`) and, when the deadline passed, ``states`` (rank -> where
    that rank was, for :func:`helpers.launcher.hang.diagnose`); printed text is appended to ``outputs`` as
    it arrives. After the first error the peers get one more second to report their own, then
    collection stops.
    """
    conns = pool.conns[:n]
    done: dict[int, Done] = {}
    errors: dict[int, Failed] = {}
    first_error_at = None
    while len(done) + len(errors) < n:
        now = time.monotonic()
        if first_error_at is not None and now > first_error_at + 1.0:
            break
        if now >= deadline:  # time is up: ask the stuck ranks where they are, briefly
            return done, errors, ask_status(pool, [r for r in range(n) if r not in done and r not in errors],
                                            job_id, outputs)
        by_conn = {c: r for r, c in enumerate(conns) if r not in done and r not in errors}
        # short slices: a notebook interrupt is noticed at once, however it is delivered
        for c in _wait_conns(list(by_conn), timeout=max(0.0, min(deadline - now, 0.2 if errors else 0.5))):
            r = by_conn[c]
            try:
                msg = c.recv()
            except (EOFError, OSError):
                errors[r] = Failed(job_id, f"the worker process died (exit code {pool.exit_code(r, wait=1.0)})",
                                   "(no Python traceback: the process ended)", "run")
                first_error_at = first_error_at or time.monotonic()
                continue
            if msg.job_id != job_id:
                continue  # a late message from an earlier job
            match msg:
                case Idle():
                    pool.mark_idle(r)
                case Output(stream=stream, text=text):
                    outputs[r].append((stream, text))
                case Done():
                    done[r] = msg
                case Failed():
                    errors[r] = msg
                    first_error_at = first_error_at or time.monotonic()
    return done, errors, {}


def ask_status(pool: Pool, ranks, job_id: int, outputs: dict) -> dict[int, dict]:
    """Ask ``ranks`` where they are (their lifeline threads answer); wait at most ``_STATUS_WAIT``."""
    asked = {}
    for r in ranks:
        try:
            pool.send(r, StatusQuery(job_id))
            asked[pool.conns[r]] = r
        except OSError:
            pass
    states: dict[int, dict] = {}
    until = time.monotonic() + _STATUS_WAIT
    while len(states) < len(asked) and time.monotonic() < until:
        waiting = [c for c, r in asked.items() if r not in states]
        for c in _wait_conns(waiting, timeout=max(0.0, until - time.monotonic())):
            try:
                msg = c.recv()
            except (EOFError, OSError):
                states[asked[c]] = {"phase": "died"}
                continue
            if msg.job_id != job_id:
                continue
            match msg:
                case Status(state=state):
                    states[asked[c]] = state
                case Output(stream=stream, text=text):
                    outputs[asked[c]].append((stream, text))
    return states


def print_outputs(outputs: dict[int, list[tuple[str, str]]]):
    for r in sorted(outputs):
        for stream in ("stdout", "stderr"):
            text = "".join(t for s, t in outputs[r] if s == stream)
            if not text:
                continue
            target = sys.stdout if stream == "stdout" else sys.stderr
            lines = text.rstrip("\n").split("\n")
            target.write("".join(f"[rank {r}] {line}\n" for line in lines))
    sys.stdout.flush()
