"""Pipeline schedules as timelines: GPipe, 1F1B, interleaved 1F1B, zero-bubble ZB-H1 (P.9, 12.2.2).

A schedule is an *order* of operations per device; the timeline follows from it. Each device runs
its operations one after another in the given order, and an operation starts when the device is
free and everything it depends on has finished (plus ``comm`` when the input comes from another
device). Bubble, makespan and the number of micro-batches whose activations are alive are then
read off the timeline, not from a formula; the formulas are separate functions, so the two can be
compared.

Operations (``kind``):

* ``"F"``: forward of one micro-batch through one (virtual) stage;
* ``"B"``: backward. In GPipe, 1F1B and interleaved 1F1B it is the *whole* backward (input and
  weight gradients, duration ``b + w``); in ZB-H1 it is only the input (activation) gradient,
  duration ``b``;
* ``"W"``: the weight gradient alone (ZB-H1 only), duration ``w``; it needs the B of the same
  micro-batch and nothing downstream needs it, so it can be moved into idle slots.

Schedules (the per-device orders, :func:`op_orders`):

* ``"gpipe"``: fill-drain. All m forwards, then all m backwards.
* ``"1f1b"``: PipeDream-flush / 1F1B. Device ``d`` runs ``p-d-1`` warm-up forwards, then
  alternates one forward and one backward, then drains the remaining backwards.
* ``"interleaved"``: Megatron-LM's interleaved 1F1B. Each device holds ``v`` chunks; chunk ``c``
  of device ``d`` is virtual stage ``c*p + d``. Needs ``m`` to be a multiple of ``p``. The same
  order as ``torch.distributed.pipelining.ScheduleInterleaved1F1B`` except with ``m == p``, where
  Megatron runs every forward first (:func:`interleaved_warmup`).
* ``"zb-h1"``: the 1F1B order with the backward split into B and W (Qi et al., "Zero Bubble
  Pipeline Parallelism", 2023). Device ``d`` lets up to ``d`` weight-gradient passes wait, so the
  later devices, which would otherwise idle at the end, do W work there; the leftover W's run at
  the end. Same order as ``torch.distributed.pipelining``'s zero-bubble schedules with one stage
  per rank.

Both bubble definitions used by the chapters (:func:`bubble_formula`):

* ``"total"``: idle time over total device time, ``(p-1)/(m+p-1)`` (P.9);
* ``"useful"``: idle time over busy (useful) time, ``(p-1)/m`` (12.2.2).

Times may be ints, ``Fraction`` or floats; with ints and Fractions every result is exact.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from fractions import Fraction

from .validate import index_below, integer_at_least

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
DEFINITIONS = ("total", "useful")
KINDS = ("F", "B", "W")


# ---- checks ------------------------------------------------------------------------------------

def _exact(x):
    """ints become Fractions (exact arithmetic); floats stay floats."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ValueError(f"a duration must be a real number, got {x!r}")
    return Fraction(x) if isinstance(x, (numbers.Integral, Fraction)) else float(x)


def per_stage(name: str, value, p: int, allow_zero: bool = False) -> list:
    """A duration given for every stage: a scalar (same on all) or a sequence of ``p`` values."""
    vals = list(value) if isinstance(value, (list, tuple)) or hasattr(value, "__len__") else [value] * p
    if len(vals) != p:
        raise ValueError(f"{name} needs one duration per stage: {p} values, got {len(vals)}")
    out = [_exact(x) for x in vals]
    for x in out:
        if x < 0 or (x == 0 and not allow_zero):
            raise ValueError(f"{name} durations must be {'>= 0' if allow_zero else '> 0'}, got {x}")
    return out


def check_schedule(schedule: str, p: int, m: int, v: int = 1) -> None:
    """ValueError unless (schedule, p, m, v) is a combination this module can build."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: choose one of {SCHEDULES}")
    integer_at_least(p, "p (stages)")
    integer_at_least(m, "m (micro-batches)")
    integer_at_least(v, "v (chunks per device)")
    if schedule == "interleaved":
        if v < 2:
            raise ValueError(f"interleaved 1F1B needs v >= 2 chunks per device, got v={v} (v=1 is plain 1F1B)")
        if m % p:
            raise ValueError(f"interleaved 1F1B needs m to be a multiple of p: m={m}, p={p}")
    elif v != 1:
        raise ValueError(f"schedule {schedule!r} holds one chunk per device: v must be 1, got {v}")


# ---- the per-device orders -----------------------------------------------------------------------

def op_orders(schedule: str, p: int, m: int, v: int = 1) -> list[list[tuple[str, int, int]]]:
    """For every device, the operations it runs in order, as ``(kind, chunk, micro_batch)``.

    The same orders drive the simulator (:func:`simulate`) and the real pipeline on the ranks
    (:mod:`helpers.pipeline_parallel`).
    """
    check_schedule(schedule, p, m, v)
    orders = []
    for d in range(p):
        if schedule == "gpipe":
            o = [("F", 0, j) for j in range(m)] + [("B", 0, j) for j in range(m)]
        elif schedule == "1f1b":
            o = _one_f_one_b(p, m, d, defer_w=None)
        elif schedule == "zb-h1":
            o = _one_f_one_b(p, m, d, defer_w=d)
        else:
            o = _interleaved(p, m, v, d)
        orders.append(o)
    return orders


def one_f_one_b(p: int, m: int, d: int, warm: int | None = None) -> list[tuple[str, int, int]]:
    """Device ``d``'s 1F1B order (``op_orders("1f1b", p, m)[d]``); ``warm`` replaces its warm-up
    length, ``p - d - 1`` forwards (:mod:`helpers.fake_world.step`'s step takes it as an argument)."""
    check_schedule("1f1b", p, m)
    index_below(d, "d (device)", p)
    return _one_f_one_b(p, m, d, defer_w=None, warm=warm)


def _one_f_one_b(p: int, m: int, d: int, defer_w: int | None, warm: int | None = None) -> list:
    """1F1B on device d; with ``defer_w`` = k the backward is split and up to k W's wait."""
    warm = min(p - d - 1 if warm is None else warm, m)
    order = [("F", 0, j) for j in range(warm)]
    nf, nb, nw = warm, 0, 0

    def backward():
        nonlocal nb, nw
        order.append(("B", 0, nb))
        nb += 1
        if defer_w is not None and nb - nw > defer_w:
            order.append(("W", 0, nw))
            nw += 1

    while nf < m:
        order.append(("F", 0, nf))
        nf += 1
        backward()
    while nb < m:
        backward()
    while defer_w is not None and nw < m:
        order.append(("W", 0, nw))
        nw += 1
    return order


def interleaved_warmup(p: int, m: int, v: int, d: int) -> int:
    """Forwards (of one chunk and micro-batch each) device ``d`` runs before its first backward in
    Megatron-LM's interleaved 1F1B: ``(p - d - 1) * 2 + (v - 1) * p``, at most all ``m v`` of them,
    and all of them when ``m == p`` (Megatron runs every forward first then; torch's
    ``ScheduleInterleaved1F1B`` does not special-case it, so with ``m == p`` its later ranks start
    their backwards sooner; otherwise the two orders are the same)."""
    check_schedule("interleaved", p, m, v)
    index_below(d, "d (device)", p)
    total = m * v
    return total if m == p else min((p - d - 1) * 2 + (v - 1) * p, total)


def interleaved_unit(p: int, v: int, k: int, forward: bool) -> tuple[int, int]:
    """(chunk, micro-batch) of a device's ``k``-th forward (or backward) in interleaved 1F1B: the
    forwards go ``p`` micro-batches at a time through chunk 0, then chunk 1, ..., then the next
    ``p`` micro-batches; the backwards likewise from the last chunk down."""
    chunk = (k % (p * v)) // p
    if not forward:
        chunk = v - 1 - chunk
    return chunk, (k // (p * v)) * p + k % p


def _interleaved(p: int, m: int, v: int, d: int) -> list:
    """Megatron-LM's interleaved 1F1B order for device d (m a multiple of p)."""
    total = m * v
    warm = interleaved_warmup(p, m, v, d)
    order = [("F", *interleaved_unit(p, v, k, True)) for k in range(warm)]
    for k in range(total - warm):
        order.append(("F", *interleaved_unit(p, v, k + warm, True)))
        order.append(("B", *interleaved_unit(p, v, k, False)))
    for k in range(total - warm, total):
        order.append(("B", *interleaved_unit(p, v, k, False)))
    return order


def interleaved_steps(p: int, m: int, v: int, d: int) -> list[list[tuple[str, int, int]]]:
    """Device ``d``'s interleaved order (``op_orders("interleaved", p, m, v)[d]``) cut into the
    iterations of Megatron-LM's loop (``forward_backward_pipelining_with_interleaving``): each
    warm-up forward alone, then the steady (forward, backward) pairs, then each cool-down backward
    alone. :func:`helpers.pipeline_parallel.run_steps` exchanges one iteration's outputs and the next
    one's inputs in one batch of sends and receives, as Megatron does."""
    order = _interleaved(p, m, v, d)
    warm = interleaved_warmup(p, m, v, d)
    steady = m * v - warm
    return ([[o] for o in order[:warm]] + [order[warm + 2 * k:warm + 2 * k + 2] for k in range(steady)]
            + [[o] for o in order[warm + 2 * steady:]])


# ---- the timeline --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One operation on the timeline."""

    kind: str  # "F", "B" or "W"
    device: int
    chunk: int
    mb: int
    start: object
    end: object

    @property
    def duration(self):
        return self.end - self.start


@dataclass
class Timeline:
    """What a schedule did: every op with its start and end, and what follows from them."""

    schedule: str
    p: int
    m: int
    v: int
    ops: list[Op] = field(repr=False)
    split_backward: bool = False  # True when B and W are separate ops (activations live until W)

    @property
    def makespan(self):
        """From the first op's start to the last op's end."""
        return max(o.end for o in self.ops) - min(o.start for o in self.ops)

    def device_ops(self, d: int) -> list[Op]:
        return sorted((o for o in self.ops if o.device == d), key=lambda o: (o.start, o.end))

    def busy(self, d: int | None = None):
        """Busy time of device d (sum of its op durations), or of all devices together."""
        ops = self.ops if d is None else [o for o in self.ops if o.device == d]
        return sum((o.duration for o in ops), 0)

    def idle(self, d: int | None = None):
        """Idle time inside the makespan, of device d or of all devices together."""
        n = self.p if d is None else 1
        return n * self.makespan - self.busy(d)

    def bubble(self, definition: str = "total"):
        """Measured bubble: idle device-time over total device-time (``"total"``, P.9) or over
        busy device-time (``"useful"``, 12.2.2)."""
        if definition not in DEFINITIONS:
            raise ValueError(f"definition must be one of {DEFINITIONS}, got {definition!r}")
        idle = self.idle()
        return idle / (self.p * self.makespan) if definition == "total" else idle / self.busy()

    def utilisation(self):
        """Busy device-time over total device-time (1 - bubble("total"))."""
        return self.busy() / (self.p * self.makespan)

    def in_flight(self, d: int) -> list[tuple[object, object]]:
        """Step function ``[(time, live)]`` of device d: micro-batches whose activations it holds.

        A micro-batch becomes live on a chunk when its forward starts there and is released when
        its backward ends (its W, when the backward is split). With v chunks per device each chunk
        holds 1/v of the stage's layers, so a (chunk, micro-batch) pair counts 1/v.
        """
        events = []
        unit = Fraction(1, self.v) if self.v > 1 else 1
        release = "W" if self.split_backward else "B"
        for o in self.ops:
            if o.device != d:
                continue
            if o.kind == "F":
                events.append((o.start, 1, unit))
            elif o.kind == release:
                events.append((o.end, 0, -unit))  # at equal times, releases come first
        events.sort(key=lambda e: (e[0], e[1]))
        level, steps = 0, [(min(o.start for o in self.ops), 0)]
        for t, _, du in events:
            level += du
            if steps[-1][0] == t:  # one step per instant: a release and a start at t net out
                steps[-1] = (t, level)
            else:
                steps.append((t, level))
        return steps

    def peak_in_flight(self, d: int | None = None):
        """Largest number of live micro-batches on device d (or the largest over all devices)."""
        if d is None:
            return max(self.peak_in_flight(k) for k in range(self.p))
        peak = max(level for _, level in self.in_flight(d))
        return int(peak) if isinstance(peak, Fraction) and peak.denominator == 1 else peak

    def summary(self) -> dict:
        """Makespan, both bubbles and the peak in-flight count per device, as plain floats/ints."""
        return {
            "schedule": self.schedule,
            "p": self.p,
            "m": self.m,
            "v": self.v,
            "makespan": float(self.makespan),
            "bubble (idle/total)": float(self.bubble("total")),
            "bubble (idle/useful)": float(self.bubble("useful")),
            "peak in flight per device": [_plain(self.peak_in_flight(d)) for d in range(self.p)],
        }


def _plain(x):
    if isinstance(x, Fraction):
        return int(x) if x.denominator == 1 else float(x)
    return x


def dependencies(kind: str, d: int, c: int, j: int, p: int, v: int = 1) -> list[tuple]:
    """The ops ``(kind, device, chunk, mb)`` that op ``(kind, d, c, j)`` must wait for.

    F of virtual stage s needs F of stage s-1; B of stage s needs B of stage s+1 (the last stage's B
    needs its own F, which computed the loss); W needs the B of the same micro-batch and stage.
    Virtual stage s lives on device s % p as chunk s // p.
    """
    s, V = c * p + d, p * v
    if kind == "F":
        return [] if s == 0 else [("F", (s - 1) % p, (s - 1) // p, j)]
    if kind == "B":
        if s == V - 1:
            return [("F", d, c, j)]
        return [("B", (s + 1) % p, (s + 1) // p, j)]
    if kind == "W":
        return [("B", d, c, j)]
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def simulate(
    schedule: str,
    p: int,
    m: int,
    *,
    v: int = 1,
    f=1,
    b=1,
    w=1,
    comm=0,
    forward_only: bool = False,
) -> Timeline:
    """Run the schedule's per-device orders and return the timeline.

    ``f``, ``b``, ``w``: per-stage durations (scalar or one per device) of the forward, the
    input-gradient part and the weight-gradient part of the backward for one micro-batch on one
    device's whole stage. Schedules without a B/W split run a single backward of ``b + w``. With
    ``v`` chunks per device each chunk takes 1/v of its device's time. ``comm`` is added between
    an op and a dependent op on another device. ``forward_only`` runs only the forward pass
    (GPipe's fill and drain of P.9's slot picture).
    """
    check_schedule(schedule, p, m, v)
    f = per_stage("f", f, p)
    b = per_stage("b", b, p, allow_zero=forward_only)
    w = per_stage("w", w, p, allow_zero=True)
    comm = _exact(comm)
    if comm < 0:
        raise ValueError(f"comm must be >= 0, got {comm}")
    if forward_only and schedule != "gpipe":
        raise ValueError("forward_only is the fill-drain picture of P.9: use schedule='gpipe'")
    split = schedule == "zb-h1"
    orders = op_orders(schedule, p, m, v)
    if forward_only:
        orders = [[o for o in order if o[0] == "F"] for order in orders]
    scale = Fraction(1, v) if v > 1 else 1

    def duration(kind, d):
        if kind == "F":
            return f[d] * scale
        if kind == "B":
            return (b[d] if split else b[d] + w[d]) * scale
        return w[d] * scale

    end: dict = {}
    ops: list[Op] = []
    ptr, free = [0] * p, [0] * p
    total = sum(len(o) for o in orders)
    while len(ops) < total:
        progressed = False
        for d in range(p):
            while ptr[d] < len(orders[d]):
                kind, c, j = orders[d][ptr[d]]
                need = dependencies(kind, d, c, j, p, v)
                if any(n not in end for n in need):
                    break
                t0 = max([free[d]] + [end[n] + (comm if n[1] != d else 0) for n in need])
                t1 = t0 + duration(kind, d)
                end[(kind, d, c, j)] = t1
                ops.append(Op(kind, d, c, j, t0, t1))
                free[d] = t1
                ptr[d] += 1
                progressed = True
        if not progressed:  # pragma: no cover - every order built here is deadlock-free
            stuck = {d: orders[d][ptr[d]] for d in range(p) if ptr[d] < len(orders[d])}
            raise ValueError(f"the schedule deadlocks: devices wait on each other at {stuck}")
    return Timeline(schedule, p, m, v, ops, split_backward=split)


def from_records(schedule: str, p: int, m: int, v: int, records) -> Timeline:
    """A timeline from measured ops ``(kind, device, chunk, mb, start, end)`` (the real pipeline)."""
    check_schedule(schedule, p, m, v)
    ops = [Op(k, d, c, j, float(s), float(e)) for k, d, c, j, s, e in records]
    if not ops:
        raise ValueError("no ops recorded")
    t0 = min(o.start for o in ops)
    ops = [Op(o.kind, o.device, o.chunk, o.mb, o.start - t0, o.end - t0) for o in ops]
    return Timeline(schedule, p, m, v, ops, split_backward=schedule == "zb-h1")


def handoff_delays(tl: Timeline) -> list:
    """Measured gaps between an op on one device and the op it unblocks on another.

    Only ops that found their device idle count (the device had finished its previous op before
    the input arrived), so each gap is the hand-off cost: the send, the receive and the Python in
    between. Their median is a fair ``comm`` for :func:`simulate`.
    """
    end = {(o.kind, o.device, o.chunk, o.mb): o.end for o in tl.ops}
    gaps = []
    for d in range(tl.p):
        prev_end = None
        for o in tl.device_ops(d):
            for n in dependencies(o.kind, o.device, o.chunk, o.mb, tl.p, tl.v):
                if n[1] != d and n in end and (prev_end is None or prev_end <= end[n]):
                    gaps.append(o.start - end[n])
            prev_end = o.end
    return gaps


# ---- the formulas, for comparison ------------------------------------------------------------------

def bubble_formula(p: int, m: int, v: int = 1, definition: str = "total") -> Fraction:
    """Bubble with equal stages and no communication time.

    ``"total"`` (idle/total, P.9): ``(p-1)/(v*m + p-1)``; ``"useful"`` (idle/useful, 12.2.2):
    ``(p-1)/(v*m)``. With v = 1 these are the chapters' ``(p-1)/(m+p-1)`` and ``(p-1)/m``.
    """
    integer_at_least(p, "p")
    integer_at_least(m, "m")
    integer_at_least(v, "v")
    if definition == "total":
        return Fraction(p - 1, v * m + p - 1)
    if definition == "useful":
        return Fraction(p - 1, v * m)
    raise ValueError(f"definition must be one of {DEFINITIONS}, got {definition!r}")


def convert_bubble(x, to: str):
    """Translate a bubble between definitions: total = useful/(1+useful), useful = total/(1-total)."""
    if to == "total":
        return x / (1 + x)
    if to == "useful":
        if x >= 1:
            raise ValueError(f"a bubble of idle/total must be < 1, got {x}")
        return x / (1 - x)
    raise ValueError(f"to must be one of {DEFINITIONS}, got {to!r}")


def zb_h1_bubble_time(p: int, f, b, w):
    """Idle time per device of ZB-H1 with equal stages, (p-1)(f+b-w), as in Qi et al. (1F1B: (p-1)(f+b+w))."""
    integer_at_least(p, "p")
    return (p - 1) * (_exact(f) + _exact(b) - _exact(w))


def min_microbatches(p: int, target, definition: str = "useful") -> int:
    """Smallest m whose bubble (equal stages, v = 1) is at most ``target`` under ``definition``."""
    integer_at_least(p, "p")
    target = _exact(target)
    if not 0 < target < (1 if definition == "total" else float("inf")):
        raise ValueError(f"target bubble must be in (0, 1) for 'total' and > 0 for 'useful', got {target}")
    m = 1
    while bubble_formula(p, m, 1, definition) > target:
        m += 1
    return m


# ---- drawing (in helpers.plots) --------------------------------------------------------------------

def gantt(tl: Timeline, ax=None, title: str | None = None, labels: bool = True, time_unit: str = "", xmax=None):
    """Draw the timeline as a Gantt chart: one row per device, F blue, B orange, W green (the
    colours of measured timelines, :data:`helpers.plots.KIND_COLORS`).

    Micro-batch numbers are written in the bars; with v chunks the later chunks are hatched.
    Idle stretches are the white gaps. ``xmax`` sets the time axis's end (to compare charts drawn
    on shared axes); by default it is the makespan. Drawn by :func:`helpers.plots.schedule_gantt`.
    """
    from .plots import schedule_gantt

    return schedule_gantt(tl, ax, title=title, labels=labels, time_unit=time_unit, xmax=xmax)


def plot_in_flight(tl: Timeline, ax=None):
    """Live micro-batches per device over time (activation memory, in stage-activation units);
    drawn by :func:`helpers.plots.schedule_in_flight`."""
    from .plots import schedule_in_flight

    return schedule_in_flight(tl, ax)
