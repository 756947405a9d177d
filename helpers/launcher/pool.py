"""The kernel's worker processes: started once, kept between launches, ended whole.

Serves :mod:`helpers.launcher` (every notebook that runs ``torch.distributed``, P.5 onwards; the
fault handling is shown in P.14). The launcher asks :func:`get_pool` for ranks and calls
:func:`discard_pool` after any failure; :mod:`helpers.launcher.worker` is the processes' own side.

What it guarantees (the launcher's docstring lists them all):

* **Cheap repeats**: the workers are forked from multiprocessing's forkserver, which imports torch
  once, and are kept for the next launch; a pool of the wrong device type or thread count, with a
  dead worker, or still busy with the last job after ``_IDLE_WAIT`` seconds is replaced.
* **Interrupts**: :class:`Interrupts` lets the first SIGINT raise ``KeyboardInterrupt`` at once and
  holds every later one until the workers are all ended; the forkserver starts ignoring SIGINT, so
  an interrupt while it imports torch cannot break the next launch.
* **No orphans**: :meth:`Pool.kill` closes the pipes (a worker ends itself when its pipe closes),
  SIGKILLs and reaps the workers; :func:`shutdown` does it at exit.
* **Loopback only**: the rendezvous store listens on 127.0.0.1 only.
* **No litter**: everything the launcher and the forkserver write lives in :func:`kernel_dir`,
  ``$TMPDIR/helpers-launcher-<pid>-<start>``, removed when the kernel exits; a folder whose kernel
  was killed is removed when the next pool starts anywhere on the machine.
"""
from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from multiprocessing.connection import wait as _wait_conns

from ..torch_private import DYNAMO_MODULE
from .procfs import process_ended, start_ticks
from .protocol import Idle, Job, Ready

_IDLE_WAIT = 10.0  # seconds a launch waits for the workers to finish tearing down the last job
_DIR_PREFIX = "helpers-launcher-"


# ---- the kernel's private folder -----------------------------------------------------------------

_KERNEL_DIR: str | None = None


def _sweep_stale_dirs():
    """Remove launcher folders of this user whose kernel is gone (killed before it could clean up)."""
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        if not name.startswith(_DIR_PREFIX):
            continue
        pid, _, start = name[len(_DIR_PREFIX):].partition("-")
        path = os.path.join(tmp, name)
        try:
            if not pid.isdigit() or os.stat(path).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if start_ticks(int(pid)) not in (start, "0"):
            shutil.rmtree(path, ignore_errors=True)


def kernel_dir() -> str:
    """This kernel's private launcher folder (created on first use, removed at exit).

    It holds multiprocessing's files too (the forkserver's socket): the folder multiprocessing
    would otherwise create, ``pymp-*``, is left behind when a kernel is killed.
    """
    global _KERNEL_DIR
    if _KERNEL_DIR is None or not os.path.isdir(_KERNEL_DIR):
        from multiprocessing import util

        path = os.path.join(tempfile.gettempdir(), f"{_DIR_PREFIX}{os.getpid()}-{start_ticks(os.getpid()) or 0}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        if _KERNEL_DIR is None:  # removed after multiprocessing's own exit work, as it removes pymp-*
            util.Finalize(None, shutil.rmtree, args=(path, True), exitpriority=-100)
        _KERNEL_DIR = path
        config = mp.process.current_process()._config
        if config.get("tempdir") is None:
            config["tempdir"] = path
    return _KERNEL_DIR


# ---- interrupts ----------------------------------------------------------------------------------

class Interrupts:
    """SIGINT during a launch: the first one raises KeyboardInterrupt at once, as usual; any later
    one, and any that comes while workers are being ended, is held until they are all gone, so a
    reader pressing stop twice cannot interrupt the clean-up. Main thread only (where signals go)."""

    def __init__(self):
        self.prev, self.raised, self.holding, self.pending = None, False, 0, False

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            prev = signal.getsignal(signal.SIGINT)
            if callable(prev):
                self.prev = prev
                signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        if self.raised or self.holding:
            self.pending = True
            return
        try:
            self.prev(signum, frame)
        except BaseException:
            self.raised = True
            raise

    @contextmanager
    def held(self):
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1

    def __exit__(self, exc_type, *rest):
        if self.prev is not None:
            signal.signal(signal.SIGINT, self.prev)
            if self.pending and exc_type is None and not self.raised:
                self.prev(signal.SIGINT, None)  # an interrupt held back: deliver it now
        return False


def _start_forkserver():
    """Start multiprocessing's forkserver ignoring SIGINT from its first instruction.

    A notebook interrupt goes to the kernel's whole process group; a forkserver still importing
    torch would die of it mid-import and take the next launch down with it (EOFError). An ignored
    signal stays ignored across exec (a blocked mask does not survive Python's start-up), so SIGINT
    is ignored here for the few milliseconds of the spawn: an interrupt in that window is lost,
    never half-handled. Off the main thread signals cannot be touched, and none arrive there.
    """
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, old)


# ---- the worker pool -----------------------------------------------------------------------------

class Pool:
    """The kernel's worker processes, kept between launches."""

    def __init__(self, device_type: str, threads: int):
        import torch.distributed as dist

        self.device_type, self.threads = device_type, threads
        self.procs: list = []
        self.conns: list = []
        self.child_ends: list = []
        self.busy: set[int] = set()  # ranks that have not yet reported Idle after their last job
        self.next_job = 0  # the id start_job gives the next job
        _sweep_stale_dirs()  # folders of kernels killed since this one started
        self.folder = kernel_dir()
        # the store listens on a socket bound to 127.0.0.1 only (given a port, TCPStore binds every
        # interface); it takes the descriptor over
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
            self.store = dist.TCPStore("127.0.0.1", sock.getsockname()[1], is_master=True, wait_for_workers=False,
                                       master_listen_fd=sock.fileno())
        except BaseException:
            sock.close()
            raise
        sock.detach()
        ctx = mp.get_context("forkserver")
        # torch._dynamo too: the communication recorder is a TorchDispatchMode, and the first op
        # under a mode imports torch._dynamo (torch._compile._disable_dynamo), 3-4 s of CPU. Paid
        # once here, not by every rank of every fresh pool (measured: a 1 s monitored barrier
        # took 4.5 s to fail on fresh workers, over 10 s on a loaded two-core machine).
        ctx.set_forkserver_preload(["torch", "torch.distributed", DYNAMO_MODULE, "cloudpickle", "helpers.launcher.worker"])
        _start_forkserver()
        _hook_kernel_shutdown()
        self.ctx = ctx

    def grow(self, n: int, deadline: float):
        from . import worker

        new = []
        for rank in range(len(self.procs), n):
            parent, child = self.ctx.Pipe(duplex=True)
            # registered before start: whatever interrupts us, teardown closes the parent's end,
            # and a worker whose pipe closes ends itself
            self.conns.append(parent)
            self.child_ends.append(child)
            p = self.ctx.Process(
                target=worker.main,
                args=(child, rank, self.device_type, os.getpid(), self.store.port, self.threads),
                daemon=True,
                name=f"helpers-rank-{rank}",
            )
            self.procs.append(p)
            p.start()
            child.close()
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
            if not isinstance(msg, Ready):  # pragma: no cover - protocol error
                raise RuntimeError(f"worker process for rank {rank} sent {msg!r} instead of Ready")

    def start_job(self, job: Job):
        """Hand ``job`` to ranks ``0..job.world_size-1`` (each idle) and mark them busy."""
        for c in self.conns[:job.world_size]:
            c.send(job)  # every receiver is idle, so this cannot block for long
        self.busy.update(range(job.world_size))

    def new_job_id(self) -> int:
        """A job id not used before by this pool (the ranks' store prefix is ``job<id>/``)."""
        job_id, self.next_job = self.next_job, self.next_job + 1
        return job_id

    def mark_idle(self, rank: int):
        """Rank ``rank`` said Idle: its process group is torn down, it may take the next job."""
        self.busy.discard(rank)

    def send(self, rank: int, msg):
        """Send one message to rank ``rank``'s worker (OSError when its pipe is closed)."""
        self.conns[rank].send(msg)

    def exit_code(self, rank: int, wait: float) -> int | None:
        """Rank ``rank``'s exit code, after waiting up to ``wait`` s for it to end (None: still running)."""
        self.procs[rank].join(timeout=wait)
        return self.procs[rank].exitcode

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
                if isinstance(msg, Idle):
                    self.mark_idle(waiting[c])  # anything else is a late message: dropped
        return True

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def kill(self):
        """End every worker now: close their pipes (they exit on EOF), SIGKILL them, reap them."""
        for c in self.conns + self.child_ends:
            try:
                c.close()
            except Exception:
                pass
        started = [p for p in self.procs if p.pid is not None]
        for p in started:
            try:
                p.kill()
            except Exception:  # already gone
                pass
        # dead as soon as the kernel has ended them (a zombie): not waiting for the forkserver to
        # reap each one and report it, which on a loaded machine takes its turn on a core too
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not all(process_ended(p.pid) for p in started):
            time.sleep(0.002)
        for p in started:
            p.join(timeout=0 if process_ended(p.pid) else max(0.0, deadline - time.monotonic()))
        self.procs, self.conns, self.child_ends, self.store = [], [], [], None


# ---- the kernel's pool ---------------------------------------------------------------------------

_POOL: Pool | None = None


def discard_pool():
    """End the kernel's worker processes now (not interrupt-safe by itself: see :func:`shutdown`)."""
    global _POOL
    if _POOL is not None:
        _POOL.kill()
        _POOL = None


def shutdown():
    """End the kernel's worker processes (the next launch starts new ones). Interrupt-safe."""
    with Interrupts() as guard, guard.held():
        discard_pool()


def _stop_multiprocessing_servers():
    """Stop multiprocessing's forkserver and resource tracker and reap them (Python 3.11-3.13's
    private ``_stop``; absent elsewhere, then nothing is done)."""
    from multiprocessing import forkserver, resource_tracker

    for server in (getattr(forkserver, "_forkserver", None), getattr(resource_tracker, "_resource_tracker", None)):
        try:
            server._stop()
        except Exception:  # not started, already stopped, or another Python's internals
            pass


def _at_kernel_shutdown():
    """End everything the launcher started and remove the kernel's folder."""
    shutdown()
    _stop_multiprocessing_servers()
    if _KERNEL_DIR is not None:
        shutil.rmtree(_KERNEL_DIR, ignore_errors=True)


def _hook_kernel_shutdown():
    """In a Jupyter kernel, run :func:`_at_kernel_shutdown` when the kernel is asked to shut down.

    ipykernel then signals every child process of its group and waits until none is left, before
    its exit handlers run: the resource tracker ignores SIGTERM and the forkserver, once ended, stays
    an unreaped zombie, so the kernel waited out its 14 s of retries, was killed by the server
    first, and the launcher folder outlived it. Ending them first lets the kernel exit at once.
    """
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
    except Exception:
        return
    if kernel is None or getattr(kernel, "_helpers_shutdown_hooked", False):
        return
    original = kernel.do_shutdown

    def do_shutdown(restart, *args, **kwargs):
        try:
            _at_kernel_shutdown()
        except Exception:
            pass
        return original(restart, *args, **kwargs)

    kernel.do_shutdown = do_shutdown
    kernel._helpers_shutdown_hooked = True


atexit.register(shutdown)


def live_worker_pids() -> list[int]:
    """PIDs of this kernel's worker processes that are still alive (for tests and curiosity)."""
    return [p.pid for p in (_POOL.procs if _POOL else []) if p.is_alive()]


def get_pool(device_type: str, world_size: int, threads: int, deadline: float, guard: Interrupts) -> tuple[Pool, bool]:
    """The kernel's pool, idle and holding at least ``world_size`` workers; True when processes were started.

    Workers still busy with the last job after ``_IDLE_WAIT`` s are replaced, as is a pool of another
    device type or thread count or with a dead worker. New workers must be ready by ``deadline``.
    """
    global _POOL
    if _POOL is not None and not _POOL.wait_idle(range(min(world_size, len(_POOL.procs))), _IDLE_WAIT):
        print(f"(worker processes still busy with the last job after {_IDLE_WAIT:g} s: starting fresh ones)", file=sys.stderr)
        with guard.held():
            discard_pool()
    started = False
    if _POOL is not None and (_POOL.device_type != device_type or _POOL.threads != threads or not _POOL.alive()):
        with guard.held():
            discard_pool()
    if _POOL is None:
        _POOL = Pool(device_type, threads)
        started = True
    if len(_POOL.procs) < world_size:
        started = True
        _POOL.grow(world_size, deadline)
    return _POOL, started
