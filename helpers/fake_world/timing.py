"""How fast, at the chapters' scale: one rank's step time and MFU from PyTorch's own trace
(12.2.1, 12.2.2, 12.4.1, 12.4.2, P.13).

:func:`helpers.fake_world.simulate` records, with its FLOP counter (:class:`OpLog`), every op the
rank runs, with its shapes, FLOPs and bytes moved, in phases of the 1F1B schedule (each forward and
backward of a micro-batch, the optimizer step), and every collective and send/recv with its mesh
axis and bytes. :func:`step_time` turns that trace into seconds on a device of
``data/hardware.json``. The model, kept explicit:

**Compute** (each op on its own, as eager PyTorch launches it): a roofline,
``max(FLOPs / (peak x efficiency), bytes / HBM bandwidth)``. Matrix multiplies (``mm``, ``addmm``,
``bmm``, ``baddbmm``; shapes (batch, M, N, K)) reach an efficiency that depends on their shape:
``e_max x q(M, N)``, where ``q`` is the tile and wave quantization of NVIDIA's "Matrix
Multiplication Background User's Guide" (output tiles, each of the device's SMs computing one
tile per wave: ``q = M N batch / (waves x SMs x tile_M x tile_N)``, for the tile shape of the
device's list, 128 x 256, 256 x 128 or 128 x 128, that wastes least, as cuBLAS's heuristics choose)
and ``e_max`` is set so that the published best shape of the MAMF table (stas00/ml-engineering:
H100 SXM 792.1 of 989 TFLOPS at 6144 x 17920 x 2816) comes out at its published efficiency.
Attention (PyTorch's flash kernel) runs at the published FlashAttention efficiency of the device.
Every other op is memory-bound: its bytes (inputs read, outputs written) at the HBM bandwidth.
Views and allocations move nothing.

**Communication**: alpha-beta per link class. A mesh axis's group stays inside a server (NVLink)
when all its ranks share one (``rank // devices_per_node``), else it crosses servers (InfiniBand):
a ring runs at its slowest link. One call costs ``base + steps x alpha + sent / bandwidth``, with
the ring's steps and bytes sent (:func:`helpers.costs.ring_steps`, ``ring_bytes_sent``), ``alpha``
and ``base`` from NCCL's own latency model (``tuning.cc``, Ring/Simple). A send costs
``alpha + bytes / bandwidth``.

**Overlap, as the schedule allows it** (per phase: one forward or backward of one micro-batch):

* TP's collectives (axis ``tp``) and CP's K/V all-gathers and their reduce-scatters (``cp``) are on
  the critical path: the next op needs their result. Exposed whole.
* FSDP2's data-parallel collectives (``dp``, ``dp_cp``) run on their own streams: each all-gather
  is prefetched behind the previous unit's compute, each reduce-scatter runs behind the next
  unit's backward. A phase with ``n`` such calls of ``c`` seconds each over ``T`` seconds of
  compute, split evenly into ``t = T / n`` per unit: the first all-gather (nothing runs before it)
  or the last reduce-scatter (nothing runs after it) is exposed, and each other call by what it
  exceeds its unit's compute: ``exposed = c + (n - 1) max(0, c - t)``, for all-gathers and
  reduce-scatters (and DDP's all-reduces) separately (FSDP2 gives them separate streams).
  Under ZeRO-0/1 the gradients are reduced in the last micro-batch's backward only, so only that
  backward hides them; under ZeRO-3 every phase gathers.
* The optimizer step and anything after it: nothing to hide behind.
* The pipeline: 1F1B on ``p`` stages, every stage taking this rank's phase times (stages are
  assumed equal), each forward and backward starting when its stage is free and its input has
  arrived: a hand-off (``alpha + bytes / bandwidth`` of the traced activation) after the previous
  stage's forward, or the next stage's backward. A backward's exposed gradient reductions (its
  reduce-scatters and all-reduces) come after its input gradient has left: they hold its own
  stage, not the previous one, which the gradient reaches at the end of the backward's compute,
  TP and CP and gathers. Real pipelines order it so: torch.distributed.pipelining reduces FSDP's
  gradients after a stage's last backward send (``perform_reduce_grad``, torch 2.13), Megatron-LM
  after the flush (``finalize_model_grads``). (Counted in the hand-off path, the last backward's
  gradient sync was replayed on every stage as the pipeline drained: Korthikanti et al.'s 530B on
  35 stages of 3 chunks read an MFU of 0.32 against the published 0.42; now 0.45.) The step is the
  last stage-0 backward's end plus the optimizer. The bubble is that timeline with free hand-offs minus the stage's own busy time;
  the hand-off cost is what the hand-offs add to it. Under interleaved 1F1B (``v`` chunks per
  rank) the same in Megatron-LM's interleaved order (:func:`interleaved_time`): every rank's chunk
  c takes this rank's chunk c's phase times, and every virtual stage hands on to the next rank
  (the last rank's chunk c to the first rank's chunk c + 1). With equal times the bubble is
  Narayanan et al.'s (p - 1)/(v m) of the busy time.

Not modelled: kernel launch gaps, fused kernels (the trace is eager PyTorch, unfused norms and
activations), compute slowed by concurrent communication, network contention between axes, NCCL's
tree and NVLS algorithms, unequal stages.

MFU = (6 N + 12 L s d_attn) FLOPs per token (the planner's :meth:`~helpers.planner.Model.flops_per_token`)
x tokens per step / (ranks x peak x step time); HFU uses the FLOPs this rank's trace counted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..costs import ring_bytes_sent, ring_steps

SKIPPED_NAMESPACES = ("c10d", "_c10d_functional", "prim")  # collectives (timed apart), metadata queries
_NO_TRAFFIC = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
                         "lift_fresh", "_local_scalar_dense", "set_", "resize_"})
_MATMULS = ("mm", "addmm", "bmm", "baddbmm")
EXPOSED_AXES = ("tp", "cp")  # on the critical path
DP_AXES = ("dp", "dp_cp")  # FSDP2 / replicate: overlapped where the schedule allows


# ---- recording, inside the trace --------------------------------------------------------------------

def _nbytes(x) -> int:
    if hasattr(x, "element_size"):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


class OpLog:
    """Every op a trace's FLOP counter sees, by phase of the schedule (:func:`helpers.fake_world.step.measured_step`
    calls :meth:`start` at each boundary, the counter :meth:`record` for each op).

    ``phases``: one list per phase, ``[kind, micro-batch, index of its first collective in the
    CommLog, {op key: count}, bytes of memory-bound ops]`` and, under interleaved 1F1B, the
    chunk; an op key is ``("mm", batch, M, N, K,
    bytes per element, bytes moved)`` for a matrix multiply, ``("flops", FLOPs, bytes moved)`` for
    any other op PyTorch's FLOP table counts (attention). Shapes only: no tensor is kept."""

    def __init__(self):
        self.phases = [["start", 0, 0, {}, 0]]

    def start(self, kind: str, i: int, comm_index: int, chunk: int | None = None) -> None:
        self.phases.append([kind, i, comm_index, {}, 0] + ([] if chunk is None else [chunk]))

    def record(self, func, args, out, flop_registry) -> None:
        if func.namespace in SKIPPED_NAMESPACES or func.is_view:
            return
        name = func.__name__.split(".")[0]
        if name in _NO_TRAFFIC:
            return
        moved = _nbytes(args) + _nbytes(out)
        phase = self.phases[-1]
        if name in _MATMULS:
            a, b = (args[1], args[2]) if name.startswith(("addmm", "baddbmm")) else (args[0], args[1])
            batch = a.shape[0] if a.dim() == 3 else 1
            key = ("mm", batch, a.shape[-2], b.shape[-1], a.shape[-1], a.element_size(), moved)
        elif func.overloadpacket in flop_registry:
            flops = flop_registry[func.overloadpacket](*args, out_val=out)
            key = ("flops", flops, moved)
        else:
            phase[4] += moved
            return
        phase[3][key] = phase[3].get(key, 0) + 1


def trace_phases(op_log: OpLog, comm_ops) -> list:
    """The op log and the trace's collectives ((kind, bytes, group size, axis) per call) as one
    dict per phase: ``kind`` (start, F, B, opt, end), ``i``, ``ops`` ({op key: count}), ``mem``
    (bytes of memory-bound ops) and ``comm`` ({(kind, axis, group size): [calls, bytes]}); under
    interleaved 1F1B also ``c``, the chunk of an F or B (0 for the others)."""
    out = []
    starts = [p[2] for p in op_log.phases[1:]] + [len(comm_ops)]
    for p, end in zip(op_log.phases, starts):
        comm = {}
        for kind, nbytes, g, axis in comm_ops[p[2]:end]:
            row = comm.setdefault((kind, axis, g), [0, 0])
            row[0] += 1
            row[1] += nbytes
        out.append({"kind": p[0], "i": p[1], "ops": dict(p[3]), "mem": p[4], "comm": comm,
                    **({"c": p[5]} if len(p) > 5 else {})})
    return out


def repeat_steady(phases: list, first: int, second: int, extra: int) -> list:
    """The phases with the steady 1F1B iteration that starts at forward ``first`` (up to forward
    ``second``) repeated ``extra`` more times after it (the iterations a shortened trace left out);
    micro-batches renumbered in order."""
    at = lambda i: next(j for j, p in enumerate(phases) if p["kind"] == "F" and p["i"] == i)
    return repeat_phases(phases, at(first), at(second), extra)


def repeat_phases(phases: list, a: int, b: int, extra: int) -> list:
    """The phases with ``phases[a:b]`` repeated ``extra`` more times after it; the micro-batches of
    each kind (and chunk, under interleaving) renumbered in order."""
    out = phases[:b] + [dict(p) for p in phases[a:b]] * extra + phases[b:]
    n = {}
    renumbered = []
    for p in out:
        if p["kind"] in ("F", "B"):
            key = (p["kind"], p.get("c"))
            p = {**p, "i": n.get(key, 0)}
            n[key] = p["i"] + 1
        renumbered.append(p)
    return renumbered


def with_warmup(phases: list, warm: int) -> list:
    """The phases of a 1F1B trace whose warm-up held ``v >= 2`` micro-batches, as the same step with
    a warm-up of ``warm``: a warm-up forward (the second: the first also gathers the weights) and a
    cool-down backward (the last but one: the last also reduces the gradients) repeated ``warm - v``
    more times each; micro-batches renumbered in order. :func:`helpers.fake_world.simulate` traces a
    long warm-up (stage 0 of Llama 3's PP 16 holds 15 micro-batches) as warm-ups of 1 to 3."""
    fwd = [j for j, p in enumerate(phases) if p["kind"] == "F"]
    bwd = [j for j, p in enumerate(phases) if p["kind"] == "B"]
    first_b = bwd[0]
    v = sum(1 for j in fwd if j < first_b) - 1  # forwards before the first backward: the warm-up and one steady
    if v < 2 or warm < v:
        raise ValueError(f"a trace with a warm-up of {v} micro-batches cannot stand for one of {warm} (needs 2 <= v <= warm)")
    out = repeat_phases(phases, fwd[1], fwd[2], warm - v)
    bwd = [j for j, p in enumerate(out) if p["kind"] == "B"]
    out = repeat_phases(out, bwd[-2], bwd[-1], warm - v)
    # the optimizer step and the end are numbered by the step's micro-batches
    return [p if p["kind"] in ("F", "B", "start") else {**p, "i": p["i"] + warm - v} for p in out]


def line(pa: list, pb: list, x0: int, x: int) -> list:
    """Phases of a stage of ``x`` layers on the line through traces of ``x0`` (``pa``) and
    ``x0 + 1`` (``pb``) layers: every count and byte figure extrapolated, key by key."""
    if [(p["kind"], p.get("c")) for p in pa] != [(p["kind"], p.get("c")) for p in pb]:
        raise ValueError("the two traces ran different schedules: their phases cannot be extrapolated")
    f = lambda a, b: round(a + (x - x0) * (b - a))
    out = []
    for a, b in zip(pa, pb):
        ops = {k: f(a["ops"].get(k, 0), b["ops"].get(k, 0)) for k in set(a["ops"]) | set(b["ops"])}
        comm = {k: [f(u, v) for u, v in zip(a["comm"].get(k, (0, 0)), b["comm"].get(k, (0, 0)))]
                for k in set(a["comm"]) | set(b["comm"])}
        out.append({"kind": a["kind"], "i": a["i"], "ops": {k: c for k, c in ops.items() if c > 0},
                    "mem": f(a["mem"], b["mem"]), "comm": {k: r for k, r in comm.items() if r[0] > 0},
                    **({"c": a["c"]} if "c" in a else {})})
    return out


# ---- the device and its links -----------------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """One link class: bandwidth per direction (bytes/s), latency per ring step and per call (s)."""

    name: str
    bytes_per_s: float
    alpha_s: float
    base_s: float


@dataclass(frozen=True)
class Device:
    name: str
    peak: float
    fp32_peak: float
    hbm: float
    gemm_e_max: float
    sms: int
    tiles: tuple
    attention_efficiency: float
    devices_per_node: int
    intra: Link
    inter: Link


def _hardware(hardware: dict | None) -> dict:
    if hardware is not None:
        return hardware
    from ..planner.specs import hardware as load

    return load()


def known_devices(hardware: dict | None = None) -> list:
    """The devices ``data/hardware.json`` lists (those with a BF16 peak)."""
    return sorted(k for k, v in _hardware(hardware).items() if isinstance(v, dict) and "bf16_dense_flops" in v)


def link(name: str, hardware: dict | None = None) -> Link:
    """Link class ``name`` of ``data/hardware.json``; an error if it lacks a bandwidth or latency."""
    hw = _hardware(hardware)
    entry = hw.get(name)
    if not isinstance(entry, dict):
        links = sorted(k for k, v in hw.items() if isinstance(v, dict) and "bytes_per_s" in v)
        raise ValueError(f"no link class {name!r} in data/hardware.json (link classes with a bandwidth: {links})")
    missing = [k for k in ("bytes_per_s", "alpha_s", "base_s") if k not in entry]
    if missing:
        raise ValueError(f"link class {name!r} has no {' / '.join(missing)} in data/hardware.json: "
                         "its time cannot be modelled (no default is assumed)")
    return Link(name, float(entry["bytes_per_s"]), float(entry["alpha_s"]), float(entry["base_s"]))


def wave_quantization(m: int, n: int, batch: int, tiles: tuple, sms: int) -> float:
    """Share of the matrix units' work that is useful for an (M, N) output, one tile per SM per
    wave: M N batch / (waves x SMs x tile area), for the best of ``tiles`` ((rows, columns) each)."""
    best = 0.0
    for tm, tn in tiles:
        count = math.ceil(m / tm) * math.ceil(n / tn) * batch
        waves = math.ceil(count / sms)
        best = max(best, m * n * batch / (waves * sms * tm * tn))
    return best


def get_device(name: str, hardware: dict | None = None, network: str | None = None,
               devices_per_node: int | None = None) -> Device:
    """Device ``name`` of ``data/hardware.json`` with its link classes (``network`` replaces its
    inter-server link, ``devices_per_node`` its server size)."""
    hw = _hardware(hardware)
    known = known_devices(hw)
    if name not in known:
        raise ValueError(f"unknown device {name!r}: data/hardware.json knows {known}")
    d = hw[name]
    missing = [k for k in ("hbm_bytes_per_s", "fp32_flops", "gemm", "attention_efficiency", "devices_per_node",
                           "intra_node_link", "inter_node_link") if k not in d]
    if missing:
        raise ValueError(f"device {name!r} in data/hardware.json has no {', '.join(missing)}: its step time "
                         "cannot be modelled")
    g = d["gemm"]
    tiles = tuple(tuple(t) for t in g["tiles"])
    best = g["mamf_shape"]
    e_max = g["mamf_flops"] / d["bf16_dense_flops"] / wave_quantization(best[0], best[1], 1, tiles, g["sms"])
    dpn = d["devices_per_node"] if devices_per_node is None else int(devices_per_node)
    if dpn < 1:
        raise ValueError(f"devices_per_node must be at least 1, got {devices_per_node!r}")
    return Device(name, float(d["bf16_dense_flops"]), float(d["fp32_flops"]), float(d["hbm_bytes_per_s"]), e_max,
                  int(g["sms"]), tiles, float(d["attention_efficiency"]), dpn, link(d["intra_node_link"], hw),
                  link(network or d["inter_node_link"], hw))


# ---- time of one op, one collective ------------------------------------------------------------------

def matmul_efficiency(dev: Device, m: int, n: int, k: int, batch: int = 1) -> float:
    """Achieved share of peak of a (batch x) M x K by K x N matrix multiply (module docstring)."""
    return dev.gemm_e_max * wave_quantization(m, n, batch, dev.tiles, dev.sms)


def op_time(dev: Device, key: tuple) -> float:
    """Seconds of one recorded op (an :class:`OpLog` key) by the roofline."""
    if key[0] == "mm":
        _, batch, m, n, k, elem, moved = key
        peak = dev.fp32_peak if elem == 4 else dev.peak
        flops = 2 * batch * m * n * k
        return max(flops / (peak * matmul_efficiency(dev, m, n, k, batch)), moved / dev.hbm)
    _, flops, moved = key
    return max(flops / (dev.peak * dev.attention_efficiency), moved / dev.hbm)


def collective_time(kind: str, nbytes: float, group_size: int, ln: Link) -> float:
    """Seconds of one call: ``base + steps x alpha + ring bytes sent / bandwidth``; a send or
    receive ``alpha + bytes / bandwidth``; 0 in a group of one."""
    if group_size < 2:
        return 0.0
    if kind in ("send", "recv"):
        return ln.alpha_s + nbytes / ln.bytes_per_s
    return ln.base_s + ring_steps(kind, group_size) * ln.alpha_s + ring_bytes_sent(kind, nbytes, group_size) / ln.bytes_per_s


def group_members(rank: int, layout, axis: str) -> list:
    """The global ranks of ``rank``'s group along a mesh axis (dp, pp, cp, tp, or dp_cp), rank
    order (dp, pp, cp, tp), tp fastest, as :func:`helpers.fake_world.step.coords`."""
    sizes = {"dp": layout.dp, "pp": layout.pp, "cp": layout.cp, "tp": layout.tp}
    names = ("dp", "pp", "cp", "tp")
    c, r = {}, rank
    for nm in reversed(names):
        c[nm] = r % sizes[nm]
        r //= sizes[nm]
    free = ("dp", "cp") if axis == "dp_cp" else (axis,)
    if any(a not in sizes for a in free):
        raise ValueError(f"unknown mesh axis {axis!r}")
    members = [dict(c)]
    for a in free:
        members = [{**x, a: j} for x in members for j in range(sizes[a])]
    out = []
    for x in members:
        v = 0
        for nm in names:
            v = v * sizes[nm] + x[nm]
        out.append(v)
    return sorted(out)


def axis_link(dev: Device, rank: int, layout, axis: str) -> Link:
    """The link class a ring over ``axis``'s group runs at: NVLink inside one server, else the
    inter-server network."""
    nodes = {r // dev.devices_per_node for r in group_members(rank, layout, axis)}
    return dev.inter if len(nodes) > 1 else dev.intra


def exposed_overlapped(calls: int, each_s: float, compute_s: float) -> float:
    """Exposed seconds of ``calls`` collectives of ``each_s`` each, interleaved with ``compute_s``
    of compute in as many equal units (module docstring): the first (or last) one whole, each
    other by what it exceeds its unit."""
    if calls == 0:
        return 0.0
    unit = compute_s / calls
    return each_s + (calls - 1) * max(0.0, each_s - unit)


# ---- the 1F1B timeline ----------------------------------------------------------------------------------

def one_f_one_b_time(p: int, fwd: list, bwd: list, handoff_s: float = 0.0, bwd_tail: list | None = None) -> float:
    """End of the last backward of a 1F1B step on ``p`` equal stages: micro-batch i's forward
    takes ``fwd[i]`` and its backward ``bwd[i]`` on every stage; a forward starts when its stage
    is free and the previous stage's forward of the same micro-batch ended ``handoff_s`` before,
    a backward likewise after the next stage's backward (the last stage's after its own forward).
    ``bwd_tail[i]``: the last seconds of ``bwd[i]`` that come after its input gradient has left for
    the previous stage (its gradients' reduction: module docstring), which hold its own stage only."""
    m = len(fwd)
    tail = [0.0] * m if bwd_tail is None else list(bwd_tail)
    if len(bwd) != m or len(tail) != m:
        raise ValueError("one forward and one backward time per micro-batch")
    if p == 1:
        return sum(fwd) + sum(bwd)
    as_chunk0 = lambda xs: {(0, i): x for i, x in enumerate(xs)}
    return _timeline("1f1b", p, 1, as_chunk0(fwd), as_chunk0(bwd), handoff_s, as_chunk0(tail))


def interleaved_time(p: int, v: int, fwd: dict, bwd: dict, handoff_s: float = 0.0,
                     bwd_tail: dict | None = None) -> float:
    """End of the last backward of an interleaved 1F1B step (Megatron-LM's order,
    :func:`helpers.pipeline_schedule.op_orders`) on ``p`` ranks of ``v`` chunks: the forward of
    micro-batch i through chunk c takes ``fwd[(c, i)]`` on every rank and its backward ``bwd[(c, i)]``;
    an op starts when its rank is free and its input has arrived (:func:`helpers.pipeline_schedule.dependencies`:
    the previous virtual stage's forward, the next one's backward, the last stage's own forward),
    ``handoff_s`` after the op it depends on when that ran on another rank; ``bwd_tail[(c, i)]``: the
    last seconds of a backward, after its input gradient has left (as :func:`one_f_one_b_time`)."""
    tail = dict.fromkeys(bwd, 0.0) if bwd_tail is None else bwd_tail
    if set(fwd) != set(bwd) or set(tail) != set(bwd) or len(fwd) % v:
        raise ValueError("one forward and one backward time per chunk and micro-batch")
    return _timeline("interleaved", p, v, fwd, bwd, handoff_s, tail)


def _timeline(schedule: str, p: int, v: int, fwd: dict, bwd: dict, handoff_s: float, tail: dict) -> float:
    """The end of the last op of ``schedule``'s orders (:func:`helpers.pipeline_schedule.op_orders`)
    on ``p`` ranks, every rank taking the times ``fwd[(c, i)]`` and ``bwd[(c, i)]``: each op starts
    when its rank is free and what it depends on (:func:`helpers.pipeline_schedule.dependencies`)
    has ended, ``handoff_s`` later when that ran on another rank; a backward's input gradient
    leaves ``tail[(c, i)]`` before its end."""
    from ..pipeline_schedule import dependencies, op_orders

    orders = op_orders(schedule, p, len(fwd) // v, v)
    done, nxt, free = {}, [0] * p, [0.0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for d in range(p):
            while nxt[d] < len(orders[d]):
                kind, c, i = orders[d][nxt[d]]
                deps = dependencies(kind, d, c, i, p, v)
                if any(dep not in done for dep in deps):
                    break
                ready = max((done[dep] + (handoff_s if dep[1] != d else 0.0) for dep in deps), default=0.0)
                start = max(free[d], ready)
                free[d] = start + (fwd if kind == "F" else bwd)[(c, i)]
                done[(kind, d, c, i)] = free[d] - (0.0 if kind == "F" else tail[(c, i)])
                nxt[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - 1F1B's and the interleaved orders never deadlock
            raise RuntimeError(f"the {schedule} timeline deadlocked")
    return max(free)


# ---- the result ------------------------------------------------------------------------------------------

@dataclass
class StepTime:
    """One rank's step on a device: seconds (``step_s``), tokens per second per GPU, MFU (model
    FLOPs, 6N + 12 L s d per token) and HFU (the FLOPs the trace counted), the breakdown in seconds
    (compute, exposed TP, exposed CP, exposed DP, bubble, PP hand-off; they sum to ``step_s``),
    ``dp_total_s`` (every DP collective, hidden or not), the link class of each mesh axis, and the
    planner's estimate for the same layout (``planner``: step s, MFU, its own breakdown)."""

    device: str
    layout: str
    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float
    breakdown: dict
    dp_total_s: float
    links: dict
    planner: dict | None = None
    notes: list = field(default_factory=list)

    def row(self) -> dict:
        out = {"layout": self.layout, "device": self.device, "step s": round(self.step_s, 3),
               "tokens/s/GPU": round(self.tokens_per_s_per_gpu), "MFU": round(self.mfu, 3)}
        out.update({k: round(v, 3) for k, v in self.breakdown.items()})
        if self.planner:
            out["planner step s"] = round(self.planner["step_s"], 3)
            out["planner MFU"] = round(self.planner["mfu"], 3)
        return out


def _planner(step, dev_name: str, network: str | None, dpn: int | None):
    """The planner's estimate (:func:`helpers.planner.assess`) for the step's layout on a cluster of
    the same device, links and size; None for a device the planner has no cluster of."""
    from ..planner import Rules, a100_cluster, assess, h100_cluster

    builders = {"h100_sxm": h100_cluster, "a100_sxm": a100_cluster}
    if dev_name not in builders:
        return None
    over = {} if dpn is None else {"devices_per_node": dpn}
    if network is not None:
        over["inter_bw"] = link(network).bytes_per_s
    cluster = builders[dev_name](step.world_size, **over)
    lay = step.layout_spec
    gb = lay.dp * lay.micro_batch * step.micro_batches
    a = assess(step.model_spec, cluster, gb, lay, Rules(dropout=False, allow_uneven_stages=True))
    if not a.time:
        return {"step_s": math.nan, "mfu": math.nan, "breakdown": {}, "reasons": a.reasons}
    return {"step_s": a.time["total"], "mfu": a.mfu, "breakdown": dict(a.time), "reasons": a.reasons}


def step_time(step, device: str = "h100_sxm", *, network: str | None = None, devices_per_node: int | None = None,
              hardware: dict | None = None, planner: bool = True) -> StepTime:
    """Step time, tokens/s/GPU, MFU and breakdown of ``step`` (a :class:`helpers.fake_world.FakeStep`)
    on ``device`` (a key of ``data/hardware.json``), by the model of the module docstring.
    ``network``: the inter-server link class instead of the device's; ``devices_per_node``: the
    server size instead of the device's; ``hardware``: a dict in place of ``data/hardware.json``;
    ``planner``: also the planner's estimate for the same layout (h100_sxm, a100_sxm)."""
    dev = get_device(device, hardware, network, devices_per_node)
    if getattr(step, "timing", None) is None:
        raise ValueError("this FakeStep has no op trace: simulate(..., timing=True) records one")
    lay, rank = step.layout_spec, step.rank
    links = {ax: axis_link(dev, rank, lay, ax).name for ax in ("dp", "pp", "cp", "tp", "dp_cp")
             if (ax != "dp_cp" or lay.cp > 1)}
    notes = []
    time_of = {}

    def compute_of(ph):
        s = ph["mem"] / dev.hbm
        for key, count in ph["ops"].items():
            if key not in time_of:
                time_of[key] = op_time(dev, key)
            s += count * time_of[key]
        return s

    parts = dict.fromkeys(("compute", "exposed TP", "exposed CP", "exposed DP", "bubble", "PP hand-off"), 0.0)
    dp_total, fwd, bwd, tails, outside = 0.0, {}, {}, {}, 0.0
    handoff, sends = 0.0, 0
    for ph in step.timing:
        c = compute_of(ph)
        crit, dp_exp = {"tp": 0.0, "cp": 0.0}, 0.0
        streams = {}
        for (kind, axis, g), (calls, nbytes) in ph["comm"].items():
            ln = axis_link(dev, rank, lay, axis)
            each = collective_time(kind, nbytes / calls, g, ln)
            if axis == "pp":
                if kind == "send" and g > 1:
                    handoff, sends = handoff + each * calls, sends + calls
                continue
            if axis in EXPOSED_AXES:
                crit[axis] += each * calls
            elif axis in DP_AXES:
                dp_total += each * calls
                streams[kind] = (streams.get(kind, (0, 0.0))[0] + calls, each)
            else:
                crit["tp"] += each * calls
                notes.append(f"collectives on axis {axis!r} counted as exposed")
        tail = 0.0
        if ph["kind"] in ("F", "B"):
            exposed = {kind: exposed_overlapped(n, each, c) for kind, (n, each) in streams.items()}
            dp_exp = sum(exposed.values())
            if ph["kind"] == "B":  # the reductions end the backward, after its input gradient has left
                tail = dp_exp - exposed.get("all_gather", 0.0)
        else:
            dp_exp = sum(n * each for n, each in streams.values())
        parts["compute"] += c
        parts["exposed TP"] += crit["tp"]
        parts["exposed CP"] += crit["cp"]
        parts["exposed DP"] += dp_exp
        t = c + crit["tp"] + crit["cp"] + dp_exp
        if ph["kind"] in ("F", "B"):
            (fwd if ph["kind"] == "F" else bwd)[(ph.get("c", 0), ph["i"])] = t
            if ph["kind"] == "B":
                tails[(ph.get("c", 0), ph["i"])] = tail
        else:
            outside += t
    v = lay.v
    if len(fwd) != step.micro_batches * v or len(bwd) != step.micro_batches * v:
        raise ValueError(f"the trace has {len(fwd)} forwards and {len(bwd)} backwards for {step.micro_batches} "
                         f"micro-batches" + (f" through {v} chunks" if v > 1 else ""))
    h = handoff / sends if sends else 0.0
    p = lay.pp
    busy = sum(fwd.values()) + sum(bwd.values())
    if v == 1:
        fwd, bwd = [fwd[0, i] for i in range(len(fwd))], [bwd[0, i] for i in range(len(bwd))]
        tails = [tails[0, i] for i in range(len(bwd))]
        free_handoffs = one_f_one_b_time(p, fwd, bwd, 0.0, tails)
        timeline = one_f_one_b_time(p, fwd, bwd, h, tails)
    else:
        free_handoffs = interleaved_time(p, v, fwd, bwd, 0.0, tails)
        timeline = interleaved_time(p, v, fwd, bwd, h, tails)
    parts["bubble"] = free_handoffs - busy
    parts["PP hand-off"] = timeline - free_handoffs
    total = timeline + outside
    model = step.model_spec
    tokens = lay.dp * lay.micro_batch * step.micro_batches * model.seq_len
    world = step.world_size
    mfu = model.flops_per_token() * tokens / (world * dev.peak * total)
    if p > 1 and v == 1:
        notes.append("every pipeline stage is taken to run this rank's stage's times")
    elif p > 1:
        notes.append("every pipeline rank is taken to run this rank's chunks' times (its chunk c's on every chunk c)")
    plan = _planner(step, dev.name, network, devices_per_node) if planner and hardware is None else None
    return StepTime(device=dev.name, layout=step.layout, step_s=total, tokens_per_s_per_gpu=tokens / world / total,
                    mfu=mfu, hfu=step.flops / (dev.peak * total), breakdown=parts, dp_total_s=dp_total, links=links,
                    planner=plan, notes=sorted(set(notes)))


# ---- published throughput ------------------------------------------------------------------------------

DEVICES_BY_HARDWARE = {"H100 80GB HBM3": "h100_sxm", "A100 80GB SXM": "a100_sxm"}
LLAMA_SHAPES = {  # Meta's published configurations (model cards / params.json): layers, hidden, heads, KV heads, FFN
    "llama3.1_8b": (32, 4096, 32, 8, 14336), "llama3.1_70b": (80, 8192, 64, 8, 28672),
    "llama3.1_405b": (126, 16384, 128, 8, 53248), "llama3_405b": (126, 16384, 128, 8, 53248)}
_NOT_EAGER_BF16 = ("float8", "torch.compile", "async tp")
# FSDP2's float8 all-gather (issue 26): torch 2.13 has the hook (a sharded parameter's tensor subclass may
# define fsdp_pre_all_gather / fsdp_post_all_gather, torch/distributed/fsdp/_fully_shard/_fsdp_param.py) but
# no float8 weight type to use it; torchao's WeightWithDynamicFloat8CastTensor is one (a new dependency)
FLOAT8_ALL_GATHER = ("FSDP2's float8 all-gather of the weights (torchao's float8 weight tensor through FSDP2's "
                     "fsdp_pre_all_gather hook; torch 2.13 alone has the hook, no float8 weight type): each unit's "
                     "weights gathered in 1 byte instead of 2, halving the all-gather bytes (ZeRO-3: every forward "
                     "and backward; ZeRO-1/2: once a step) and the unsharded weight buffers they fill (a unit and its "
                     "prefetched neighbour), plus one FP32 scale per tensor (an all-reduce of the amax); gradients "
                     "still reduced in FP32 or BF16, the FP32 master and moments unchanged")


def _number(pattern: str, text: str):
    import re

    hit = re.search(pattern, text)
    return int(hit.group(1).replace(",", "")) if hit else None


def express(run, shapes: dict | None = None):
    """A published run (:class:`helpers.published.ThroughputRun`) as what the fake world runs:
    ``(model, layout, simulate options, device, published MFU, which of our figures it is
    compared with)``, or the reason it cannot be expressed (a str). ``shapes``: model name -> the
    text of another row of the same model that states its shapes (:func:`model_shapes`), for a row
    that does not (Korthikanti et al.'s 530B at DP 8 is their Table 3's 530B)."""
    from ..planner import Layout, Model

    L = run.layout
    dev = next((d for k, d in DEVICES_BY_HARDWARE.items() if L.hardware.startswith(k)), None)
    if dev is None:
        return f"hardware {L.hardware.split(',')[0]!r} is not a device of data/hardware.json"
    text = " ".join(x or "" for x in (L.precision, L.other, run.notes)).lower()
    tricks = [t for t in _NOT_EAGER_BF16 if t in text]
    if tricks:
        why = f"uses {', '.join(tricks)}: the trace is eager BF16 PyTorch"
        return why + (f"; not traced: {FLOAT8_ALL_GATHER}" if "float8 all-gather" in text else "")
    if L.recompute not in ("none", "full"):
        return f"recompute {L.recompute!r}: the fake world traces none or full"
    v = stages_per_rank(L.pp_schedule)
    if isinstance(v, str):
        return v
    need = {k: getattr(L, k) for k in ("dp_shard", "dp_replicate", "tp", "pp", "cp", "local_batch", "seq_len")}
    if any(v is None for v in need.values()):
        return f"unstated: {', '.join(k for k, v in need.items() if v is None)}"
    mfu, ours = run.mfu, "mfu"
    if "percentage of theoretical peak" in (run.mfu_counts or "").lower():
        ours = "hfu"  # Megatron-LM's figure counts the recomputed forward (hardware FLOPs)
    if mfu is None and run.tflops_per_gpu and run.peak_tflops:
        mfu = run.tflops_per_gpu / run.peak_tflops
    if mfu is None:
        return "no MFU published (nor TFLOP/s with a peak)"
    if L.model in LLAMA_SHAPES:
        layers, h, a, kv, ffn = LLAMA_SHAPES[L.model]
        model = Model(L.model, layers=layers, hidden=h, heads=a, kv_heads=kv, ffn=ffn, mlp_matrices=3,
                      seq_len=L.seq_len, vocab=128256)
    else:
        text = " ".join(x or "" for x in (L.other, run.notes))
        if _shapes_of(text) is None and L.model in (shapes or {}):
            text = shapes[L.model]
        h, layers, a = _shapes_of(text) or (None, None, None)
        if None in (h, layers, a):
            return f"model {L.model!r}: its shapes (hidden, layers, heads) are not in the row"
        model = Model(L.model, layers=layers, hidden=h, heads=a, ffn=4 * h, seq_len=L.seq_len,
                      vocab=_number(r"vocabulary ([\d,]+)", text) or 0)
    m = L.micro_batches or L.local_batch  # micro-batch 1 where unstated
    if L.local_batch % m:
        return f"local batch {L.local_batch} is not a multiple of {m} micro-batches"
    dp = L.dp_shard * L.dp_replicate
    zero = 0 if L.dp_shard == 1 else 2
    if v > 1 and m % L.pp:
        return f"interleaved 1F1B needs the micro-batches to be a multiple of PP = {L.pp}: {m}"
    layout = Layout(dp=dp, tp=L.tp, pp=L.pp, cp=L.cp, zero=zero, micro_batch=L.local_batch // m, v=v,
                    recompute=L.recompute, sequence_parallel="no sequence parallelism" not in text.lower())
    sim = {"micro_batches": m, "trace_layers": 2}
    if v > 1:  # the interleaved warm-up, traced whole, is (v + 1) PP forwards long: allowed, as a benchmark would
        sim["max_layer_passes"] = INTERLEAVED_MAX_LAYER_PASSES
    if L.pp > 1 and model.layers % (L.pp * v):
        from . import uneven_stages

        sim["stages"] = uneven_stages(model.layers, L.pp * v)
    return model, layout, sim, dev, mfu, ours


def _shapes_of(text: str):
    """(hidden, layers, heads) a row's text states, or None."""
    found = _number(r"hidden ([\d,]+)", text), _number(r"([\d,]+) layers", text), _number(r"([\d,]+) heads", text)
    return None if None in found else found


def model_shapes(runs) -> dict:
    """Model name -> the text (``other`` and ``notes``) of the first row of that model stating its
    hidden size, layers and heads, for :func:`express`."""
    out = {}
    for run in runs:
        text = " ".join(x or "" for x in (run.layout.other, run.notes))
        if _shapes_of(text) is not None:
            out.setdefault(run.layout.model, text)
    return out


INTERLEAVED_MAX_LAYER_PASSES = 2000  # an interleaved published run's trace: up to about 2 minutes here


def stages_per_rank(schedule: str | None):
    """A published run's chunks per pipeline rank (1: plain 1F1B or no pipeline) from its
    ``pp_schedule`` column, or the reason it gives none (a str): an interleaved schedule must say
    "<v> stages per rank", v >= 2 (its bubble, (p - 1)/(v m), and its hand-offs depend on v)."""
    import re

    text = (schedule or "").lower()
    if not re.search(r"(?<!non-)interleaved", text):  # "1F1B (non-interleaved, ...)" is plain 1F1B
        return 1
    hit = re.search(r"(\d+) stages per rank", text)
    if hit is None:
        return (f"interleaved 1F1B with the stages per rank (v) unstated ({schedule!r}): the bubble, (p - 1)/(v m), "
                "the hand-offs and the activations in flight depend on v")
    if int(hit.group(1)) < 2:
        return f"the schedule {schedule!r} says interleaved but holds {hit.group(1)} stage per rank (plain 1F1B)"
    return int(hit.group(1))


def compare_published(runs, simulate=None) -> dict:
    """Each published run the fake world can express, simulated and timed, its MFU beside the
    published one: ``{"rows": [...], "cannot": [(id, reason)], "within_15pct": k, "n": n,
    "max_rel_err": ...}``. ``simulate(model, layout, **options)``: defaults to
    :func:`helpers.fake_world.simulate` (a test passes its own)."""
    if simulate is None:
        from . import simulate
    rows, cannot = [], []
    runs = list(runs)
    shapes = model_shapes(runs)
    for run in runs:
        e = express(run, shapes)
        if isinstance(e, str):
            cannot.append((run.id, e))
            continue
        model, layout, sim, dev, published, ours = e
        try:
            st = step_time(simulate(model, layout, **sim), dev, planner=False)
        except ValueError as err:
            cannot.append((run.id, f"the fake world refused it: {err}"))
            continue
        value = getattr(st, ours)
        rows.append({"id": run.id, "layout": layout.label(), "device": dev, "published": published, "ours": value,
                     "compared": ours, "rel_err": value / published - 1, "step_s": st.step_s})
    errs = [abs(r["rel_err"]) for r in rows]
    return {"rows": rows, "cannot": cannot, "n": len(rows), "within_15pct": sum(e <= 0.15 for e in errs),
            "max_rel_err": max(errs) if errs else math.nan}


# ---- more micro-batches from one trace (12.2.2, P.13) ------------------------------------------------

def phase_flops(phase: dict) -> float:
    """FLOPs of one phase of a trace (matrix multiplies ``2 batch M N K``, the FLOP table's ops as
    counted): what the rank's FLOP counter counted in it."""
    total = 0.0
    for key, count in phase["ops"].items():
        total += count * (2 * key[1] * key[2] * key[3] * key[4] if key[0] == "mm" else key[1])
    return total


def with_micro_batches(step, micro_batches: int):
    """``step`` (a :class:`helpers.fake_world.FakeStep` with its op trace) as it would run with
    ``micro_batches`` micro-batches per step, more than it ran: its trace's steady 1F1B iteration
    (one forward and one backward) repeated, as :func:`helpers.fake_world.simulate` itself extends
    a shortened trace, so that one trace gives a sweep of micro-batch counts (12.2.2: the bubble
    against m; P.13: strong scaling at a fixed global batch); an interleaved trace by whole rounds
    of PP x V steady iterations (:func:`_with_rounds`: m stays a multiple of PP). The timing trace,
    the micro-batch count and the FLOPs change; the memory peak and the ``comm`` table stay the
    traced step's."""
    from dataclasses import replace

    from .. import validate

    m = validate.integer_at_least(micro_batches, "micro_batches", 1)
    if getattr(step, "timing", None) is None:
        raise ValueError("this FakeStep has no op trace: simulate(..., timing=True) records one")
    if m < step.micro_batches:
        raise ValueError(f"micro_batches must be at least the traced step's {step.micro_batches}, got {m}: "
                         "a trace can be extended, not cut")
    if m == step.micro_batches:
        return step
    if step.layout_spec is not None and step.layout_spec.v > 1:
        return _with_rounds(step, m)
    kinds = [p["kind"] for p in step.timing]
    warm = kinds[:kinds.index("B")].count("F") - 1  # forwards before the first backward, less the steady one
    if step.micro_batches < warm + 3:
        raise ValueError(f"the trace's {step.micro_batches} micro-batches have no steady iteration to repeat "
                         f"(needs at least {warm + 3}): simulate more micro-batches")
    extra = m - step.micro_batches
    phases = repeat_steady(step.timing, warm + 1, warm + 2, extra)
    at = [j for j, p in enumerate(step.timing) if p["kind"] == "F" and p["i"] in (warm + 1, warm + 2)]
    added = extra * sum(phase_flops(p) for p in step.timing[at[0]:at[1]])
    return replace(step, timing=phases, micro_batches=m, flops=step.flops + added)


def _with_rounds(step, m: int):
    """:func:`with_micro_batches` for an interleaved 1F1B trace: whole rounds of PP x V steady
    iterations (the period of the order, PP more micro-batches each) repeated, the round that
    :func:`helpers.fake_world.simulate` itself repeats (the second: no first forward or backward of a
    micro-batch, no chunk's last backward)."""
    from dataclasses import replace

    from ..pipeline_schedule import interleaved_unit, interleaved_warmup

    p, v, m0 = step.layout_spec.pp, step.layout_spec.v, step.micro_batches
    if (m - m0) % p:
        raise ValueError(f"interleaved 1F1B runs a multiple of PP = {p} micro-batches: {m} is not")
    warm, rnd = interleaved_warmup(p, m0, v, step.coords["pp"]), p * v
    if m0 == p or 2 * rnd + warm >= m0 * v:
        raise ValueError(f"the trace's {m0} micro-batches have no steady round of PP x V = {rnd} iterations between "
                         f"the first and the last to repeat (needs {3 * p if warm < rnd else 4 * p}): simulate more "
                         "micro-batches")
    at = lambda k: next(j for j, ph in enumerate(step.timing)
                        if (ph["kind"], ph.get("c"), ph["i"]) == ("F", *interleaved_unit(p, v, k, True)))
    a, b = at(rnd + warm), at(2 * rnd + warm)
    times = (m - m0) // p
    added = times * sum(phase_flops(ph) for ph in step.timing[a:b])
    return replace(step, timing=repeat_phases(step.timing, a, b, times), micro_batches=m, flops=step.flops + added)
