"""The rank side of the launcher: a long-lived worker process that runs one job after another.

Serves every notebook that runs ``torch.distributed`` (P.5 onwards). The parent
(:mod:`helpers.launcher`, through :mod:`helpers.launcher.pool`) starts these processes once per kernel and
keeps them; :mod:`helpers.launcher.collect` reads their messages (:mod:`helpers.launcher.protocol` defines them:
a ``Job`` comes in; ``Output``, then ``Done`` or ``Failed``, then ``Idle`` go out). Each job gets
a fresh process group on a fresh store prefix, so a repeated launch costs an
``init_process_group`` and not a fresh ``import torch``.

Functions defined in a notebook live in ``__main__`` of the kernel, which a child cannot import.
The parent pickles them by value with cloudpickle and this module unpickles them: that is the
trampoline. Functions from importable modules are pickled by reference as usual.

Beside the job, a small thread per worker (:func:`_listen`) is its lifeline: it ends the process
as soon as the parent's end of the pipe closes (the kernel died, even if it is an unreaped
zombie, or the launcher dropped the worker), and it answers the launcher's ``StatusQuery``
while the main thread is blocked in a collective: the phase, the ``torch.distributed`` call and
the line the main thread is at, and the communication log's last call and counts
(:mod:`helpers.launcher.hang` turns the answers into a diagnosis). Every socket gloo opens binds the
loopback interface.

Inside a job, worker code can ask for:

* :func:`device` -- the torch device of this rank (``cuda:<local rank>`` or ``cpu``);
* :func:`helpers.launcher.commlog.span` -- named time spans;
* the usual ``torch.distributed`` calls; the process group is already initialised.
"""
from __future__ import annotations

import contextlib
import functools
import io
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

from .commlog import CommLog, active_log
from .procfs import process_ended
from .protocol import Done, Failed, Idle, Job, Output, Ready, Status, StatusQuery

_DEVICE_TYPE = "cpu"
_LOCAL_RANK = 0


def device():
    """The torch device this rank computes on: ``cuda:<local rank>`` under NCCL, else ``cpu``.

    Works inside a job started by the launcher and under torchrun (reads LOCAL_RANK).
    """
    import torch

    return torch.device("cuda", _LOCAL_RANK) if _DEVICE_TYPE == "cuda" else torch.device("cpu")


def set_device(device_type: str, local_rank: int):
    """Record where this process computes (the launcher's workers and the torchrun entry call it)."""
    global _DEVICE_TYPE, _LOCAL_RANK
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    _DEVICE_TYPE, _LOCAL_RANK = device_type, local_rank


def to_cpu(obj):
    """Move every tensor in a nested result to the CPU and detach it, so it pickles plainly."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        seq = [to_cpu(v) for v in obj]
        return type(obj)(seq) if not hasattr(obj, "_fields") else type(obj)(*seq)
    return obj


class _Forward(io.TextIOBase):
    """A text stream that sends what a rank prints to the parent, tagged with the stream."""

    def __init__(self, send, job_id, stream):
        self._send, self._job, self._stream = send, job_id, stream

    def writable(self):
        return True

    def write(self, text):
        if text:
            self._send(Output(self._job, self._stream, text))
        return len(text)


# What this worker is doing, for the parent's hang diagnosis (read by the listener thread).
_STATE = {"phase": "starting", "job": None}
_MAIN_THREAD = threading.main_thread()
_COMMLOG_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "commlog.py")


def _where_now() -> dict:
    """Where the main thread is: the ``torch.distributed`` call it waits in, and the job's own line.

    The main thread of a rank stuck in a collective is blocked in C++ with the GIL released, so
    this thread can read its Python stack: the outermost frame in ``distributed_c10d`` names the
    call (``all_reduce``, ``recv``, ``barrier``...), the innermost frame outside torch and the
    standard library is the job's own code.
    """
    frame = sys._current_frames().get(_MAIN_THREAD.ident)
    if frame is None:  # pragma: no cover - the main thread always has a frame while alive
        return {}
    stack = traceback.extract_stack(frame)
    for i, fs in enumerate(stack):
        if fs.name == "_run_job" and fs.filename == __file__:
            stack = stack[i + 1:]
            break
    else:
        return {}
    dist_call = next((fs.name for fs in stack if fs.filename.endswith("distributed_c10d.py")), None)
    if dist_call is None:
        dist_call = next((fs.name for fs in stack if _in_torch_distributed(fs.filename)), None)
    own = [fs for fs in stack if not _library_file(fs.filename)]
    where = None
    if own:
        fs = own[-1]
        where = f"{fs.name}, line {fs.lineno}" + ("" if fs.filename.startswith("<") else f" of {os.path.basename(fs.filename)}")
    return {"dist_call": dist_call, "where": where}


def _in_torch_distributed(filename: str) -> bool:
    return f"{os.sep}torch{os.sep}distributed{os.sep}" in filename


@functools.lru_cache(maxsize=None)
def _library_dirs():
    import sysconfig

    import torch

    paths = sysconfig.get_paths()
    site = tuple(os.path.join(paths[k], "") for k in ("purelib", "platlib"))
    return os.path.join(paths["stdlib"], ""), os.path.join(os.path.dirname(torch.__file__), ""), site


def _library_file(filename: str) -> bool:
    """Frames of the standard library, of torch and of the recorder: not the job's own code."""
    stdlib, torch_dir, site = _library_dirs()
    if filename.startswith(torch_dir) or filename == _COMMLOG_FILE:
        return True
    return filename.startswith(stdlib) and not filename.startswith(site)


def _status() -> dict:

    out = dict(_STATE)
    log = active_log()
    if log is not None:
        out.update(log.status())
    if out["phase"] == "running" or out["phase"] == "starting the process group":
        out.update(_where_now())
    return out


def _listen(conn, jobs, send, parent_pid: int):
    """The worker's lifeline and its answering thread (runs beside the job).

    * End this process at once when the parent's end of the pipe closes: the kernel died (even
      if it is now an unreaped zombie) or the launcher dropped this worker. A 1 s check of the
      parent's state covers a pipe end inherited by some other process of the kernel.
    * Answer the launcher's ``StatusQuery`` while the main thread is busy or stuck.
    * Hand jobs to the main thread.
    """
    while True:
        try:
            if not conn.poll(1.0):
                if process_ended(parent_pid):
                    os._exit(3)
                continue
            msg = conn.recv()
        except (EOFError, OSError):
            os._exit(3)
        if isinstance(msg, StatusQuery):
            try:  # never let a diagnosis end the lifeline
                send(Status(msg.job_id, _status()))
            except OSError:
                os._exit(3)
            except Exception as exc:
                send(Status(msg.job_id, {"phase": _STATE["phase"], "error": repr(exc)}))
        else:
            jobs.put(msg)


def process_group_backend(backend: str) -> str:
    """What ``init_process_group`` gets: on GPUs NCCL for CUDA tensors and gloo beside it for CPU
    tensors, so that a demo written with CPU tensors runs there too instead of failing with "No
    backend type associated with device type cpu"; on CPU, gloo."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def _run_job(send, rank, job: Job, store):
    """Run one job; True when this process may serve the next one."""
    import cloudpickle
    import torch.distributed as dist

    _STATE.update(phase="unpickling", job=job.job_id)
    try:
        fn, args, kwargs = cloudpickle.loads(job.payload)
    except BaseException as exc:  # nothing started yet: report it and stay reusable
        send(Failed(job.job_id, f"{type(exc).__name__}: {exc} (while unpickling the function or its arguments)",
                    traceback.format_exc(), "unpickle"))
        return True
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdout = _Forward(send, job.job_id, "stdout")
    sys.stderr = _Forward(send, job.job_id, "stderr")
    log = CommLog(record_comm=job.record, profiling=bool(job.profile_dir))
    # gloo connects a group's pairs when the group is created, or on first use when this is "1";
    # read at each process group's creation (see launcher.lazy_connect)
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1" if job.lazy_connect else "0"
    try:
        _STATE["phase"] = "starting the process group"
        job_store = dist.PrefixStore(f"job{job.job_id}/", store)
        dist.init_process_group(
            process_group_backend(job.backend),
            store=job_store,
            rank=rank,
            world_size=job.world_size,
            timeout=timedelta(seconds=job.collective_timeout),
        )
        # Every rank has its process group before any runs the function. gloo connects the full
        # mesh in init_process_group, and one side of a pair can be done before the other: without
        # this a rank with a short job finished and tore its group down (closing its sockets) while
        # a slower peer was still connecting to it ("connectFullMesh failed ... Connection closed
        # by peer", 1 launch in 6 of 8 fresh ranks under load). Through the store, not a
        # collective: the same on gloo and NCCL, and nothing in the communication log.
        job_store.set(f"started/{rank}", "1")
        job_store.wait([f"started/{r}" for r in range(job.world_size)])
        _STATE["phase"] = "running"
        log.t0 = time.perf_counter()
        start = time.perf_counter()
        with log:
            if job.profile_dir:
                result, trace = _profiled(fn, args, kwargs, job.profile_dir, rank)
            else:
                result, trace = fn(*args, **kwargs), None
        end = time.perf_counter()
        data = pickle.dumps(to_cpu(result), protocol=pickle.HIGHEST_PROTOCOL)
        _STATE["phase"] = "finished"
        send(Done(job.job_id, data, log.ops, log.spans, t_start=start, t_end=end, trace=trace))
    except BaseException as exc:  # the parent decides what to do; this rank reports
        tb = traceback.format_exc()
        stage = "init" if _STATE["phase"] == "starting the process group" else "run"
        _STATE["phase"] = "failed"
        send(Failed(job.job_id, f"{type(exc).__name__}: {exc}", tb, stage))
        return False
    finally:
        sys.stdout, sys.stderr = old_out, old_err
    try:
        _STATE["phase"] = "tearing down"
        dist.destroy_process_group()
    except Exception:  # pragma: no cover - a broken group; the parent restarts the pool
        return False
    return True


def _profiled(fn, args, kwargs, folder: str, rank: int):
    """Run the job under ``torch.profiler`` and write this rank's Chrome trace into ``folder``.

    Returns the result and ``(path, wall_us)``: ``wall_us`` is the wall clock at the start of the
    ``helpers:job`` range, which lets the launcher put every rank's trace on one time axis.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if _DEVICE_TYPE == "cuda" else [])
    prof = profile(activities=activities)
    with _quiet_stderr_fd():  # the profiler announces its start and stop on the process's stderr
        prof.start()
    try:
        wall_us = time.time_ns() / 1e3
        with record_function("helpers:job"):
            result = fn(*args, **kwargs)
    finally:
        with _quiet_stderr_fd():
            prof.stop()
    path = os.path.join(folder, f"rank{rank}.json")
    prof.export_chrome_trace(path)
    return result, (path, wall_us)


@contextlib.contextmanager
def _quiet_stderr_fd():
    """Send what C++ writes to file descriptor 2 to /dev/null for the duration (a notebook shows it)."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    import socket

    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in ("lo", "lo0") if n in names), None)


def main(conn, rank: int, device_type: str, parent_pid: int, store_port: int, threads: int):
    """Entry point of a pooled worker process (started by the launcher, never by hand)."""
    set_device(device_type, rank)
    # Ctrl-C / kernel interrupt goes to the whole process group; the parent handles it and ends
    # the workers itself, so a rank never dies half-way through a collective on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lock = threading.Lock()

    def send(msg):
        with lock:
            conn.send(msg)

    jobs = queue.SimpleQueue()
    threading.Thread(target=_listen, args=(conn, jobs, send, parent_pid), daemon=True, name="helpers-lifeline").start()
    # every socket gloo (and NCCL's bootstrap) opens binds the loopback interface: one machine
    lo = _loopback_interface()
    if lo is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = lo
        if device_type == "cuda":
            os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)
    import torch
    import torch.distributed as dist

    if device_type == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(threads)  # several ranks share the CPU cores
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=60))
    _STATE["phase"] = "idle"
    try:
        send(Ready(os.getpid()))
        while True:
            job = jobs.get()
            if not _run_job(send, rank, job, store):
                # a failed job can leave a collective half-done: this process is not reused
                _STATE["phase"] = "failed"
                return
            _STATE.update(phase="idle", job=None)
            send(Idle(job.job_id))  # torn down and listening: the parent may send the next job
    except OSError:  # the parent closed the pipe while we wrote to it: it is ending this worker
        os._exit(3)
