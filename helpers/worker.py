"""The rank side of the launcher: a long-lived worker process that runs one job after another.

Serves every notebook that runs ``torch.distributed`` (P.5 onwards). The parent
(:mod:`helpers.launcher`) starts these processes once per kernel and keeps them; each job gets a
fresh process group on a fresh store prefix, so a repeated launch costs an ``init_process_group``
and not a fresh ``import torch``.

Functions defined in a notebook live in ``__main__`` of the kernel, which a child cannot import.
The parent pickles them by value with cloudpickle and this module unpickles them: that is the
trampoline. Functions from importable modules are pickled by reference as usual.

Inside a job, worker code can ask for:

* :func:`device` -- the torch device of this rank (``cuda:<local rank>`` or ``cpu``);
* :func:`helpers.commlog.span` -- named time spans;
* the usual ``torch.distributed`` calls; the process group is already initialised.
"""
from __future__ import annotations

import io
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

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
            self._send(("out", self._job, self._stream, text))
        return len(text)


def _watch_parent(parent_pid: int):
    """Exit this process when the kernel that owns it is gone (no orphans, even mid-job)."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(parent_pid, 0)
        except OSError:
            os._exit(3)


def _run_job(send, rank, job_id, payload, opts, store):
    import cloudpickle
    import torch.distributed as dist

    from .commlog import CommLog

    fn, args, kwargs = cloudpickle.loads(payload)
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdout = _Forward(send, job_id, "stdout")
    sys.stderr = _Forward(send, job_id, "stderr")
    log = CommLog(record_comm=opts["record"])
    # gloo connects a group's pairs when the group is created, or on first use when this is "1";
    # read at each process group's creation (see launcher.lazy_connect)
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1" if opts.get("lazy_connect") else "0"
    try:
        dist.init_process_group(
            opts["backend"],
            store=dist.PrefixStore(f"job{job_id}/", store),
            rank=rank,
            world_size=opts["world_size"],
            timeout=timedelta(seconds=opts["timeout"]),
        )
        log.t0 = time.perf_counter()
        start = time.perf_counter()
        with log:
            result = fn(*args, **kwargs)
        meta = {"ops": log.ops, "spans": log.spans, "t_start": start, "t_end": time.perf_counter()}
        data = pickle.dumps(to_cpu(result), protocol=pickle.HIGHEST_PROTOCOL)
        send(("done", job_id, data, meta))
    except BaseException as exc:  # the parent decides what to do; this rank reports
        tb = traceback.format_exc()
        send(("error", job_id, f"{type(exc).__name__}: {exc}", tb))
        return False
    finally:
        sys.stdout, sys.stderr = old_out, old_err
    try:
        dist.destroy_process_group()
    except Exception:  # pragma: no cover - a broken group; the parent restarts the pool
        return False
    return True


def main(conn, rank: int, device_type: str, parent_pid: int, store_port: int, threads: int):
    """Entry point of a pooled worker process (started by the launcher, never by hand)."""
    set_device(device_type, rank)
    # Ctrl-C / kernel interrupt goes to the whole process group; the parent handles it and ends
    # the workers itself, so a rank never dies half-way through a collective on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    import torch
    import torch.distributed as dist

    if device_type == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(threads)  # several ranks share the CPU cores
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=60))
    lock = threading.Lock()

    def send(msg):
        with lock:
            conn.send(msg)

    send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        _, job_id, payload, opts = msg
        if not _run_job(send, rank, job_id, payload, opts, store):
            # a failed job can leave a collective half-done: this process is not reused
            conn.close()
            return
        send(("idle", job_id))  # torn down and listening: the parent may send the next job
