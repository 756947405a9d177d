"""One training step of one rank, written with PyTorch's own parallelism APIs (used by
:mod:`helpers.fake_world`, which runs it on a fake world, and by its tests, which run the same code
on real gloo ranks).

:func:`build` turns a :class:`helpers.planner.Model` and :class:`~helpers.planner.Layout` into this
rank's :class:`StageParts`: its pipeline stage (:class:`helpers.fake_world.llama_model.Stage`; with
``layout.v > 1`` its v chunks, :class:`Chunk`, for interleaved 1F1B) parallelised on a
4-D ``DeviceMesh`` (dims ``dp, pp, cp, tp``, outermost first: Llama 3's order, TP innermost), on
the meta device; :meth:`StageParts.materialize` gives it (fake or real) storage and its AdamW
optimizer; :func:`run_step` runs one step in 1F1B order (the order of
:func:`helpers.pipeline_schedule.one_f_one_b`, run by :func:`helpers.pipeline_parallel.run_schedule`;
interleaved: :func:`helpers.pipeline_schedule.interleaved_steps`, run by
:func:`helpers.pipeline_parallel.run_steps`);
:func:`measured_step` does all three and measures the step. Which API stands for which ZeRO
stage (``Layout.zero``), each with BF16 compute and FP32 master state
(``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``), AdamW:

* **ZeRO-0** (DDP): ``replicate`` (``torch.distributed._composable.replicate_with_fsdp``,
  PyTorch's DDP on FSDP2's machinery: FP32 parameters and gradients on every rank, gradients
  all-reduced once per step, after the last micro-batch);
* **ZeRO-1**: ``fully_shard(reshard_after_forward=False)`` with gradient reduction deferred to the
  last micro-batch (``set_requires_gradient_sync``) and parameters kept unsharded through the
  step (``set_reshard_after_backward``): the BF16 weights and the accumulated gradients are whole
  during the step, only the FP32 master and the moments stay sharded. With one micro-batch per
  step FSDP2 frees each layer's whole gradient as soon as it is reduce-scattered, so this is
  ZeRO-2's memory. (The classic PyTorch ZeRO-1, ``ZeroRedundancyOptimizer`` over
  ``DistributedDataParallel``, cannot run here: DDP's C++ reducer needs real storage under
  ``FakeTensorMode``, and ``ZeroRedundancyOptimizer`` broadcasts plain tensors, not the DTensor
  parameters of tensor parallelism.)
* **ZeRO-2**: ``fully_shard(reshard_after_forward=False)`` (FSDP's SHARD_GRAD_OP; Llama 3's
  "do not reshard after forward"): weights gathered once per step and kept, gradients
  reduce-scattered every micro-batch;
* **ZeRO-3**: ``fully_shard`` (FULL_SHARD): weights gathered for each layer's forward and again
  for its backward, every micro-batch; which units are kept unsharded from their forward to their
  backward is the policy :data:`RESHARD_POLICIES` names (``reshard_after_forward``): by default the
  stage's root (embedding, final norm, output head: FSDP2's own rule for the root) and its last
  block (whose backward comes first: torchtitan's default without a pipeline, until July 2025).

Sharding is over the DP x CP ranks (CP ranks hold the same weights). Tensor parallelism is
``parallelize_module`` with :func:`helpers.fake_world.llama_model.tp_plan`; context parallelism all-gathers
K and V (Llama 3); pipeline stages exchange activations with ``batch_isend_irecv``.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..launcher.commlog import _FUNCTIONAL, CommLog, record_call
from ..pipeline_parallel import run_schedule, run_steps
from ..pipeline_schedule import interleaved_steps, interleaved_warmup, one_f_one_b
from ..torch_private import (
    FUNCTIONAL_NAMESPACE,
    adam_init_state,
    flatten_mesh,
    restart_peak,
    swap_propagation_lock,
)
from .llama_model import Stage, stage_layer_ids, tp_plan
from .recipes import loss, make_optimizer, op_sac_context_fn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

MESH_DIMS = ("dp", "pp", "cp", "tp")
# ZeRO-3's reshard-after-forward policy: the fully_shard units kept unsharded from forward to backward
RESHARD_POLICIES = {
    "default": "the root (embedding, final norm, output head) and the last block kept; the other blocks resharded",
    "root": "only the root kept (fully_shard's reshard_after_forward=None: FSDP2 keeps the root)",
    "always": "every unit resharded after forward, the root included (torchtitan's 'always')",
}
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries", "other")
_MEMTRACKER_KEYS = {"Parameter": "parameters", "Buffer": "parameters", "Gradient": "gradients", "Optstate": "optimizer",
                    "Activation": "activations", "Temp": "temporaries", "Other": "other"}


def coords(rank: int, layout) -> dict:
    """This rank's coordinate on each mesh dim (dp, pp, cp, tp; tp varies fastest)."""
    out, r = {}, rank
    for name in reversed(MESH_DIMS):
        size = getattr(layout, name)
        out[name] = r % size
        r //= size
    return out


def make_mesh(layout, device: str = "cpu") -> tuple:
    """The 4-D ``DeviceMesh`` (dp, pp, cp, tp) of ``layout`` and its data-parallel mesh (DP x CP
    flattened when CP > 1): FSDP shards over the ranks that hold the same weights."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device, tuple(getattr(layout, n) for n in MESH_DIMS), mesh_dim_names=MESH_DIMS)
    return mesh, (flatten_mesh(mesh["dp", "cp"], "dp_cp") if layout.cp > 1 else mesh["dp"])


@dataclass
class Chunk:
    """One pipeline stage this rank holds: its one stage under plain 1F1B, one of its ``v`` chunks
    under interleaved 1F1B (chunk ``index`` of pipeline rank d is virtual stage ``index * PP + d``).

    ``stage``: the parallelised :class:`helpers.fake_world.llama_model.Stage`, its own tree of
    FSDP units (as torchtitan shards each model part); ``virtual``: its virtual stage;
    ``layer_ids``: the model's layers it holds; ``prev`` / ``next``: the rank holding the same
    (dp, cp, tp) coordinates of the previous / next virtual stage (under interleaving the last
    pipeline rank's chunk c hands on to the first rank's chunk c + 1), None on the first / last."""

    stage: Stage
    index: int
    virtual: int
    layer_ids: list
    prev: int | None
    next: int | None

    @property
    def first(self) -> bool:
        return self.prev is None

    @property
    def last(self) -> bool:
        return self.next is None


@dataclass
class StageParts:
    """This rank's part of the job, made by :func:`build` and given storage by :meth:`materialize`.

    ``chunks``: its pipeline stage, or its ``v`` chunks under interleaved 1F1B (:class:`Chunk`, on
    the meta device until :meth:`materialize`); ``mesh``: the 4-D ``DeviceMesh`` (dp, pp, cp,
    tp); ``dp_mesh``: the mesh FSDP shards over (dp, or dp x cp flattened); ``coords``: this rank's
    coordinate on each mesh dim; ``sp``: sequence parallelism on (the activations handed between
    stages are split along the sequence over TP). Set by :meth:`materialize`: ``anchor``, the
    scalar where every received activation's graph ends (:class:`_StageInput`), and ``opts``, one
    AdamW optimizer per chunk (torchtitan's ``OptimizersContainer``: one per model part)."""

    chunks: list
    mesh: DeviceMesh
    dp_mesh: DeviceMesh
    coords: dict
    sp: bool
    anchor: torch.Tensor | None = None
    opts: list | None = None

    @property
    def layer_ids(self) -> list:
        """The model's layers this rank holds, chunk by chunk."""
        return [i for ch in self.chunks for i in ch.layer_ids]

    def modules(self) -> list:
        return [ch.stage for ch in self.chunks]

    def materialize(self, init: bool, optimizer: str = "for-loop") -> None:
        """Give the chunks' (sharded) parameters storage on the CPU (fake tensors under
        ``FakeTensorMode``), initialise them if ``init`` (real runs), and create each chunk's AdamW
        optimizer (``optimizer``: its implementation, :data:`helpers.fake_world.recipes.OPTIMIZERS`)
        with its moments as a first step would make them (through the optimizer's own state
        initialisation, which the first step runs: :func:`helpers.torch_private.adam_init_state`),
        so the measured step is a steady-state step."""
        for stage in self.modules():
            stage.to_empty(device="cpu")
        params = [list(stage.parameters()) for stage in self.modules()]
        if init:
            with torch.no_grad():
                for p in (p for ps in params for p in ps):
                    p.normal_(0.0, 0.02)
        self.anchor = torch.zeros((), requires_grad=True)  # see _StageInput
        self.opts = [make_optimizer(ps, optimizer) for ps in params]
        for p in (p for ps in params for p in ps):  # the state is made for the parameters that have a gradient
            p.grad = torch.zeros_like(p)
        for opt in self.opts:
            adam_init_state(opt)
            opt.zero_grad(set_to_none=True)


def check_reshard(policy: str, layout) -> str:
    """``policy`` if it is one of :data:`RESHARD_POLICIES` that ``layout`` honours, else a
    ValueError naming it: only ZeRO-3 reshards after forward (ZeRO 0-2 keep every unit's weights
    from forward to backward), so a policy other than the default is refused there."""
    if policy not in RESHARD_POLICIES:
        raise ValueError(f"reshard_after_forward must be one of {sorted(RESHARD_POLICIES)}, got {policy!r}")
    if policy != "default" and layout.zero != 3:
        raise ValueError(f"reshard_after_forward={policy!r} needs ZeRO-3: ZeRO-{layout.zero} keeps every unit's "
                         "weights from forward to backward")
    return policy


def build(model, layout, stages: list, *, dropout: bool = False, reduce_dtype: str = "float32",
          meshes=None, reshard_after_forward: str = "default", checkpoint_every: int | None = None,
          sac_log: list | None = None) -> StageParts:
    """This rank's stage, or its ``layout.v`` chunks, on the meta device, each parallelised as
    torchtitan does a model part (TP, activation checkpointing when ``layout.recompute == "full"``,
    then FSDP/replicate per block and for the chunk). ``stages``: the layer count of each (virtual)
    stage, PP x V of them. Call inside the process group (fake or real), outside
    ``FakeTensorMode`` (the mesh reads its rank grid). ``meshes``: :func:`make_mesh`'s, to reuse (a
    16,384-rank mesh takes seconds to build); ``reshard_after_forward``: ZeRO-3's policy, one of
    :data:`RESHARD_POLICIES` (per chunk: its root and its last block kept by default);
    ``recompute="selective"``: with ``checkpoint_every=k``, every k-th block of the rank checkpointed
    (per layer; counted over its chunks in order, as torchtitan's counter runs on over the model
    parts); without, every block checkpointed with torchtitan's per-op policy
    (:func:`helpers.fake_world.recipes.op_sac_context_fn`); ``sac_log``: the per-op policy's
    decisions, appended to this list."""
    rank = dist.get_rank()
    c = coords(rank, layout)
    mesh, dp_mesh = meshes or make_mesh(layout)
    ids = stage_layer_ids(model.layers, stages)
    p, v, stride = layout.pp, layout.v, layout.cp * layout.tp
    sp = layout.sequence_parallel and layout.tp > 1
    counted = [0]  # blocks seen so far (per-layer selective checkpointing counts over the chunks)
    chunks = []
    for k in range(v):
        s = k * p + c["pp"]
        # the rank of virtual stage s +- 1: pipeline rank (s +- 1) % PP, the same dp, cp, tp
        peer = lambda t: rank + ((t % p) - c["pp"]) * stride
        stage = _build_chunk(model, layout, mesh, dp_mesh, ids[s], s == 0, s == p * v - 1, dropout, reduce_dtype,
                             reshard_after_forward, checkpoint_every, sac_log, sp, counted)
        chunks.append(Chunk(stage=stage, index=k, virtual=s, layer_ids=ids[s], prev=None if s == 0 else peer(s - 1),
                            next=None if s == p * v - 1 else peer(s + 1)))
    return StageParts(chunks=chunks, mesh=mesh, dp_mesh=dp_mesh, coords=c, sp=sp)


def _build_chunk(model, layout, mesh, dp_mesh, ids, first, last, dropout, reduce_dtype, reshard_after_forward,
                 checkpoint_every, sac_log, sp, counted) -> Stage:
    """One (virtual) stage of :func:`build`, parallelised; ``counted``: the blocks checkpointing has
    counted so far on this rank (updated)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cp_group = mesh["cp"].get_group() if layout.cp > 1 else None
    with torch.device("meta"):  # shapes only; storage comes with materialize()
        stage = Stage(model, ids, first, last, dropout=dropout, cp_group=cp_group)
    if layout.tp > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        top, block = tp_plan(stage, sp)
        for blk in stage.layers.values():
            parallelize_module(blk, mesh["tp"], block)
        if top:
            parallelize_module(stage, mesh["tp"], top)
    if layout.recompute in ("full", "selective"):  # keep a block's input only; recompute the rest in backward
        from ..torch_private import checkpoint_wrapper

        per_op = layout.recompute == "selective" and checkpoint_every is None
        every = 1 if layout.recompute == "full" or per_op else checkpoint_every
        extra = {"context_fn": op_sac_context_fn(sac_log)} if per_op else {}
        for name in list(stage.layers):
            counted[0] += 1
            if counted[0] % every == 0:  # the k-th, 2k-th, ... block (torchtitan's count)
                stage.layers[name] = checkpoint_wrapper(stage.layers[name], preserve_rng_state=False, **extra)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=getattr(torch, reduce_dtype))
    if layout.zero == 0:
        from ..torch_private import replicate

        wrap = lambda mod: replicate(mod, mesh=dp_mesh, mp_policy=mp)
    else:
        kept = {"default": {stage, list(stage.layers.values())[-1]}, "root": {stage},
                "always": set()}[check_reshard(reshard_after_forward, layout)]
        wrap = lambda mod: fully_shard(mod, mesh=dp_mesh, mp_policy=mp,
                                       reshard_after_forward=layout.zero == 3 and mod not in kept)
    for blk in stage.layers.values():
        wrap(blk)
    wrap(stage)
    return stage


def _exchange(sends=(), recvs=()):
    """One batch of point-to-point ops ((tensor, peer, tag) triples), waited for: a send and a
    receive in the same batch progress together (Megatron's send_forward_recv_backward), so 1F1B's
    neighbours never wait on each other's blocking send. The tag names the message (direction,
    receiving stage, micro-batch): with PP = 2 under interleaving both directions between two ranks
    carry activations and gradients at once, and gloo matches a receive by peer and tag."""
    ops = ([dist.P2POp(dist.isend, t, peer, tag=tag) for t, peer, tag in sends]
           + [dist.P2POp(dist.irecv, t, peer, tag=tag) for t, peer, tag in recvs])
    if ops:
        for w in dist.batch_isend_irecv(ops):
            w.wait()


class _StageInput(torch.autograd.Function):
    """Where a received activation enters a stage's graph: backward hands its gradient to
    ``grads`` (to be sent to the previous stage) instead of accumulating it in a leaf.

    A leaf input would do the same, but the hooks MemTracker's ModTracker registers
    (``register_multi_grad_hook``) form a reference cycle through C++ with the graph's nodes, which
    keep the leaf's gradient accumulator, and so the leaf, alive: one leaked activation per
    micro-batch. Here the graph ends at ``anchor``, a scalar shared by every micro-batch."""

    @staticmethod
    def forward(ctx, x, anchor, grads):
        ctx.grads = grads
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.grads.append(g)
        return None, None, None


class _StepOps:
    """One training step's ops on this rank's stage (or chunks), the steps of
    :func:`helpers.pipeline_parallel.run_schedule` (and ``run_steps``): the forward and backward of
    micro-batch i through chunk c (FSDP2's per-micro-batch switches set on the chunk before each
    backward) and the point-to-point hand-offs, each a batch of sends and receives waited for at
    once (:func:`_exchange`).

    ``held`` keeps the last activation received, activation sent, gradient received and gradient
    sent, each until the next of its kind replaces it (the received activation until the last
    forward), and until the step ends: the lifetimes of the hand-written 1F1B loop this replaced,
    with which the fake world's figures were measured (MemTracker counts what is alive; releasing
    one sooner could lower a phase's peak by an activation)."""

    def __init__(self, model, layout, parts: StageParts, m: int, mark, loss_dtype: str = "float32"):
        from torch.distributed.tensor.parallel import loss_parallel

        c, cp = parts.coords, layout.cp
        self.model, self.parts, self.m, self.mark, self.zero = model, parts, m, mark, layout.zero
        self.loss_dtype = loss_dtype
        self.b, self.s_local = layout.micro_batch, model.seq_len // cp
        self.s_act = self.s_local // layout.tp if parts.sp else self.s_local
        chunk = model.seq_len // (2 * cp)
        self.positions = (torch.cat([torch.arange(c["cp"] * chunk, (c["cp"] + 1) * chunk),
                                     torch.arange((2 * cp - 1 - c["cp"]) * chunk, (2 * cp - c["cp"]) * chunk)])
                          if cp > 1 else torch.arange(self.s_local))
        self.loss_context = loss_parallel if (layout.tp > 1 and model.vocab) else nullcontext
        self.inputs, self.outputs, self.grads = {}, {}, []
        self.held = dict.fromkeys(("F in", "F out", "B in", "B out"))
        self.stages = layout.pp * layout.v  # virtual stages, for the messages' tags
        self.last_forward = (layout.v - 1, m - 1)  # 1F1B's and interleaved 1F1B's last forward

    def _tag(self, kind: str, virtual: int, i: int) -> int:
        """The tag of the message that op (kind, virtual stage, micro-batch) receives."""
        return ((kind == "B") * self.stages + virtual) * self.m + i

    def p2p(self, sends, recvs):
        """Allocate a buffer for each receive (none for the first stage's F or the last's B), then
        send and receive in one batch: activations go to the next stage, gradients to the previous."""
        chunks = self.parts.chunks
        bufs = []
        for kind, c, _ in recvs:
            nothing = chunks[c].first if kind == "F" else chunks[c].last
            bufs.append(None if nothing else torch.empty(self.b, self.s_act, self.model.hidden, dtype=torch.bfloat16))
            self.held[kind + " in"] = bufs[-1]
        out = []
        for kind, c, i, t in sends:
            ch = chunks[c]
            to = ch.virtual + 1 if kind == "F" else ch.virtual - 1
            out.append((t, ch.next if kind == "F" else ch.prev, self._tag(kind, to, i)))
        _exchange(sends=out, recvs=[(x, chunks[c].prev if kind == "F" else chunks[c].next,
                                     self._tag(kind, chunks[c].virtual, i))
                                    for (kind, c, i), x in zip(recvs, bufs) if x is not None])
        return bufs

    def forward(self, c: int, i: int, x):
        """F of micro-batch i through chunk c: the tokens (first stage) or the received activation
        through it; the loss on the last stage, else the activation to send on."""
        model, p, ch = self.model, self.parts, self.parts.chunks[c]
        self.mark("F", i, c)
        if ch.first and model.vocab:
            x = torch.randint(0, model.vocab, (self.b, self.s_local))
        elif ch.first:  # hidden states in, as from an embedding: they need a gradient too, or FSDP
            # would reduce the first block's gradients only at the very end of backward
            x = _StageInput.apply(torch.randn(self.b, self.s_act, model.hidden), p.anchor, [])
        else:
            x = _StageInput.apply(x, p.anchor, self.grads)
        self.inputs[c, i] = x
        out = ch.stage(x, self.positions)
        if ch.last:
            with self.loss_context():
                labels = torch.randint(0, model.vocab, (self.b, self.s_local)) if model.vocab else None
                out = loss(out, labels, self.loss_dtype)
        self.outputs[c, i] = out
        self.held["F out"] = y = None if ch.last else out.detach()
        if (c, i) == self.last_forward:
            self.held["F in"] = None
        return y

    def backward(self, c: int, i: int, g):
        """B of micro-batch i through chunk c from the received gradient ``g`` (the loss on the last
        stage); returns the gradient of the chunk's input, to send back (None on the first stage)."""
        ch, m = self.parts.chunks[c], self.m
        stage = ch.stage
        self.mark("B", i, c)
        stage.set_is_last_backward(i == m - 1)
        if self.zero in (1, 2):
            stage.set_reshard_after_backward(i == m - 1)
        if self.zero in (0, 1):
            stage.set_requires_gradient_sync(i == m - 1)
        out = self.outputs.pop((c, i))
        if ch.last:
            with self.loss_context():
                out.backward()
        else:
            torch.autograd.backward(out, grad_tensors=g)
        self.inputs.pop((c, i))
        self.held["B out"] = dx = None if ch.first else self.grads.pop()
        return dx


def run_step(model, layout, parts: StageParts, m: int, *, on_boundary=None, warm: int | None = None,
             loss_dtype: str = "float32"):
    """One training step of this rank: ``m`` micro-batches in 1F1B order (warm-up forwards, steady
    forward/backward pairs, cool-down backwards, as Megatron's non-interleaved schedule) or, with
    ``layout.v > 1``, in Megatron's interleaved 1F1B order over the rank's chunks
    (:func:`helpers.pipeline_schedule.interleaved_steps`, run by
    :func:`helpers.pipeline_parallel.run_steps`), then the optimizer step (each chunk's).
    ``on_boundary(kind, i, c)`` (optional) is called before each forward ('F', i, c) and backward
    ('B', i, c) of micro-batch i through chunk c, before the optimizer step ('opt', m, 0) and at
    the end ('end', m, 0): :mod:`helpers.fake_world` reads its counters there. ``warm`` replaces
    the warm-up length (1F1B's, min(PP - stage - 1, m)): the fake world passes the one of the real
    step's m micro-batches, which its shortened traces (fewer steady iterations) keep whole; under
    interleaving a shortened trace keeps it without (refused). ``loss_dtype``: the dtype the last
    stage's loss is computed in (:func:`helpers.fake_world.recipes.loss`)."""
    mark = on_boundary or (lambda kind, i, c: None)
    ops = _StepOps(model, layout, parts, m, mark, loss_dtype)  # held until the step ends (see its ``held``)
    if layout.v == 1:
        run_schedule(one_f_one_b(layout.pp, m, parts.coords["pp"], warm=warm), ops, paired=True)
    elif warm is not None and warm != interleaved_warmup(layout.pp, m, layout.v, parts.coords["pp"]):
        raise ValueError(f"warm={warm}: an interleaved step runs its own warm-up, "
                         f"{interleaved_warmup(layout.pp, m, layout.v, parts.coords['pp'])} forwards")
    else:
        run_steps(interleaved_steps(layout.pp, m, layout.v, parts.coords["pp"]), ops)
    mark("opt", m, 0)
    for opt in parts.opts:
        opt.step()
    mark("end", m, 0)


def memtracker_class():
    """``MemTracker`` that ignores the tensors DTensor's sharding propagation creates.

    PyTorch's ``MemTracker`` skips DTensor's shape propagation by comparing the active fake mode
    with the one active when it was entered; under an outer ``FakeTensorMode`` the propagation runs
    in that same mode (``detect_fake_mode()`` returns it), and global-shape tensors, e.g. a whole
    unsharded copy of every parameter during a foreach optimizer step, are counted as memory. The
    propagation runs inside ``ShardingPropagator._fake_mode_lock``; :func:`measured_step` replaces
    that lock by a counter this tracker checks.

    Each byte in the category its name says (issue 26, defect 3). ``MemTracker`` files a tensor by
    when it is made (forward: activations, backward: temporaries) and moves it to gradients only
    when a hook shows it to be one; FSDP2's accumulated FP32 gradients (ZeRO-1's, made in backward)
    and the sharded gradients its reduce-scatter writes were never moved. :meth:`file_gradients`
    moves every gradient buffer at each phase boundary, and a move also corrects the peak recorded
    so far where the storage was alive at it (:meth:`_update_snap`): the peak's total is unchanged,
    its bytes are filed by what each storage turned out to be.

    Which code issued each collective (:attr:`fsdp_ops`, the indices of FSDP2's in the log): a
    collective is labelled by its issuer's mesh axis, not by its group object, which FSDP's DP x CP
    and CP share when DP = 1 (issue 26, defect 2).
    """
    from functools import partial
    from threading import get_ident

    from torch.distributed.tensor import DTensor

    from ..torch_private import (
        TOTAL_KEY,
        MemRefType,
        MemTracker,
        ModState,
        UpdateType,
        active_fake_mode,
        fsdp_gradient_buffers,
        fsdp_unsharded_params,
        tree_map_only,
    )

    created, resized, moved, deleted = UpdateType.ADD, UpdateType.SIZE, UpdateType.REF, UpdateType.DEL

    class _Tracker(MemTracker):
        _by_fqn, _by_fqn_len = None, -1

        def __init__(self):
            super().__init__()
            self._seq = 0  # storages created or resized so far: each one's number is its winfo.fw_seq
            self._peak_seq = {}  # device -> _seq when its peak was recorded: older storages were in it
            self.fsdp_ops = set()  # indices in comm_log.ops of the collectives FSDP2 issued
            self.alloc_events = []  # ("alloc", id, bytes) / ("free", id): for helpers.fake_world.allocator
            self._stale = True  # whether _update_peak_stats has work to do (see there)
            self._stale_state = None

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
            super()._update_snap(u_type, winfo, old_mem_consumed=old_mem_consumed, old_reftype=old_reftype)
            if u_type is not moved:
                self._record_alloc(u_type, winfo)
            if u_type is created or u_type is resized:
                winfo.fw_seq, self._seq = self._seq, self._seq + 1
                self._stale = True
            elif u_type is moved and getattr(winfo, "fw_seq", self._seq) < self._peak_seq.get(winfo.device, -1):
                # alive now and made before the peak was recorded: it was in the peak, under old_reftype
                peak = self._peak_mem_snap[winfo.device]
                peak[old_reftype] -= winfo.mem_consumed
                peak[winfo.reftype] = peak.get(winfo.reftype, 0) + winfo.mem_consumed

        def _record_alloc(self, u_type, winfo):
            """Every storage the tracker sees made, resized or freed, as the caching allocator would
            be asked: a new storage is one allocation; a resize (FSDP2 frees and refills its
            unsharded parameters with ``resize_``) allocates the new size, then frees the old
            block (as a copying resize does); the storage's death (the tracker's weakref
            finalizer) frees its block. An id is the event's index."""
            events, old, new = self.alloc_events, getattr(winfo, "alloc_id", None), None
            if u_type is not deleted and winfo.mem_consumed > 0:
                new = len(events)
                events.append(("alloc", new, winfo.mem_consumed))
            if old is not None:  # resized or freed: its block goes back
                events.append(("free", old))
            winfo.alloc_id = new

        def restart_peak(self):
            """Start the peak afresh from what is held now (each phase's peak on its own)."""
            restart_peak(self)
            self._peak_seq = dict.fromkeys(self._peak_mem, self._seq)
            self._stale = True

        def file_gathered_weights(self, module):
            """File FSDP2's gathered weights (its units' unsharded parameters) under parameters. A
            submodule's pre-forward hook files them when it runs, after FSDP2 has gathered them;
            a unit whose own module holds weights (torchtitan's separately wrapped embedding, say)
            has no such hook after the gather, and its gathered weights stayed where they were made,
            under activations (found beside torchtitan: 1002 MiB of Llama 3.1 8B's embedding;
            benchmarks/torchtitan_compare.py). Only storages the tracker already counts move."""
            for p in fsdp_unsharded_params(module):
                try:
                    self._update_and_maybe_create_winfos(p, MemRefType.PARAM, update_existing=True)
                except KeyError:  # not counted (no storage made in the tracked step): nothing to move
                    pass

        def file_gradients(self, module):
            """File every gradient buffer of ``module`` under gradients: the parameters' ``.grad``
            (the sharded ones FSDP2's reduce-scatter writes) and FSDP2's own (the FP32 gradients
            accumulated over micro-batches without a reduction, replicate's accumulated ones)."""
            grads = [p.grad for p in module.parameters() if p.grad is not None] + fsdp_gradient_buffers(module)
            for g in grads:
                self._update_and_maybe_create_winfos(g, MemRefType.GRAD)

        # (ids of the first blocks, ids of the last blocks, callback(part)): where a forward or
        # backward enters and leaves a chunk's blocks, set by _measure (the parts of a phase: "head",
        # "layers", "tail")
        block_bounds = None

        def _enter_part(self, module, part, first_or_last):
            b = self.block_bounds
            if b is not None and id(module) in b[first_or_last]:
                b[2](part)

        def _pre_fw_hook(self, module, inputs):
            if not self._mod_tracker.is_bw:  # (in backward: a checkpointed block recomputed)
                self._enter_part(module, "layers", 0)
            # a new micro-batch through the stage (the root): start its module stats afresh
            # (MemTracker refuses a second top-level call of a module; the peak is kept)
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                if set(self._mod_tracker.parents) - {self._mod_tracker.get_known_fqn(module)} == {"Global"}:
                    del self.memory_tracking[module]
            self._by_fqn = None  # memory_tracking and the modules' names change only here
            self._stale = True  # a module joined the active parents
            super()._pre_fw_hook(module, inputs)

        def _post_fw_hook(self, module, inputs, outputs):
            super()._post_fw_hook(module, inputs, outputs)
            if not self._mod_tracker.is_bw:
                self._enter_part(module, "tail", 1)

        def _pre_bw_hook(self, module, args):
            self._enter_part(module, "layers", 1)  # backward enters the blocks at the last one
            self._stale = True  # a module joined the active parents
            super()._pre_bw_hook(module, args)

        def _post_bw_hook(self, module, args):
            super()._post_bw_hook(module, args)
            self._enter_part(module, "tail", 0)

        def reset_mod_stats(self):
            self._by_fqn = None
            self._stale = True
            super().reset_mod_stats()

        def _update_peak_stats(self, peak_state):
            # MemTracker's own (torch 2.13.0, mem_tracker.py: _update_peak_stats, a private method)
            # runs after every op and walks every module it has seen (a WeakIdKeyDictionary whose
            # iteration costs a failing hasattr per module): O(ops x modules), a third of a trace.
            # The same updates, in the same state: the modules whose name is among the active
            # parents are looked up by name (an index rebuilt when memory_tracking changes), and
            # the snapshots (flat dicts of ints) are copied with dict() instead of deepcopy().
            # It changes nothing unless a storage was made or resized, a module joined the active
            # parents (ModTracker adds it just before the hooks above), the peak was restarted or
            # the state (forward, backward) changed since it last ran: every peak it keeps is at
            # least the total of then, which has not grown since, and is then skipped (most ops
            # make no storage: prim.device queries, the autograd engine's, are 60% of them).
            if not self._stale and peak_state is self._stale_state:
                return
            self._stale, self._stale_state = False, peak_state
            curr_snap = self._curr_mem_snap
            by_fqn = self._by_fqn
            if by_fqn is None or len(self.memory_tracking.data) != self._by_fqn_len:
                by_fqn = self._by_fqn = {}
                for mod_stats in self.memory_tracking.values():
                    by_fqn.setdefault(mod_stats.mod_fqn, []).append(mod_stats)
                self._by_fqn_len = len(self.memory_tracking.data)
            for fqn in self._mod_tracker.parents:
                for mod_stats in by_fqn.get(fqn, ()):
                    if peak_state in mod_stats.snapshots:
                        for dev, dev_snap in curr_snap.items():
                            if mod_stats.local_peak.get(dev, 0) < dev_snap[TOTAL_KEY]:
                                mod_stats.local_peak[dev] = dev_snap[TOTAL_KEY]
                                mod_stats.snapshots[peak_state][-1][dev] = dict(dev_snap)
            for dev, dev_snap in curr_snap.items():
                if self._peak_mem.get(dev, 0) < dev_snap[TOTAL_KEY]:
                    self._peak_mem[dev] = dev_snap[TOTAL_KEY]
                    self._peak_mem_snap[dev] = dict(dev_snap)
                    self._peak_seq[dev] = self._seq

        def __enter__(self):
            self._thread = threading.get_ident()
            out = super().__enter__()
            self._peak_seq = dict.fromkeys(self._peak_mem, self._seq)
            self._stale = True
            return out

        @classmethod
        def _should_skip_dynamo(cls):
            # no torch.compile runs under this mode: its __torch_dispatch__ need not be wrapped in
            # dynamo's disable (TorchDispatchMode.__init_subclass__, torch 2.13.0), a wrapper
            # that costs four eval-frame switches per op
            return False

        comm_log = None  # a CommLog this mode records in (for it: one dispatch mode fewer per op)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.comm_log is not None:  # what CommLog's own mode, just above this one, would do
                log = self.comm_log
                n = len(log.ops)
                record_call(log, func, args, kwargs or {})
                if len(log.ops) > n and _issued_by_fsdp():
                    self.fsdp_ops.update(range(n, len(log.ops)))
            # gloo runs collectives on its own threads, which inherit the dispatch modes: what it
            # allocates there is the backend's scratch (NCCL's never reaches PyTorch at all)
            if _PROPAGATING[0] or get_ident() != self._thread:
                return func(*args, **(kwargs or {}))
            # a view allocates nothing: a storage first seen through a view is a kernel's internal
            # scratch (the CPU fallback of FSDP's chunk_cat copy-in; the GPU kernel has none)
            if func.is_view and not any(issubclass(t, DTensor) for t in types):
                return func(*args, **(kwargs or {}))
            # MemTracker.__torch_dispatch__ (torch 2.13.0), inlined: the same steps in the same
            # order, without a second wrapped call per op; a single tensor output is tracked
            # directly (tree_map_only calls the same function on it)
            if any(t == DTensor for t in types):
                return NotImplemented
            if func is device_op and not self._stale:
                # a device query (most of them the autograd engine's): no storage to track, and
                # nothing for _update_peak_stats to do
                return func(*args, **(kwargs or {}))
            if func is wait_tensor and active_fake_mode():
                res = args[0]
            elif _backend_keeps(func) and not active_fake_mode():
                res = _collective_on_copies(func, args, kwargs or {})
            else:
                res = func(*args, **(kwargs or {}))
            if active_fake_mode() is self._fake_mode_on_entry:
                if self._in_opt:
                    reftype = MemRefType.OPT
                elif self._mod_tracker.is_bw and not self._in_ac:
                    reftype = MemRefType.TEMP
                else:
                    reftype = MemRefType.ACT
                if type(res) in _TENSOR_TYPES:
                    self._track(reftype, res)
                elif type(res) in (tuple, list) and all(type(x) in _TENSOR_TYPES for x in res):
                    for x in res:  # tree_map_only's order
                        self._track(reftype, x)
                elif res is not None:
                    tree_map_only(torch.Tensor, partial(self._track, reftype), res)
                self._update_peak_stats(ModState.PEAK_BW if self._mod_tracker.is_bw else ModState.PEAK_FW)
            return res

    from ..torch_private import FakeTensor, wait_tensor

    _TENSOR_TYPES = (torch.Tensor, FakeTensor)  # leaves of tree_map_only, exactly (no pytree node)
    device_op = torch.ops.prim.device.default
    return _Tracker


_PROPAGATING = [0]
_KEEPS: dict = {}
_FSDP_CODE = "torch.distributed.fsdp"  # FSDP2's package (fully_shard; replicate runs on its param groups)
_DTENSOR_CODE = "torch.distributed.tensor"  # DTensor's: tensor parallelism's collectives


def _issued_by_fsdp() -> bool:
    """Whether the collective being dispatched was issued by FSDP2 (its parameter all-gathers,
    gradient reduce-scatters and all-reduces): the innermost frame of FSDP2's or DTensor's code on
    the Python stack is FSDP2's. The model's own collectives (context parallelism's K/V gathers,
    their backward reduce-scatters, which autograd runs) have neither; DTensor's (tensor
    parallelism, also a partial TP gradient reduced when FSDP2 touches it) have DTensor's."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if name.startswith(_DTENSOR_CODE):
            return False
        if name.startswith(_FSDP_CODE):
            return True
        f = f.f_back
    return False


def _backend_keeps(func) -> bool:
    """Whether ``func`` is a functional collective (``_c10d_functional.*``: DTensor's, for TP and
    sequence parallelism, and loss_parallel's), whose input and output tensors a real gloo
    backend's worker thread keeps a moment after the caller's wait has returned.

    FSDP2's c10d ops (``c10d._allgather_base_``, ``c10d._reduce_scatter_base_``, waited on by
    FSDP2 itself) are left as they are: run at once on copies they changed the pipeline layout's
    measured peak. Their buffers can still be freed late (with rank 3's gloo threads starved, the
    32,896-byte reduce-scatter input of DP2 TP2 ZeRO-3 is, every run), after the peak so far."""
    keeps = _KEEPS.get(func)
    if keeps is None:

        keeps = _KEEPS[func] = func.namespace == FUNCTIONAL_NAMESPACE and func.__name__.split(".")[0] in _FUNCTIONAL
    return keeps


def _collective_on_copies(func, args, kwargs):
    """A functional collective on a real process group, run on untracked copies of its inputs and
    waited for at once; the result is returned as a tracked copy: the backend never holds a tensor
    the tracker counts.

    Without it the real step's peak depended on timing: gloo's worker thread holds each Work (and
    its tensors) until it has taken its lock again after waking the waiter, and when it was
    preempted there, a tensor the step had already dropped lived on into the next allocations and
    was freed later on that thread. Under load, rank 3 of DP2 TP2 ZeRO-3 measured 4,096 bytes of
    temporaries more than the fake world (one b x s x h BF16 activation gradient of a
    sequence-parallel block's backward); with its gloo threads at SCHED_IDLE (run only while the
    main thread waits) 2 runs in 3. The fake world's collectives end at once and hold nothing.
    Called inside the tracker's dispatch: the copies are neither tracked nor counted as FLOPs."""
    from ..torch_private import tree_flatten, tree_unflatten
    from ..torch_private import wait_tensor as wait

    flat, spec = tree_flatten((args, kwargs))
    a2, k2 = tree_unflatten([a.clone() if isinstance(a, torch.Tensor) else a for a in flat], spec)
    outs, out_spec = tree_flatten(func(*a2, **k2))
    return tree_unflatten([wait(t).clone() if isinstance(t, torch.Tensor) else t for t in outs], out_spec)


class _PropagationMarker:
    def __enter__(self):
        _PROPAGATING[0] += 1

    def __exit__(self, *exc):
        _PROPAGATING[0] -= 1
        return False


def flop_counter():
    """``FlopCounterMode`` for this rank's own work: the local ops of DTensors (PyTorch's counter
    sees a DTensor op with its global shapes first and counts it whole: TP x too many), without
    the module tracker (:class:`_NoModules`), and with the CPU attention kernels (PyTorch's table
    has only the CUDA ones; the formulas are PyTorch's own: full attention, as for causal)."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten

    def fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
        return sdpa_flop_count(query_shape, key_shape, value_shape)

    def bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
        return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

    from torch.distributed.tensor import DTensor

    from ..torch_private import (
        FlopCounterDispatchMode,
        HigherOrderOperator,
        count_flops,
        sdpa_flash_cpu,
        sdpa_flash_cpu_backward,
    )

    not_counted = frozenset({  # _FlopCounterMode.__torch_dispatch__'s (torch 2.13.0) set, built once
        aten.sym_is_contiguous.default, aten.is_contiguous.default, aten.is_contiguous.memory_format,
        aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default, aten.size.default,
        aten.sym_size.default, aten.stride.default, aten.sym_stride.default, aten.storage_offset.default,
        aten.sym_storage_offset.default, aten.numel.default, aten.sym_numel.default, aten.dim.default,
        torch.ops.prim.layout.default})
    device_op = torch.ops.prim.device.default
    implicit = torch._C.DispatchKey.CompositeImplicitAutograd
    has_implicit = {}

    def _decomposes(func) -> bool:
        """Whether ``func.decompose`` can return anything but NotImplemented (OpOverload.decompose,
        torch 2.13.0: a Python or a registered CompositeImplicitAutograd kernel): entering the mode
        again to try it costs more than the op, and most ops have neither."""
        if implicit in func.py_kernels:
            return True
        known = has_implicit.get(func)
        if known is None:
            known = has_implicit[func] = torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), implicit)
        return known

    class _LocalMode(FlopCounterDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            return False  # no torch.compile here: no dynamo-disable wrapper per op (see memtracker_class)

        # DTensor ops carry global shapes: let DTensor turn them into the local ops this rank runs
        # (counted then), and skip the global-shape ops of its sharding propagation
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented
            if _PROPAGATING[0] or func is device_op:  # a device query counts nothing and is not logged
                return func(*args, **(kwargs or {}))
            # then _FlopCounterMode.__torch_dispatch__ (torch 2.13.0), inlined step by step:
            # one Python call per op instead of two wrapped ones
            kwargs = kwargs if kwargs else {}
            if func in not_counted:
                return NotImplemented
            if isinstance(func, HigherOrderOperator):
                return self._handle_higher_order_ops(func, types, args, kwargs)
            counter = self.counter
            if func not in counter.flop_registry and _decomposes(func):
                with self:
                    r = func.decompose(*args, **kwargs)
                    if r is not NotImplemented:
                        return r
            out = func(*args, **kwargs)
            if counter.op_log is not None:  # each op's shapes, FLOPs and bytes (helpers.fake_world.timing)
                counter.op_log.record(func, args, out, counter.flop_registry)
            return count_flops(counter, func.overloadpacket, out, args, kwargs)

    class _Counter(FlopCounterMode):
        def __enter__(self):
            self.flop_counts.clear()
            self.mode = _LocalMode(self)
            self.mode.__enter__()
            return self

        def __exit__(self, *exc):
            self.mode.__exit__(*exc)
            self.mode = None
            return False

    counter = _Counter(display=False, custom_mapping={sdpa_flash_cpu: fwd, sdpa_flash_cpu_backward: bwd})
    counter.mod_tracker = _NoModules()
    counter.op_log = None  # an OpLog of helpers.fake_world.timing records every op it counts
    return counter


class _NoModules:
    """Stands in for FlopCounterMode's per-module breakdown (we need the total only). Its
    ModuleTracker hooks a pipeline stage's output with ``register_multi_grad_hook``, whose buffer
    keeps the gradient received from the next stage alive until the garbage collector finds the
    cycle: the memory measurement would count one received gradient per micro-batch."""

    parents = {"Global"}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def measured_step(model, layout, stages, m: int, *, fake: bool, dropout: bool = False, boundaries: bool = False,
                  warm: int | None = None, reduce_dtype: str = "float32", meshes=None,
                  reshard_after_forward: str = "default", checkpoint_every: int | None = None, op_log=None,
                  loss_dtype: str = "float32", optimizer: str = "for-loop", sac_log: list | None = None) -> dict:
    """Build this rank's stage, then run and measure one step: peak bytes by category (MemTracker),
    the model state held after the step, every collective (:class:`helpers.launcher.commlog.CommLog`),
    FLOPs (FlopCounterMode) and, with ``boundaries``, the counters at each micro-batch boundary;
    ``phases``: the peak of each phase (forward, backward, optimizer...), ``part_phases``: of each
    part of a phase (``"backward head"``, ``"backward layers"``, ``"backward tail"``: before, in
    and after the stage's blocks), which :mod:`helpers.fake_world` extrapolates.
    ``op_log`` (a :class:`helpers.fake_world.timing.OpLog`): records every op's shapes, FLOPs and
    bytes, by phase of the schedule; ``loss_dtype``, ``optimizer``, ``sac_log``: the recipe
    (:mod:`helpers.fake_world.recipes`). Runs in the current process group, fake or real."""
    saved_lock = swap_propagation_lock(_PropagationMarker())
    try:
        t0 = time.perf_counter()
        parts = build(model, layout, stages, dropout=dropout, reduce_dtype=reduce_dtype, meshes=meshes,
                      reshard_after_forward=reshard_after_forward, checkpoint_every=checkpoint_every,
                      sac_log=sac_log)
        mode = nullcontext()
        if fake:
            from ..torch_private import FakeTensorMode

            mode = FakeTensorMode(allow_non_fake_inputs=True)  # the meta parameters become fake
        with mode:
            return _measure(model, layout, parts, m, init=not fake, boundaries=boundaries, t0=t0, warm=warm,
                            op_log=op_log, loss_dtype=loss_dtype, optimizer=optimizer)
    finally:
        swap_propagation_lock(saved_lock)


def _measure(model, layout, parts, m, *, init, boundaries, t0, warm, op_log=None, loss_dtype="float32",
             optimizer="for-loop"):

    parts.materialize(init, optimizer)
    tracker = memtracker_class()()
    tracker.track_external(*parts.modules(), *parts.opts)
    flops = flop_counter()
    flops.op_log = op_log
    marks, phases, part_phases, current = [], {}, {}, ["start", "head"]

    def close_phase():
        """Keep the peak of the stretch since the last boundary under its kind (forward, backward,
        optimizer) and under its part of that kind (``"forward layers"``...: before the chunk's
        blocks, in them, after them), and start a new stretch: each part's peak grows linearly with
        the layers and the micro-batches in flight, and the step's peak is the largest of them
        (a kind's peak can move from one part to another as layers are added: the loss's logits
        at the start of a short stage's backward, the embedding's gradient at its end). The
        gradients made in the stretch are filed first (their bytes in the peak too)."""
        for stage in parts.modules():
            tracker.file_gathered_weights(stage)
            tracker.file_gradients(stage)
        snap = _categories(tracker.get_tracker_snapshot("peak"))
        for key, store in ((current[0], phases), (" ".join(current), part_phases)):
            if key not in store or snap["total"] > store[key]["total"]:
                store[key] = snap
        tracker.restart_peak()

    def enter_part(part):
        close_phase()
        current[1] = part

    # each chunk's first and last block: where its forward and backward enter and leave its blocks
    blocks = [list(stage.layers.values()) for stage in parts.modules()]
    tracker.block_bounds = ({id(b[0]) for b in blocks if b}, {id(b[-1]) for b in blocks if b}, enter_part)

    def mark(kind, i, c):
        close_phase()
        current[:] = [{"F": "forward", "B": "backward", "opt": "optimizer", "end": "end"}[kind], "head"]
        if op_log is not None:  # the chunk only under interleaving (a plain 1F1B trace's phases are as before)
            op_log.start(kind, i, len(log.ops), c if layout.v > 1 else None)
        if boundaries:
            marks.append((kind, c, i, len(log.ops), flops.get_total_flops()))

    # the tracker records the communication for the log (the same ops, in the same order, as a
    # CommLog mode between the FLOP counter and the tracker would see: that mode passes every op on)
    log = CommLog(record_comm=False)
    tracker.comm_log = log
    with tracker, log, flops:
        run_step(model, layout, parts, m, on_boundary=mark, warm=warm, loss_dtype=loss_dtype)
        close_phase()
    peak = max(phases.values(), key=lambda snap: snap["total"])
    held = _categories(tracker.get_tracker_snapshot("current"))
    reserve = _replay_allocations(tracker.alloc_events)
    axes, fsdp_axis = _axes(parts), parts.dp_mesh.mesh_dim_names[0]
    ops = [(o.op, o.bytes, o.group_size, fsdp_axis if i in tracker.fsdp_ops else axes.get(o.group, "?"))
           for i, o in enumerate(log.ops)]
    p2p = [(o.op, o.peer) for o in log.ops if o.op in ("send", "recv")]  # with the global rank at the other end
    return {"peak": peak, "phases": phases, "part_phases": part_phases, "held": held, "reserve": reserve, "ops": ops,
            "p2p": p2p, "op_log": op_log,
            "flops": flops.get_total_flops(), "marks": marks, "layers": len(parts.layer_ids),
            "coords": parts.coords, "wall_s": time.perf_counter() - t0}


def _replay_allocations(events) -> dict:
    """The step's allocations and frees (the tracker's, from the materialised model state on)
    through :mod:`helpers.fake_world.allocator`'s model of the CUDA caching allocator: peak
    allocated (block sizes), requested and reserved bytes, and the most segments held."""
    from .allocator import replay

    return replay(list(events)).as_dict()


def _axes(parts: StageParts) -> dict:
    """Process-group name -> the mesh axis it spans (dp, pp, cp, tp; "pp" for the point-to-point
    sends of the pipeline, which use the default group), and FSDP's group (dp_cp, DP x CP
    flattened) where no mesh axis spans it. For the collectives of everything but FSDP2: FSDP2's
    own are labelled with its axis (dp or dp_cp) whatever group object they use (:func:`_measure`),
    and with DP = 1 its dp_cp group is the cp group, which the K/V gathers use."""
    mesh = parts.mesh
    out = {dist.group.WORLD.group_name: "pp"}  # unless a mesh axis spans the whole world (and reuses it)
    for d in mesh.mesh_dim_names:
        if mesh.size(mesh.mesh_dim_names.index(d)) > 1 or mesh.get_group(d).group_name not in out:
            out[mesh.get_group(d).group_name] = d
    out.setdefault(parts.dp_mesh.get_group().group_name, parts.dp_mesh.mesh_dim_names[0])
    return out


def _categories(snapshot: dict) -> dict:
    out = dict.fromkeys(CATEGORIES, 0)
    for dev_snap in snapshot.values():
        for k, v in dev_snap.items():
            key = _MEMTRACKER_KEYS.get(getattr(k, "value", k))
            if key:
                out[key] += v
    out["total"] = sum(out[k] for k in CATEGORIES)
    return out


def worker(model, layout, stages, m: int, dropout: bool = False) -> dict:
    """:func:`measured_step` with real tensors on the launcher's ranks (the fake world's check):
    ``launch(worker, model, layout, stages, m, world_size=layout.devices, record=False)``."""
    torch.manual_seed(dist.get_rank())
    return measured_step(model, layout, stages, m, fake=False, dropout=dropout)
