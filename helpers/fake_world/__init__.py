"""The chapters' scale with PyTorch's own code: one rank of a fake world of up to 16,384 ranks,
on one CPU (12.1.1, 12.1.2, 12.2.1, 12.3.1, 12.3.2, 12.4.1, 12.4.2, P.11).

:func:`simulate` runs one training step of rank r of a W-rank job, as PyTorch would run it on a
GPU cluster, in this one process, and returns what that rank holds, sends and computes
(:class:`FakeStep`):

* the process group is torch's ``"fake"`` backend (:func:`fake_world`): one process plays rank r
  of W; every collective is dispatched (so it is recorded with its group and shapes) but moves
  no data;
* tensors are ``FakeTensorMode`` tensors: shapes, dtypes and devices, no storage; a 405B model's
  stage costs no memory;
* the step is :mod:`helpers.fake_world.step`'s: a Llama-style decoder (:mod:`helpers.fake_world.llama_model`, dims
  from the planner's :class:`~helpers.planner.Model`) parallelised with ``init_device_mesh``,
  ``parallelize_module`` (+ sequence parallelism), ``fully_shard`` / ``replicate`` (ZeRO 0-3, see
  that module for which API stands for which stage), K/V all-gather context parallelism, a
  pipeline stage with only its own layers in 1F1B order (or, with ``Layout(v=v)``, v chunks per
  rank in Megatron-LM's interleaved 1F1B order: see below), BF16 compute with FP32 master state,
  forward, backward and the AdamW step;
* measured with ``MemTracker`` (peak bytes by category; every allocation and free it sees is
  replayed through :mod:`helpers.fake_world.allocator`'s model of the CUDA caching allocator, for
  the peak *reserved* bytes a GPU would hold), :class:`helpers.launcher.commlog.CommLog` (every
  collective and send/recv with payload and ring-model bytes; its counts agree with PyTorch's
  ``CommDebugMode``, a test checks) and ``FlopCounterMode``.

Values are meaningless under fake tensors; shapes, counts and bytes are exact, and the tests
check them equal to real gloo ranks running the same code with real tensors.

**Context parallelism**: torch's ``context_parallel`` (``torch.distributed.tensor.experimental``)
replaces only the CUDA attention kernels (flash, efficient, cuDNN); the CPU kernel these fake
tensors run is not among them, so it would silently compute local attention. The model instead
all-gathers K and V over the CP group itself, as Llama 3 did, with torch's functional
collectives: memory and traffic are those of the mechanism; the load-balanced causal mask is not
applied (values are meaningless here anyway).

**Tracing cost, and what is extrapolated** (a trace costs about 0.1-0.3 s per layer forward or
backward per micro-batch here, whatever the layer's size). Identical layers give identical
per-layer figures, so ``trace_layers=k`` (k >= 2: FSDP holds two layers' weights at once, one
prefetched) traces the stage with k, k + 1 and k + 2 layers, checks that the peak of each part of
each phase lies on a line in every category (else it moves the window up: the peak may still be
moving from one point of the step to another) and extrapolates every figure (each part's peak by
category, every collective's count and bytes, FLOPs) linearly to the stage's real layer count; the
step's peak is the largest part's. A part is a stretch of a phase (forward, backward, optimizer
step) before, inside or after the stage's blocks: a phase's peak can move from one part to another
as layers are added (the embedding's FP32 gradient at the end of a short stage's backward, the
logits' gradient and every layer's activations at its start, which grow faster), and each part's
own peak stays on its line where the phase's does not (12.4.1's 70B under ZeRO-1: the backward's
peak on a line at 2, 3 and 4 layers put 80 layers at 83.90 GB, the parts 84.03 GB; the same
model cut to 10 layers and traced whole holds 16.17 GB, the phase's line said 16.04 and the parts'
say 16.17; ``tests/test_fake_world.py`` checks a small case against a full trace). Of a long run of steady 1F1B
iterations (or of gradient-accumulation micro-batches without a pipeline) three are traced; the
others repeat the second one's communication and FLOPs. A long 1F1B warm-up (stage s of PP holds
PP - s micro-batches at the peak) is traced as warm-ups of 1, 2 and 3 and scaled the same way in
the micro-batches in flight (checked on a line, the window moved up if not), where that costs less
than tracing it whole: Llama 3 405B's first stage (PP 16, 7 layers, a warm-up of 15) in 126 layer
passes instead of 224, exact against its whole trace part by part. (Before the parts, the phases'
peaks were 0.8% low there, and the warm-up was traced whole.) The peak reserved is not on a line in
the layers (it jumps with each segment the allocator takes): the scaled peak plus the largest
margin the traced layer counts showed (``_reserve_at``: within 5% of full traces measured). The
other extrapolations are exact when each phase's peak stays at the same point of the schedule;
the tests check them equal to a trace of everything. Extrapolation is used only where it costs less than one trace of everything
(``extrapolate="always"`` forces it). A configuration that would still trace more than
``max_layer_passes`` layer passes is refused, with the way out (``trace_layers``).

**Interleaved 1F1B** (``Layout(pp=p, v=v)``, v >= 2; Narayanan et al. 2021): pipeline rank d holds
v chunks, virtual stages d, d + p, ..., d + (v - 1) p, of ``model.layers / (p v)`` layers each (or
``stages=``, p v counts: e.g. ``uneven_stages(layers, p * v)``), the embedding on virtual stage 0,
the final norm and head on the last; each chunk is its own tree of FSDP units and has its own
AdamW optimizer, as torchtitan builds its model parts. Activations go from chunk c of rank d to
chunk c of rank d + 1, and from rank p - 1's chunk c to rank 0's chunk c + 1 (gradients back).
The order is Megatron-LM's (:func:`helpers.pipeline_schedule.interleaved_steps`: warm-up
(p - d - 1) 2 + (v - 1) p forwards of one chunk each, all of them when m = p; m a multiple of p),
its sends and receives batched as Megatron does (:func:`helpers.pipeline_parallel.run_steps`).
``trace_layers=k`` traces the largest chunk with k, k + 1 and k + 2 layers and every other chunk
with as many fewer; the warm-up is traced whole, and of the steady iterations (a forward and a
backward of one chunk each) whole rounds of p v, the period of the order, are extrapolated: 3p
micro-batches are traced (4p when the warm-up is p v or longer), and the round between the
first and the last, which holds no first forward and no last backward of a chunk, stands for the
rounds left out.

**Measurement caveats handled here** (each measured on this machine): ``MemTracker`` counted the
tensors of DTensor's sharding propagation under an outer ``FakeTensorMode`` (a whole unsharded
copy of the model during a foreach optimizer step), the received-gradient buffers kept by
``FlopCounterMode``'s module tracker, a leaf input kept alive by its ModTracker hooks, gloo's
scratch on its own threads and a CPU kernel's internal scratch; :mod:`helpers.fake_world.step` says
how each is avoided.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from .. import torch_private, validate
from ..launcher.commlog import ring_bytes_sent
from ..pipeline_schedule import interleaved_unit, interleaved_warmup
from ..planner import Layout, Model
from ..torch_private import PINNED_TORCH  # noqa: F401 (helpers.fake_world.PINNED_TORCH, as before)
from . import memo
from . import progress as progress_
from . import timing as timing_

MAX_LAYER_PASSES = 300  # default refusal limit
SECONDS_PER_PASS = 0.15  # one layer's forward or backward for one micro-batch, traced (2-core machine, under load)
PASSES_PER_TRACE = 15  # a trace's own cost (building the stage, its optimizer's first step) in layer passes


def fake_store_class():
    """torch's ``FakeStore`` (private: ``torch.testing._internal.distributed.fake_pg``; through
    :mod:`helpers.torch_private`, which says what moved if the installed torch lacks it)."""
    return torch_private.get("FakeStore")


@contextmanager
def fake_world(world_size: int, rank: int = 0):
    """Make this process rank ``rank`` of a fake ``world_size``-rank process group; torn down on exit,
    also on error. Refuses to run if a process group is already initialised here (a real job's
    ranks must not be replaced by a fake one)."""
    import torch.distributed as dist

    world_size = validate.integer_at_least(world_size, "world_size")
    rank = validate.integer_at_least(rank, "rank", 0)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process: the fake world runs only "
                           "in a process without one (e.g. the notebook kernel, not inside a launched rank)")
    FakeStore = fake_store_class()
    _clear_dtensor_caches()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        _clear_dtensor_caches()


def _clear_dtensor_caches():
    """DTensor caches sharding decisions keyed by specs whose meshes compare equal across worlds;
    a cached entry from an earlier (destroyed) world would name its dead process groups."""
    torch_private.clear_dtensor_caches()


# ---- the layout, checked before anything is traced ------------------------------------------------

def uneven_stages(layers: int, pp: int) -> list:
    """Llama 3's uneven pipeline: one layer fewer on the first and the last stage (they also hold
    the embedding and the output head). 126 layers on 16 stages: [7, 8 x 14, 7]. Under interleaved
    1F1B pass the virtual stages, PP x V: 126 layers on 16 x 2 give [3, 4 x 30, 3]."""
    validate.integer_at_least(pp, "pp", 3)
    if (layers + 2) % pp:
        raise ValueError(f"layers + 2 = {layers + 2} must be a multiple of PP = {pp} for one layer fewer on the first and last stage")
    k = (layers + 2) // pp
    return [k - 1] + [k] * (pp - 2) + [k - 1]


def check(model: Model, layout: Layout, world_size: int | None = None, stages=None,
          checkpoint_every: int | None = None) -> list:
    """Every constraint the fake world needs, as a ValueError naming it; returns the layer count
    of each pipeline stage (of each virtual stage, PP x V, under interleaved 1F1B: virtual stage
    c x PP + d is chunk c of pipeline rank d). ``checkpoint_every``: :func:`simulate`'s per-layer
    selective recomputation (``recompute="selective"`` without it: per op)."""
    if not isinstance(model, Model):
        raise TypeError(f"model must be a helpers.planner.Model, got {type(model).__name__}")
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a helpers.planner.Layout, got {type(layout).__name__}")
    degrees = {"DP": layout.dp, "TP": layout.tp, "PP": layout.pp, "CP": layout.cp}
    if world_size is not None:
        validate.product_is(degrees, validate.integer_at_least(world_size, "world_size"), "the world size")
    if model.experts or model.attention_params:
        raise ValueError("only dense decoders with standard attention are built (no experts, no latent attention)")
    if layout.ep > 1:
        raise ValueError("expert parallelism (ep > 1) is not simulated")
    if layout.recompute not in ("none", "full", "selective"):
        raise ValueError(f"recompute={layout.recompute!r} is not traced: 'none', 'full' or 'selective'")
    if checkpoint_every is not None:
        if layout.recompute != "selective":
            raise ValueError(f"checkpoint_every needs recompute='selective', got recompute={layout.recompute!r}")
        validate.integer_at_least(checkpoint_every, "checkpoint_every", 1)
    t = layout.tp
    validate.divides(t, model.heads, "TP must divide the attention heads")
    validate.divides(t, model.kv, "TP must divide the KV heads")
    validate.divides(t, model.ffn, "TP must divide the FFN width")
    if model.vocab:
        validate.divides(t, model.vocab, "TP must divide the vocabulary")
    if layout.cp > 1:
        validate.divides(2 * layout.cp, model.seq_len, "2 x CP must divide the sequence (load-balanced chunks)")
    local = model.seq_len // layout.cp
    if layout.sequence_parallel and t > 1:
        validate.divides(t, local, "TP must divide each CP rank's sequence (sequence parallelism)")
    n, what = layout.pp * layout.v, "PP" if layout.v == 1 else f"PP x V = {layout.pp} x {layout.v}"
    if stages is None:
        validate.divides(n, model.layers, f"{what} must divide the layers (or give stages=..., e.g. uneven_stages)")
        stages = [model.layers // n] * n
    stages = [validate.integer_at_least(k, "layers of a stage") for k in stages]
    if len(stages) != n or sum(stages) != model.layers:
        raise ValueError(f"stages must give {what} = {n} layer counts summing to the {model.layers} layers, got {stages}")
    return stages


# ---- the result ------------------------------------------------------------------------------------

@dataclass
class FakeStep:
    """What one rank holds, sends and computes in one training step (bytes, FLOPs, seconds).

    ``memory``: bytes at the peak by category (parameters, gradients, optimizer, activations,
    temporaries, other) and ``total`` (allocated: the bytes of live tensors); ``peak_reserved``:
    the caching allocator's peak reserve for the same allocations and frees (``reserve``: its
    figures, :mod:`helpers.fake_world.allocator`; with ``trace_layers``, the extrapolated peak
    plus the largest margin of the traced layer counts, see ``_reserve_at``); ``held``: bytes held after the optimizer step (the model
    state between steps); ``comm``: one row per collective kind and mesh axis (dp, tp, cp, pp,
    dp_cp) with the group size, calls, payload bytes and ring-model bytes sent; ``flops``: FLOPs of the step on this rank; ``wall_s``: seconds the
    simulation took (every trace together); ``per_layer`` and ``per_layer_comm`` (with
    ``trace_layers``): what one more layer of the stage adds to each memory category at the peak,
    and to the step's collectives (the rows that change). Under interleaved 1F1B
    ``stage_layers`` counts the layers of all the rank's chunks, and ``per_layer`` is what one
    more layer in every chunk adds (v layers); ``timing``'s forward and backward phases carry
    their chunk, ``c``."""

    model: str
    layout: str
    world_size: int
    rank: int
    coords: dict
    stage_layers: int
    layers_traced: tuple
    micro_batches: int
    micro_batches_traced: int
    memory: dict
    held: dict
    comm: list
    flops: float
    wall_s: float
    notes: list = field(default_factory=list)
    per_layer: dict | None = None
    per_layer_comm: list | None = None
    timing: list | None = None  # the op trace by phase, for helpers.fake_world.timing.step_time
    model_spec: Model | None = None
    layout_spec: Layout | None = None
    # the CUDA caching allocator's view (helpers.fake_world.allocator): peak reserved bytes
    # (torch.cuda.max_memory_reserved) and reserve = {peak_allocated (block sizes, as
    # max_memory_allocated), peak_requested, peak_reserved, segments}
    peak_reserved: int | None = None
    reserve: dict | None = None

    @property
    def peak_bytes(self) -> float:
        return self.memory["total"]

    def comm_by_kind(self, axis: str | None = None) -> dict:
        """kind -> {calls, bytes, model_sent} summed over the mesh axes (or on ``axis`` only),
        leaving out groups of one rank (which send nothing)."""
        out = {}
        for r in self.comm:
            if r["group_size"] < 2 or (axis is not None and r["axis"] != axis):
                continue
            row = out.setdefault(r["kind"], {"calls": 0, "bytes": 0, "model_sent": 0.0})
            for k in ("calls", "bytes", "model_sent"):
                row[k] += r[k]
        return out

    def bytes_sent(self) -> float:
        """Ring-model bytes this rank sends in the step (P.7's cost of each collective; sends exact)."""
        return sum(r["model_sent"] for r in self.comm)


def comm_rows(ops) -> list:
    """(kind, payload bytes, group size, mesh axis) of each call -> rows per (kind, axis, group size)."""
    rows = {}
    for kind, nbytes, g, axis in ops:
        row = rows.setdefault((kind, axis, g), {"kind": kind, "axis": axis, "group_size": g, "calls": 0, "bytes": 0,
                                                "model_sent": 0.0})
        row["calls"] += 1
        row["bytes"] += nbytes
        row["model_sent"] += ring_bytes_sent(kind, nbytes, g)
    return [rows[k] for k in sorted(rows)]


# ---- running it ------------------------------------------------------------------------------------

def _micro_batches(layout, global_batch, micro_batches) -> int:
    if micro_batches is not None:
        return validate.integer_at_least(micro_batches, "micro_batches")
    if global_batch is not None:
        validate.divides(layout.dp * layout.micro_batch, validate.integer_at_least(global_batch, "global_batch"),
                         "DP x micro-batch must divide the global batch")
        return global_batch // (layout.dp * layout.micro_batch)
    return layout.pp


def _warm(layout, stage_index, m):
    """Warm-up forwards of pipeline rank ``stage_index``: 1F1B's, or interleaved 1F1B's (of one chunk
    and micro-batch each)."""
    if layout.v > 1:
        return interleaved_warmup(layout.pp, m, layout.v, stage_index)
    return min(layout.pp - stage_index - 1, m)


@dataclass(frozen=True)
class TracePlan:
    """What :func:`simulate` will trace for one rank: its stage, the stage's layers, the layer
    counts traced, the 1F1B warm-up lengths traced (the stage's own, traced whole, or 1, 2 and 3,
    scaled: :func:`plan_trace`), the
    steady 1F1B iterations traced (of ``micro_batches - warm-up``), and the layer passes (forward
    or backward of one layer for one micro-batch) all the traces cost together.

    Under interleaved 1F1B (``v`` chunks): ``chunk_layers`` gives each chunk's layers and
    ``layers`` the largest of them, the count the traces vary (every chunk is traced with as many
    layers fewer); the warm-up and the steady iterations count forwards (and backwards) of one
    chunk and micro-batch each; ``micro_batches`` traced are a multiple of PP."""

    stage: int
    layers: int
    layer_counts: tuple
    warmups: tuple
    steady: int
    micro_batches: int
    passes: int
    v: int = 1
    chunk_layers: tuple = ()

    def traced_micro_batches(self, warm: int) -> int:
        return (warm + self.steady) // self.v

    def traced_chunk_layers(self, n_layers: int) -> tuple:
        """Each chunk's layers in a trace of ``n_layers`` (of the largest chunk)."""
        return tuple(k - (self.layers - n_layers) for k in self.chunk_layers)


def plan_trace(model, layout, stages, rank, m, trace_layers, extrapolate: bool = True) -> TracePlan:
    """Which traces :func:`simulate` runs (module docstring: ``trace_layers`` and warm-ups).
    ``extrapolate``: True, where it costs less than tracing everything; "always"; or False, one
    trace of every layer and micro-batch."""
    from .step import coords

    s = coords(rank, layout)["pp"]
    if layout.v > 1:
        return _plan_interleaved(layout, stages, s, m, trace_layers, extrapolate)
    n = stages[s]
    w = _warm(layout, s, m)
    _check_extrapolate(extrapolate, trace_layers)
    if not extrapolate:
        return TracePlan(s, n, (n,), (w,), m - w, m, 2 * n * m)
    k = trace_layers
    counts = (n,) if k is None or k + 2 >= n else (k, k + 1, k + 2)
    steady = min(m - w, 3)
    # a long 1F1B warm-up may be traced as warm-ups of 1, 2 and 3 and scaled in the micro-batches in
    # flight (each part's peak is on a line in them: Llama 3 405B's first stage, PP 16, traced with
    # warm-ups of 1 to 3 and 15; tests/test_fake_world.py checks a small one against a full trace):
    # the cheapest of these plans is taken, each trace's own cost counted ("always": the most scaled)
    options = [(counts, (w,))]
    if w >= 4:
        options += [(counts, (1, 2, 3))] + ([((n,), (1, 2, 3))] if counts != (n,) else [])
    passes_of = lambda opt: 2 * sum(c * (v + steady) for c in opt[0] for v in opt[1])
    cost = lambda opt: passes_of(opt) + PASSES_PER_TRACE * (len(opt[0]) * len(opt[1]) - 1)
    counts, warms = options[1 if w >= 4 else 0] if extrapolate == "always" else min(options, key=cost)
    passes = passes_of((counts, warms))
    if extrapolate != "always" and cost((counts, warms)) >= 2 * n * m:
        return TracePlan(s, n, (n,), (w,), m - w, m, 2 * n * m)  # extrapolating would not be cheaper
    return TracePlan(s, n, counts, warms, steady, m, passes)


def _check_extrapolate(extrapolate, trace_layers):
    if extrapolate not in (True, False, "always"):
        raise ValueError(f"extrapolate must be True, False or 'always', got {extrapolate!r}")
    if trace_layers is not None:
        if not extrapolate:
            raise ValueError("trace_layers needs extrapolate=True")
        validate.integer_at_least(trace_layers, "trace_layers", 2)


def _plan_interleaved(layout, stages, s, m, trace_layers, extrapolate) -> TracePlan:
    """:func:`plan_trace` under interleaved 1F1B. The traced micro-batches are a multiple of PP (the
    schedule needs it) with the real warm-up (the same for any m >= 2 PP) and at least one round
    of steady iterations (PP x V forward/backward pairs: chunk c's forward and chunk c''s backward
    of PP micro-batches each, the period of the order) that neither holds a micro-batch's first
    forward or backward nor a chunk's last backward: 3 PP micro-batches, or 4 PP when the warm-up
    is a round or longer. The others repeat it (:func:`_one_trace`)."""
    p, v = layout.pp, layout.v
    chunks = tuple(stages[c * p + s] for c in range(v))
    top, least = max(chunks), min(chunks)
    w = _warm(layout, s, m)
    _check_extrapolate(extrapolate, trace_layers)
    whole = TracePlan(s, top, (top,), (w,), m * v - w, m, 2 * sum(chunks) * m, v, chunks)
    if not extrapolate:
        return whole
    k = trace_layers
    # each chunk keeps at least 2 layers (FSDP holds two layers' weights at once, one prefetched)
    counts = (top,) if k is None or k + 2 >= top or k - (top - least) < 2 else (k, k + 1, k + 2)
    mt = m if m < 2 * p else min(m, (3 if w < p * v else 4) * p)
    passes = 2 * mt * sum(sum(whole.traced_chunk_layers(c)) for c in counts)
    if extrapolate != "always" and passes + PASSES_PER_TRACE * (len(counts) - 1) >= whole.passes:
        return whole  # extrapolating would not be cheaper
    return TracePlan(s, top, counts, (w,), mt * v - w, m, passes, v, chunks)


def _one_trace(model, layout, stages, plan, n_layers, warm, options, meshes, timing=True):
    """Trace the plan's stage with ``n_layers`` layers (of each chunk: as many fewer as the largest
    has), warm-up ``warm`` and the plan's steady iterations; communication and FLOPs with all the
    steady iterations of the real schedule (the ones not traced are copies of the second one; under
    interleaving, of the second round of PP x V)."""
    from .step import measured_step

    mt = plan.traced_micro_batches(warm)
    extra = (plan.micro_batches * plan.v - _warm(layout, plan.stage, plan.micro_batches)) - plan.steady
    st = list(stages)
    if plan.v == 1:
        st[plan.stage] = n_layers
    else:
        for c, k in enumerate(plan.traced_chunk_layers(n_layers)):
            st[c * layout.pp + plan.stage] = k
    sub = replace(model, layers=sum(st), n_params=0.0)
    r = measured_step(sub, layout, st, mt, fake=True, boundaries=extra > 0, warm=warm if plan.v == 1 else None,
                      meshes=meshes, op_log=timing_.OpLog() if timing else None, **options)
    ops, flops = list(r["ops"]), r["flops"]
    trace = timing_.trace_phases(r["op_log"], ops) if timing else None
    if extra > 0:
        idx = {(k, c, i): j for j, (k, c, i, _, _) in enumerate(r["marks"])}
        if plan.v == 1:
            first, second, times = ("F", 0, warm + 1), ("F", 0, warm + 2), extra
        else:  # the forwards that open the steady rounds 2 and 3 (interleaved_unit's k-th forward)
            rnd = layout.pp * plan.v
            first = ("F", *interleaved_unit(layout.pp, plan.v, rnd + warm, True))
            second = ("F", *interleaved_unit(layout.pp, plan.v, 2 * rnd + warm, True))
            times = extra // rnd
        a, b = r["marks"][idx[first]], r["marks"][idx[second]]
        ops += ops[a[3]:b[3]] * times
        flops += (b[4] - a[4]) * times
        if timing:
            at = lambda mark: next(j for j, p in enumerate(trace) if (p["kind"], p.get("c", 0), p["i"]) == mark)
            trace = timing_.repeat_phases(trace, at(first), at(second), times)
    return {"memory": r["peak"], "phases": r["part_phases"], "held": r["held"], "comm": comm_rows(ops), "flops": flops,
            "coords": r["coords"], "timing": trace, "reserve": r["reserve"]}


def _line(a, b, x0, x):
    """Value at x on the line through (x0, a) and (x0 + 1, b); integers stay integers."""
    v = a + (x - x0) * (b - a)
    return round(v) if isinstance(a, int) and isinstance(b, int) else v


def _comm_line(ca, cb, x0, x):
    ka = {(r["kind"], r["axis"], r["group_size"]): r for r in ca}
    kb = {(r["kind"], r["axis"], r["group_size"]): r for r in cb}
    zero = {"calls": 0, "bytes": 0, "model_sent": 0.0}
    out = []
    for key in sorted(set(ka) | set(kb)):
        x1, y1 = ka.get(key, zero), kb.get(key, zero)
        out.append({"kind": key[0], "axis": key[1], "group_size": key[2], **{f: _line(x1[f], y1[f], x0, x) for f in zero}})
    return out


def _reserve_at(peak: int, traced: list, segments: int, margins: dict | None = None) -> dict:
    """The caching allocator's figures at the stage's layer count, from its requested ``peak``
    (extrapolated) and the replays of the ``traced`` layer counts: the peak plus the largest margin
    any of them showed (``peak_allocated - peak_requested``: block rounding and unsplit remainders;
    ``peak_reserved - peak_requested``: free bytes cached in segments at the reserve's peak);
    ``segments``: the most segments held, extrapolated by the caller.

    The margins are not put on a line: they jump when a segment is taken or reused (a small model
    of 2 to 8 layers: 42, 41, 54, 53, 48, 47, 46 MiB; Llama 3.1 70B's published FSDP 32 x TP 8
    run traced with 2, 3, 4 layers: 11.7, 11.5, 13.2 GiB, and 12.6 GiB with all 80), and a line
    through two of them multiplies one jump by the layers left (about 70 GiB for that 70B). Their
    steady growth is lost: Llama 3.1 8B at 32K tokens (FSDP 8, full recomputation) gains
    0.19 GiB per layer (12.1-12.5 GiB at 2-4 layers, 16.9 GiB at 32). Against full traces the
    reserve came out 1.2-3.5% high and 2.3% low on five small models
    (tests/test_fake_world_allocator.py bounds it by 4%), 0.9% high for that 70B (70.6 against
    69.9 GiB) and 4.8% low for that 8B (81.8 against 85.9 GiB).

    In the micro-batches of a 1F1B warm-up the margins do grow on a line (each micro-batch in flight
    brings as many segments: Llama 3 405B's first stage, warm-ups of 1, 2, 3: 6,159,075,072,
    6,318,860,032, 6,478,644,992 bytes reserved over requested, 159,784,960 apart; put on their line,
    the 8K layout's reserve at 15 is its full trace's 141.64 GB, where the largest margin said
    139.73): ``margins`` gives them, extrapolated by the caller, where they were on their line."""
    margin = lambda key: margins[key] if margins else max(r[key] - r["peak_requested"] for r in traced)
    return {"peak_allocated": peak + margin("peak_allocated"), "peak_requested": peak,
            "peak_reserved": peak + margin("peak_reserved"), "segments": segments}


def _collinear(a, b, c) -> bool:
    """Whether three traces' peaks lie on a line: each part's (forward, backward, optimizer step,
    each before, inside and after the stage's blocks) peak, every category."""
    return all(b[ph][x] - a[ph][x] == c[ph][x] - b[ph][x] for ph in a for x in a[ph])


def _run_plan(model, layout, stages, plan, options, timing=True, progress=None):
    """Run the traces of ``plan`` (in the current fake world) and extrapolate to the real stage:
    every figure linearly in the layers. Each trace runs the stage's whole 1F1B warm-up (the
    plan's one warm-up length, :func:`plan_trace`) and the plan's steady iterations; the steady
    iterations not traced are added by :func:`_one_trace`.

    An extrapolation is used only where the peak has stopped moving: three layer counts k, k+1,
    k+2 are traced and the peak of each part of each phase (forward, backward, optimizer step;
    before, inside and after the blocks) must lie on a line in every category; if not, the window
    moves up one layer (up to 3 times). With a line,
    ``per_layer`` is what one more layer adds to each memory category at the peak. ``options``:
    :func:`helpers.fake_world.step.measured_step`'s (dropout, reduce_dtype, reshard_after_forward)."""
    from .step import make_mesh

    meshes = make_mesh(layout)  # once: the traces differ in layers and micro-batches, not in ranks
    counts, warms = list(plan.layer_counts), list(plan.warmups)
    runs = {}

    def run(c, v):
        if (c, v) not in runs:
            # how many traces this plan runs at least (3 layer counts, or one of the whole stage); the
            # window may slide up to 3 times more (settle)
            label = (f"trace {len(runs) + 1} of {max(len(runs) + 1, len(plan.layer_counts))} ({c} of the "
                     f"{'stage' if plan.v == 1 else 'largest chunk'}'s {plan.layers} layers)")
            with progress_.reporting(progress, label, plan.traced_micro_batches(v)):
                runs[(c, v)] = _one_trace(model, layout, stages, plan, c, v, options, meshes, timing)
        return runs[(c, v)]

    def settle(points, make, limit, what):
        """Slide a window of three points up until the peak's categories lie on a line."""
        for _ in range(3):
            if _collinear(*(make(x)["phases"] for x in points)) or points[-1] + 1 >= limit:
                break
            points = points[1:] + [points[-1] + 1]
        if not _collinear(*(make(x)["phases"] for x in points)):
            raise ValueError(f"the peak of stage {plan.stage} still moves as {what} are added ({points} traced): "
                             f"trace more (a larger trace_layers) or everything (extrapolate=False)")
        return points[1:]

    if len(counts) == 3:
        counts = settle(counts, lambda c: run(c, warms[0]), plan.layers, "layers")
    k, w = counts[0], _warm(layout, plan.stage, plan.micro_batches)
    if len(warms) == 3:
        warms = settle(warms, lambda v: run(counts[-1], v), w, "warm-up micro-batches")

    phase_line = lambda a, b, x0, x: {ph: {c: _line(a[ph][c], b[ph][c], x0, x) for c in a[ph]} for ph in a}

    def in_layers(v, n):
        a = run(counts[0], v)
        if len(counts) == 1:
            return a
        b = run(counts[1], v)
        return {"phases": phase_line(a["phases"], b["phases"], k, n),
                "held": {c: _line(a["held"][c], b["held"][c], k, n) for c in a["held"]},
                "comm": _comm_line(a["comm"], b["comm"], k, n), "flops": _line(a["flops"], b["flops"], k, n),
                "coords": a["coords"],
                "timing": a["timing"] and timing_.line(a["timing"], b["timing"], k, n)}

    def warm_margins():
        """The allocator's margins (reserved and allocated over requested; the largest over the traced
        layer counts) on their line in the warm-up's micro-batches, where the three traced warm-ups
        put them on one; else None (the largest margin of every trace, :func:`_reserve_at`)."""
        out = {}
        for key in ("peak_allocated", "peak_reserved"):
            at_v = [max(run(c, v)["reserve"][key] - run(c, v)["reserve"]["peak_requested"] for c in counts)
                    for v in (warms[0] - 1, warms[0], warms[1])]
            if at_v[1] - at_v[0] != at_v[2] - at_v[1]:
                return None
            out[key] = _line(at_v[1], at_v[2], warms[0], w)
        return out

    def segments(v, n):
        if len(counts) == 1:
            return run(counts[0], v)["reserve"]["segments"]
        return _line(*(run(c, v)["reserve"]["segments"] for c in counts), k, n)

    def at(n):
        out = in_layers(warms[0], n)
        if len(warms) == 2:  # and on a line in the warm-up's micro-batches (the step's held state is theirs)
            hi, x0 = in_layers(warms[1], n), warms[0]
            out = {"phases": phase_line(out["phases"], hi["phases"], x0, w), "held": out["held"],
                   "comm": _comm_line(out["comm"], hi["comm"], x0, w), "flops": _line(out["flops"], hi["flops"], x0, w),
                   "coords": out["coords"], "timing": hi["timing"] and timing_.with_warmup(hi["timing"], w)}
        # the step's peak: the largest of its parts' peaks, each extrapolated on its own line
        out["memory"] = max(out["phases"].values(), key=lambda snap: snap["total"])
        if len(counts) == 2 or len(warms) == 2:  # what the allocator adds to the extrapolated peak (_reserve_at)
            seg, margins = segments(warms[0], n), None
            if len(warms) == 2:
                seg = _line(seg, segments(warms[1], n), warms[0], w)
                margins = warm_margins()
            out["reserve"] = _reserve_at(out["memory"]["total"], [r["reserve"] for r in runs.values()], seg, margins)
        return out

    out = at(plan.layers)
    out["per_layer"], out["per_layer_comm"] = None, None
    out["layer_counts"], out["warmups"] = tuple(counts), tuple(warms)
    if len(counts) == 2:
        below = at(plan.layers - 1)
        out["per_layer"] = {c: out["memory"][c] - below["memory"][c] for c in below["memory"]}
        out["per_layer_comm"] = [{**r, **{f: r[f] - b[f] for f in ("calls", "bytes", "model_sent")}}
                                 for r, b in zip(out["comm"], below["comm"]) if r["calls"] != b["calls"]]
    return out


def simulate(model: Model, layout: Layout, *, rank: int = 0, world_size: int | None = None, global_batch: int | None = None,
             micro_batches: int | None = None, stages=None, trace_layers: int | None = None, dropout: bool = False,
             extrapolate: bool | str = True, reduce_dtype: str = "float32", reshard_after_forward: str = "default",
             checkpoint_every: int | None = None, loss_dtype: str = "float32", optimizer: str = "for-loop",
             max_layer_passes: int = MAX_LAYER_PASSES, timing: bool = True, progress=None) -> FakeStep:
    """One training step of rank ``rank`` of the ``layout.devices``-rank job, on a fake world.

    ``micro_batches`` per step (default: ``global_batch / (DP x micro-batch)`` when a global batch
    is given, else PP, enough to fill the pipeline; a multiple of PP under interleaving);
    ``stages``: layers per pipeline stage when PP does not divide the layers (e.g.
    :func:`uneven_stages`), per virtual stage (PP x V of them) under interleaved 1F1B
    (``layout.v > 1``, module docstring); ``trace_layers=k``: trace k, k + 1
    and k + 2 layers of the stage and scale (module docstring); ``dropout``: dropout after attention and
    MLP (GPT, Korthikanti et al.), off for Llama; ``reduce_dtype``: the dtype gradients are reduced
    (and, under ZeRO-1, accumulated) in, FP32 by default as in torchtitan, "bfloat16" as the
    chapters assume; ``reshard_after_forward``: ZeRO-3's policy, which ``fully_shard`` units keep
    their weights from forward to backward (:data:`helpers.fake_world.step.RESHARD_POLICIES`; the
    default keeps the root and the last block, as torchtitan did until July 2025 (its 0.3.0 wraps the
    embedding apart and keeps only the final norm and head: benchmarks/torchtitan_compare.py); "always" reshards every
    unit; refused under ZeRO 0-2, which reshard none); ``checkpoint_every=k`` with
    ``recompute="selective"``: per-layer selective recomputation, every k-th block of the stage
    checkpointed (the k-th, 2k-th, ...: torchtitan's ``selective_ac_option="k"``);
    ``recompute="selective"`` without ``checkpoint_every``: per-op selective recomputation, every
    block checkpointed with torchtitan's ``selective_ac_option="op"`` policy (the outputs of its
    matmuls but every second one, of attention and of the reduce-scatters saved, the rest
    recomputed: :func:`helpers.fake_world.recipes.op_sac_context_fn`; not Korthikanti's policy,
    which the planner's ``"selective"`` models); ``loss_dtype``: the dtype of the last stage's
    cross-entropy, ``"float32"`` (logits upcast first, as torchtitan does: the default, as the
    fake world always traced it) or ``"bfloat16"``; ``optimizer``: AdamW's implementation,
    ``"for-loop"`` (one parameter at a time: the default, which the notebooks' figures were
    measured with; its temporaries, about two of the largest parameter shard, are the smallest a
    real run has short of fused), ``"foreach"`` (the multi-tensor kernels: torchtitan's default in
    2024, its temporaries one FP32 copy of the stage's second moments) or ``"fused"`` (torchtitan's
    default since 2025: no temporaries) (:data:`helpers.fake_world.recipes.OPTIMIZERS`; the step's
    temporaries are counted under ``optimizer``, with the moments);
    ``timing``: record every op's shapes, FLOPs and bytes by phase of the schedule, for
    :func:`step_time` (``FakeStep.timing``; None without); ``progress``: None, or a callable given a
    line at each micro-batch, direction and (every 0.2 s at most) layer of each trace
    (:mod:`helpers.fake_world.progress`: e.g. :func:`helpers.plots.progress`, which shows it under
    the controls that asked). Under the test suite (``WORKBOOK_FAKE_WORLD_MEMO``) a call without
    ``progress`` made before in the same run is answered from :mod:`helpers.fake_world.memo`.
    """
    from .step import check_reshard

    stages = check(model, layout, world_size, stages, checkpoint_every)
    if timing not in (True, False):
        raise ValueError(f"timing must be True or False, got {timing!r}")
    if reduce_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"reduce_dtype must be 'float32' or 'bfloat16', got {reduce_dtype!r}")
    from .recipes import LOSS_DTYPES, OPTIMIZERS

    validate.one_of(loss_dtype, "loss_dtype", LOSS_DTYPES)
    validate.one_of(optimizer, "optimizer", tuple(OPTIMIZERS))
    check_reshard(reshard_after_forward, layout)
    progress_.check_progress(progress)
    world = layout.devices
    rank = validate.integer_at_least(rank, "rank", 0)
    if rank >= world:
        raise ValueError(f"rank must be in [0, {world}) for DP x TP x PP x CP = {world}, got {rank}")
    m = _micro_batches(layout, global_batch, micro_batches)
    if layout.pp > 1 and m < layout.pp:
        raise ValueError(f"{m} micro-batches cannot fill PP = {layout.pp} stages (1F1B needs m >= PP)")
    if layout.v > 1 and m % layout.pp:
        raise ValueError(f"interleaved 1F1B (v = {layout.v}) needs the micro-batches to be a multiple of PP = "
                         f"{layout.pp} (Megatron-LM's schedule), got {m}")
    plan = plan_trace(model, layout, stages, rank, m, trace_layers, extrapolate)
    if plan.passes > max_layer_passes:
        raise ValueError(
            f"tracing would cost {plan.passes} layer passes (layers {plan.layer_counts} x up to "
            f"{plan.traced_micro_batches(max(plan.warmups))} micro-batches, forward and backward) > "
            f"max_layer_passes={max_layer_passes} (about {plan.passes * SECONDS_PER_PASS:.0f} s here): "
            + ("pass trace_layers=2 (identical layers give identical per-layer figures: 2, 3 and 4 layers are traced "
               f"and scaled exactly to the stage's {plan.layers}), or " if trace_layers is None else "")
            + "raise max_layer_passes")
    memo_key = None
    if memo.folder() is not None:  # the suite's: each configuration traced once per run (helpers.fake_world.memo)
        memo_key = memo.key(model, layout, rank, world, m, stages, trace_layers, dropout, extrapolate, reduce_dtype,
                            reshard_after_forward, checkpoint_every, loss_dtype, optimizer, timing)
        kept = memo.load(memo_key) if progress is None else None
        if kept is not None:
            return kept
    t0 = time.perf_counter()
    with fake_world(world, rank):
        res = _run_plan(model, layout, stages, plan, {"dropout": dropout, "reduce_dtype": reduce_dtype,
                                                       "reshard_after_forward": reshard_after_forward,
                                                       "checkpoint_every": checkpoint_every,
                                                       "loss_dtype": loss_dtype, "optimizer": optimizer},
                       timing, progress)
    notes = []
    if len(res["layer_counts"]) == 2 and plan.v == 1:
        notes.append(f"traced {res['layer_counts'][0] - 1} to {res['layer_counts'][1]} of the stage's {plan.layers} "
                     f"layers (the peak on a line from {res['layer_counts'][0]}); per-layer figures scaled to {plan.layers}")
    elif len(res["layer_counts"]) == 2:
        notes.append(f"traced {res['layer_counts'][0] - 1} to {res['layer_counts'][1]} layers of the largest of the "
                     f"rank's {plan.v} chunks ({list(plan.chunk_layers)} layers), the others as many fewer (the peak on "
                     f"a line from {res['layer_counts'][0]}); figures scaled to the chunks' layers, per_layer: one more "
                     "layer in every chunk")
    w = _warm(layout, plan.stage, m)
    if len(res["warmups"]) == 2:
        notes.append(f"traced 1F1B warm-ups of {res['warmups'][0] - 1} to {res['warmups'][1]} micro-batches (each part's "
                     f"peak on a line from {res['warmups'][0]}); scaled to the stage's {w}")
    if len(res["layer_counts"]) == 2 and len(res["warmups"]) == 1:
        notes.append("peak reserved: the scaled peak plus the largest margin (reserve over the peak) of the traced "
                     "layer counts, not scaled (within 5% of full traces measured; see _reserve_at)")
    elif len(res["warmups"]) == 2:
        notes.append("peak reserved: the scaled peak plus the margin (reserve over the peak) of the traced warm-ups on "
                     "its line in them where the three were on one, else their largest (see _reserve_at)")
    mts = {plan.traced_micro_batches(max(res["warmups"]))}
    steady = m * layout.v - _warm(layout, plan.stage, m)
    if plan.steady < steady and layout.v == 1:
        notes.append(f"traced {plan.steady} of {steady} steady 1F1B iterations; the others added from a measured one")
    elif plan.steady < steady:
        notes.append(f"traced {plan.steady} of {steady} steady interleaved 1F1B iterations (a forward and a backward "
                     f"of one chunk each); the others added from a measured round of PP x V = {layout.pp * layout.v}")
    step = FakeStep(model=model.name, layout=layout.label(), world_size=world, rank=rank, coords=res["coords"],
                    stage_layers=plan.layers if layout.v == 1 else sum(plan.chunk_layers),
                    layers_traced=res["layer_counts"], micro_batches=m,
                    micro_batches_traced=max(mts), memory=res["memory"], held=res["held"], comm=res["comm"],
                    flops=res["flops"], wall_s=time.perf_counter() - t0, notes=notes, per_layer=res["per_layer"],
                    per_layer_comm=res["per_layer_comm"], timing=res["timing"], model_spec=model, layout_spec=layout,
                    peak_reserved=res["reserve"]["peak_reserved"], reserve=res["reserve"])
    if memo_key is not None:
        memo.store(memo_key, step)
    return step


def step_time(step: FakeStep, device: str = "h100_sxm", **options):
    """Step time, tokens/s/GPU, MFU and its breakdown on ``device`` from ``step``'s trace:
    :func:`helpers.fake_world.timing.step_time` (its docstring gives the options)."""
    return timing_.step_time(step, device, **options)
