"""Measurement inside a rank: every collective and point-to-point call, and named time spans.

Serves every notebook that puts a measured quantity beside a modelled one (P.5, P.6, P.7,
12.1.1 onwards). The launcher switches a :class:`CommLog` on around the worker function, so the
worker code needs no hand counting:

* every ``torch.distributed`` call reaches the c10d dispatcher ops (``c10d.allreduce_``,
  ``c10d.send``, ...), also the ones that DDP, FSDP and DTensor issue from inside PyTorch;
  a ``TorchDispatchMode`` sees each of them and records its op, payload bytes, group size and
  the group's members (``CommOp.group_ranks``: which communicator carried it);
* ``span("name")`` marks a stretch of wall time (compute, communication, ...) on this rank.

Payload bytes ``S`` are the bytes of the whole buffer an op concerns (the tensor all-reduced, the
full output of an all-gather, the full input of a reduce-scatter, the tensor sent or received).
``model_sent`` is what a ring algorithm sends from each rank for that payload, the textbook cost
of P.7 (:func:`helpers.costs.ring_bytes_sent`): ``2(N-1)/N*S`` for all-reduce, ``(N-1)/N*S`` for
all-gather, reduce-scatter and all-to-all. For ``send`` it is exact: the bytes handed to the wire.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

from ..costs import ring_bytes_sent
from ..torch_private import FUNCTIONAL_NAMESPACE

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
    seq: int = 0  # the call's number on its group, from 1 (collectives; send/recv count per peer)
    group: str = ""  # the process group's name ("0" is the default group)
    peer: int | None = None  # send/recv: the global rank at the other end
    group_ranks: tuple | None = None  # the group's members (global ranks): which communicator carried it

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


def _tensor_bytes(obj) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(o) for o in obj)
    return 0


def _find_group(args):
    """The process group a c10d call concerns, or the number of ranks where only a list is given."""
    import torch
    import torch.distributed as dist

    for a in args:
        if isinstance(a, dist.ProcessGroup):
            return a
        if isinstance(a, torch.ScriptObject):  # c10d dispatcher ops receive the group boxed
            try:
                return dist.ProcessGroup.unbox(a)
            except Exception:  # pragma: no cover - not a process group
                pass
        if isinstance(a, (list, tuple)) and a and all(isinstance(r, int) for r in a):
            return tuple(a)  # functional collectives: a list of ranks
    for a in args:
        if isinstance(a, str):  # functional collectives: a group name
            try:
                from ..torch_private import resolve_process_group

                return resolve_process_group(a)
            except Exception:  # pragma: no cover - depends on torch internals
                pass
    return None


def _group_size(args) -> int:
    import torch.distributed as dist

    g = _find_group(args)
    if isinstance(g, tuple):
        return len(g)
    if g is not None:
        return g.size()
    return dist.get_world_size() if dist.is_initialized() else 1


def record_call(log: "CommLog", func, args, kwargs) -> None:
    """Record ``func(*args, **kwargs)`` in ``log`` if it is a communication op (what the
    dispatch mode of :class:`CommLog` does with each op; also for a mode that records on its
    behalf, :mod:`helpers.fake_world.step`'s)."""
    ns = func.namespace
    table = _OPS if ns == "c10d" else _FUNCTIONAL if ns == FUNCTIONAL_NAMESPACE else None
    if table is None:
        return
    name = func.__name__.split(".")[0]
    if name in table:
        op, idx = table[name]
        nbytes = 0 if idx is None else _tensor_bytes(args[idx])
        # a functional all-gather receives its input: the whole buffer is group size x that
        whole = ns == FUNCTIONAL_NAMESPACE and op == "all_gather"
        log.record(op, nbytes, list(args) + list(kwargs.values()), name, per_member=whole)


def _make_mode_class():
    from ..torch_private import TorchDispatchMode

    class _Recorder(TorchDispatchMode):
        def __init__(self, log: "CommLog"):
            super().__init__()
            self.log = log

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            record_call(self.log, func, args, kwargs)
            return func(*args, **kwargs)

    return _Recorder


class CommLog:
    """Records the communication and the spans of one job on one rank.

    Besides the list of calls, it keeps what a hang diagnosis needs (:meth:`status`): how many
    calls this rank issued on each group (collectives) and to or from each peer (send/recv), the
    members of each group it used, and the spans open right now.
    """

    def __init__(self, record_comm: bool = True, profiling: bool = False):
        self.ops: list[CommOp] = []
        self.spans: list[Span] = []
        self.t0 = time.perf_counter()
        self.record_comm = record_comm
        self.profiling = profiling  # spans also become torch.profiler ranges
        self.counts: dict[tuple, int] = {}  # (group, ) or (group, "send"/"recv", peer) -> calls issued
        self.groups: dict[str, tuple[int, ...]] = {}  # group name -> its global ranks
        self.open_spans: list[str] = []
        self._mode = None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def record(self, op: str, nbytes: int, args, c10d_name: str = "", per_member: bool = False):
        """Append one call: its payload, its group and its number on that group (or peer).
        ``per_member``: ``nbytes`` is one member's part, and the payload is the group's size times it."""
        import torch.distributed as dist

        g = _find_group(args)
        if isinstance(g, tuple):  # functional collectives name their ranks
            size, gname, members = len(g), "", g
        elif g is None:
            size, gname = _group_size(()), ""
            members = tuple(range(size)) if dist.is_initialized() else None
        else:
            size, gname = g.size(), g.group_name
            if gname not in self.groups:
                self.groups[gname] = tuple(dist.get_process_group_ranks(g))
            members = self.groups[gname]
        if per_member:
            nbytes *= size
        peer = None
        if op in ("send", "recv"):
            local = args[2] if c10d_name in ("send", "recv_") and len(args) > 2 and isinstance(args[2], int) else None
            ranks = self.groups.get(gname)
            peer = ranks[local] if local is not None and ranks and 0 <= local < len(ranks) else local
            key = (gname, op, peer)
        else:
            key = (gname,)
        seq = self.counts[key] = self.counts.get(key, 0) + 1
        self.ops.append(CommOp(op, nbytes, size, self.now(), seq, gname, peer, members))

    def status(self) -> dict:
        """What this rank last did, for a hang diagnosis (read from another thread)."""
        last = self.ops[-1] if self.ops else None
        return {
            "last_op": last,
            "counts": dict(self.counts),
            "groups": dict(self.groups),
            "span": self.open_spans[-1] if self.open_spans else None,
            "last_span": self.spans[-1].name if self.spans else None,
        }

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


@dataclass(frozen=True)
class Mark:
    """A point in this rank's communication log, from :func:`mark` (``log`` is None outside a job)."""

    log: CommLog | None
    index: int


def mark() -> Mark:
    """The current end of the active log: ``m = mark(); ...; ops_since(m)`` are the calls made in between."""
    return Mark(_ACTIVE, len(_ACTIVE.ops) if _ACTIVE is not None else 0)


def ops_since(start: Mark, end: Mark | None = None) -> list[CommOp]:
    """The operations recorded after ``start`` (and before ``end``, if given); [] outside a launched job."""
    if start.log is None:
        return []
    return start.log.ops[start.index:None if end is None else end.index]


def as_tuples(ops) -> list[tuple[str, int, int]]:
    """Each operation as (op, payload bytes, group size): the plain form worker functions return."""
    return [(o.op, o.bytes, o.group_size) for o in ops]


def now() -> float:
    """The clock of spans and operations: seconds since this rank's job started (inside a job
    started by :func:`helpers.launcher.launch`), ``time.perf_counter()`` outside one."""
    return _ACTIVE.now() if _ACTIVE is not None else time.perf_counter()


def add_span(name: str, start: float, end: float) -> None:
    """Record a span measured by hand, on :func:`now`'s clock: for a stretch that no ``with``
    block can enclose, e.g. an asynchronous all-reduce from its issue to its completion, which a
    gloo thread reports (P.6). A no-op outside a launched job; ValueError if ``end < start``."""
    if end < start:
        raise ValueError(f"a span must not end before it starts: start {start}, end {end}")
    if _ACTIVE is not None:
        _ACTIVE.spans.append(Span(name, start, end))


@contextmanager
def span(name: str):
    """Time a named stretch of work on this rank: ``with span("compute"): ...``.

    Inside a job started by :func:`helpers.launcher.launch` the span comes back with the results
    and can be drawn as a per-rank timeline (and, with ``launch(..., profile=True)``, it is a
    range in the profiler trace); outside one (e.g. under torchrun) it is a no-op.
    """
    log = _ACTIVE
    if log is None:
        yield
        return
    start = log.now()
    log.open_spans.append(name)
    scope = None
    if log.profiling:
        import torch

        scope = torch.profiler.record_function(name)
        scope.__enter__()
    try:
        yield
    finally:
        if scope is not None:
            scope.__exit__(None, None, None)
        log.open_spans.pop()
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
