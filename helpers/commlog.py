"""Measurement inside a rank: every collective and point-to-point call, and named time spans.

Serves every notebook that puts a measured quantity beside a modelled one (P.5, P.6, P.7,
12.1.1 onwards). The launcher switches a :class:`CommLog` on around the worker function, so the
worker code needs no hand counting:

* every ``torch.distributed`` call reaches the c10d dispatcher ops (``c10d.allreduce_``,
  ``c10d.send``, ...), also the ones that DDP, FSDP and DTensor issue from inside PyTorch;
  a ``TorchDispatchMode`` sees each of them and records its op, payload bytes and group size;
* ``span("name")`` marks a stretch of wall time (compute, communication, ...) on this rank.

Payload bytes ``S`` are the bytes of the whole buffer an op concerns (the tensor all-reduced, the
full output of an all-gather, the full input of a reduce-scatter, the tensor sent or received).
``model_sent`` is what a ring algorithm sends from each rank for that payload, the textbook cost
of P.7: ``2(N-1)/N*S`` for all-reduce, ``(N-1)/N*S`` for all-gather, reduce-scatter and
all-to-all. For ``send`` it is exact: the bytes handed to the wire.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

# c10d dispatcher op name -> (our name, which positional argument holds the payload tensors)
_OPS = {
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce", 0),
    "_allgather_base_": ("all_gather", 0),  # (output, input): the output is the whole buffer
    "allgather_": ("all_gather", 0),  # (output lists, inputs)
    "allgather_coalesced_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1),  # (output, input): the input is the whole
    "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "alltoall_base_": ("all_to_all", 1),
    "alltoall_": ("all_to_all", 1),
    "broadcast_": ("broadcast", 0),
    "reduce_": ("reduce", 0),
    "gather_": ("gather", 1),
    "scatter_": ("scatter", 0),
    "send": ("send", 0),
    "recv_": ("recv", 0),
    "recv_any_source_": ("recv", 0),
    "barrier": ("barrier", None),
    "monitored_barrier_": ("barrier", None),
}
# functional collectives (_c10d_functional.*), used by DTensor and FSDP2
_FUNCTIONAL = {
    "all_reduce": ("all_reduce", 0),
    "all_reduce_coalesced": ("all_reduce", 0),
    "all_gather_into_tensor": ("all_gather", 0),
    "all_gather_into_tensor_coalesced": ("all_gather", 0),
    "reduce_scatter_tensor": ("reduce_scatter", 0),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 0),
    "all_to_all_single": ("all_to_all", 0),
    "broadcast": ("broadcast", 0),
}


@dataclass
class CommOp:
    """One communication call seen on one rank (P.7: the unit of the α-β model)."""

    op: str
    bytes: int
    group_size: int
    t: float  # seconds since the job started on this rank, when the call was issued
    group: str = ""  # the process group's name, where the call names one

    @property
    def model_sent(self) -> float:
        """Bytes this rank sends for the op under a ring algorithm (exact for ``send``)."""
        return ring_bytes_sent(self.op, self.bytes, self.group_size)


@dataclass
class Span:
    """A named stretch of wall time on one rank, in seconds since the job started."""

    name: str
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


def ring_bytes_sent(op: str, payload_bytes: float, group_size: int) -> float:
    """Bytes one rank sends for a collective of ``payload_bytes`` on a ring of ``group_size``.

    P.7: a ring all-reduce sends 2(N-1)/N*S per rank, reduce-scatter and all-gather each half of
    that; a send sends S. Ops without a single standard cost (broadcast, reduce, gather, scatter)
    are counted as S, the bytes the root's tree or pipeline must push at least once.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if payload_bytes < 0:
        raise ValueError(f"payload_bytes must be >= 0, got {payload_bytes}")
    n = group_size
    if op == "all_reduce":
        return 2 * (n - 1) / n * payload_bytes
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * payload_bytes
    if op in ("recv", "barrier"):
        return 0.0
    if op == "send":
        return float(payload_bytes)
    return float(payload_bytes) if n > 1 else 0.0


def _tensor_bytes(obj) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(o) for o in obj)
    return 0


def _group(args) -> tuple:
    """(size, name) of the process group a call names (the default group's size if none)."""
    import torch
    import torch.distributed as dist

    for a in args:
        if isinstance(a, dist.ProcessGroup):
            return a.size(), a.group_name
        if isinstance(a, torch.ScriptObject):  # c10d dispatcher ops receive the group boxed
            try:
                pg = dist.ProcessGroup.unbox(a)
                return pg.size(), pg.group_name
            except Exception:  # pragma: no cover - not a process group
                pass
        if isinstance(a, (list, tuple)) and a and all(isinstance(r, int) for r in a):
            return len(a), ""  # functional collectives: a list of ranks
    for a in args:
        if isinstance(a, str):  # functional collectives: a group name
            try:
                from torch.distributed.distributed_c10d import _resolve_process_group

                return _resolve_process_group(a).size(), a
            except Exception:  # pragma: no cover - depends on torch internals
                pass
    return (dist.get_world_size() if dist.is_initialized() else 1), ""


def _group_size(args) -> int:
    return _group(args)[0]


def _make_mode_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Recorder(TorchDispatchMode):
        def __init__(self, log: "CommLog"):
            super().__init__()
            self.log = log

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            ns = func.namespace
            name = func.__name__.split(".")[0]
            table = _OPS if ns == "c10d" else _FUNCTIONAL if ns == "_c10d_functional" else None
            if table is not None and name in table:
                op, idx = table[name]
                nbytes = 0 if idx is None else _tensor_bytes(args[idx])
                size, group = _group(list(args) + list(kwargs.values()))
                if ns == "_c10d_functional" and op == "all_gather":
                    nbytes *= size  # a functional all-gather receives its input: the whole buffer is size x that
                self.log.ops.append(CommOp(op, nbytes, size, self.log.now(), group))
            return func(*args, **kwargs)

    return _Recorder


class CommLog:
    """Records the communication and the spans of one job on one rank."""

    def __init__(self, record_comm: bool = True):
        self.ops: list[CommOp] = []
        self.spans: list[Span] = []
        self.t0 = time.perf_counter()
        self.record_comm = record_comm
        self._mode = None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def __enter__(self):
        global _ACTIVE
        _ACTIVE = self
        if self.record_comm:
            self._mode = _make_mode_class()(self)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        global _ACTIVE
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        _ACTIVE = None
        return False


_ACTIVE: CommLog | None = None


def active_log() -> CommLog | None:
    """The log of the job running on this rank, or None outside a launched job."""
    return _ACTIVE


@contextmanager
def span(name: str):
    """Time a named stretch of work on this rank: ``with span("compute"): ...``.

    Inside a job started by :func:`helpers.launcher.launch` the span comes back with the results
    and can be drawn as a per-rank timeline; outside one (e.g. under torchrun) it is a no-op.
    """
    log = _ACTIVE
    start = log.now() if log else 0.0
    try:
        yield
    finally:
        if log is not None:
            log.spans.append(Span(name, start, log.now()))


def summarize(ops: list[CommOp]) -> dict[str, dict[str, float]]:
    """Per op name: number of calls, payload bytes and ring-model bytes sent (one rank)."""
    out: dict[str, dict[str, float]] = {}
    for o in ops:
        row = out.setdefault(o.op, {"calls": 0, "bytes": 0, "model_sent": 0.0})
        row["calls"] += 1
        row["bytes"] += o.bytes
        row["model_sent"] += o.model_sent
    return out
