"""ZeRO stages 1, 2 and 3 built by hand, and PyTorch's own ZeRO-1 and FSDP2 (12.1.2).

The public face of the section: import everything from here. The pieces live in modules that
each read in one sitting: :mod:`helpers.zero.reference` (torch-free: the bytes and collectives of
each stage; AdamW is elementwise, so ZeRO-1 on simulated devices equals DDP exactly:
:func:`adamw_numpy`, :func:`zero1_numpy`, :func:`ddp_numpy`), :mod:`helpers.zero.hand`
(:class:`HandZero`, one rank's state under a stage, and the model, data and sharding units it
uses) and this module (the workers and the checks of what they return).

The stages (0 = naive DDP by hand, 1, 2, 3) are described in :mod:`helpers.zero.hand`; here
:func:`zero_train_worker` trains with them on the launcher's ranks, on a small MLP with AdamW. The
workers measure the bytes each rank holds and return enough to rebuild the full parameters in
the parent (:func:`assemble`), so that no collective is spent on checking. The communication is
logged by the launcher (``run.comm``; :func:`per_step_comm` keeps what a training step issued).
References on the same data: :func:`ddp_reference_worker` (PyTorch DDP),
:func:`zero_redundancy_worker` (``ZeroRedundancyOptimizer``), :func:`fsdp2_worker` (``fully_shard``);
and :func:`identity_worker` (all-reduce = reduce-scatter + all-gather on the ranks).

Units: bytes throughout. The chapter's 2|θ| and 3|θ| are multiples of one copy of the
communicated parameters in bytes (count x bytes per element); per rank, a ring sends (M-1)/M of
that per reduce-scatter or all-gather (:func:`comm_bytes_per_rank`).
"""
from __future__ import annotations

from ..data_parallel import rank_rows
from ..launcher.commlog import span, summarize
from ..launcher.worker import device
from ..memory import tensor_bytes
from ..validate import equal_parts, integer_at_least, one_of
from .hand import (
    ADAMW,
    DEFAULT_SIZES,
    STAGE_PRECISIONS,
    HandZero,
    Unit,
    assemble,
    make_mlp,
    make_regression,
    max_abs_diff,
    moment_bytes,
    n_params,
)
from .reference import adamw_numpy, collectives_per_step, comm_bytes_per_rank, ddp_numpy, zero1_numpy

__all__ = [
    # zero_numpy
    "comm_bytes_per_rank", "collectives_per_step", "adamw_numpy", "ddp_numpy", "zero1_numpy",
    # zero_hand
    "DEFAULT_SIZES", "ADAMW", "STAGE_PRECISIONS", "make_mlp", "make_regression", "n_params", "Unit", "assemble",
    "max_abs_diff", "moment_bytes", "HandZero",
    # this module
    "zero_train_worker", "ddp_reference_worker", "zero_redundancy_worker", "fsdp2_worker", "per_step_comm",
    "assemble_dim0", "identity_worker",
]


def zero_train_worker(zero_stage: int, steps: int = 3, batch: int = 16, sizes=DEFAULT_SIZES, precision: str = "fp32",
                      micro_batches: int = 1, defer_reduce: bool = False, seed: int = 0):
    """Train with :class:`HandZero` on the launcher's ranks for ``steps`` steps (12.1.2).

    Each rank takes its ``batch / world`` rows of every (micro-)batch. ``micro_batches`` > 1
    accumulates gradients; with ``defer_reduce`` stage 2 reduces only in the last micro-batch's
    backward (the others keep full-size gradients). Each step runs inside ``span("step")``.

    Returns this rank's owned chunks (``"shards"``; rebuild the model with :func:`assemble`), its
    chunks of the averaged gradients the last step used (``"grad_shards"``: rebuild them with
    ``assemble(results, "grad_shards")`` and compare with :func:`ddp_reference_worker`'s), its
    full parameters where it holds them (stages 0-2), the bytes it holds (``"held"``: weights and
    gradients at the end of the last backward, master and moments after the last step), the peak
    of gradient bytes during backward, the peak of gathered weight bytes (stage 3), the losses.
    """
    import torch
    import torch.distributed as dist

    integer_at_least(micro_batches, "micro_batches")
    if defer_reduce and zero_stage != 2:
        raise ValueError(f"defer_reduce applies to stage 2 only (stages 0-1 reduce once per step anyway), got stage {zero_stage}")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = rank_rows(batch, rank, world)
    z = HandZero(zero_stage, sizes, precision, seed)
    X, Y = make_regression(steps * micro_batches, batch, sizes)
    loss_dtype = torch.float64 if precision == "fp64" else torch.float32
    losses = []
    for k in range(steps):
        with span("step"):
            z.zero_grad()
            total = 0.0
            for j in range(micro_batches):
                z.sync = (not defer_reduce) or j == micro_batches - 1
                idx = k * micro_batches + j
                out = z.forward(X[idx][mine]).to(loss_dtype)
                loss = torch.nn.functional.mse_loss(out, Y[idx][mine].to(z.dev, loss_dtype)) / micro_batches
                loss.backward()
                z.after_backward()
                total += loss.item()
            end_of_backward = z.held()
            z.step()
        losses.append(total)
    held = {**z.held(), "weights": end_of_backward["weights"], "gradients": end_of_backward["gradients"]}
    return {
        "stage": zero_stage, "precision": precision, "world": world,
        "n_params": sum(u.numel for u in z.units), "padded": sum(u.padded for u in z.units),
        "shapes": [u.shapes for u in z.units], "shards": z.owned_chunks(), "grad_shards": z.reduced_chunks(),
        "params": None if zero_stage == 3 else [p.detach().clone() for p in z.model.parameters()],
        "held": held, "peak_grad_bytes": z.peak_grad_bytes,
        "peak_gathered_bytes": z.gathered.peak if zero_stage == 3 else None, "losses": losses,
    }


# ---- references: PyTorch's DDP, ZeroRedundancyOptimizer and FSDP2 ------------------------------

def _train_loop(model, opt, steps, batch, sizes, micro_batches=1, context=None, dtype=None):
    """The reference training loop; ``context(last)`` wraps each micro-batch (no_sync and the like);
    the data are cast to ``dtype`` (float32 unless given)."""
    import contextlib

    import torch
    import torch.distributed as dist

    mine = rank_rows(batch, dist.get_rank(), dist.get_world_size())
    X, Y = make_regression(steps * micro_batches, batch, sizes)
    losses = []
    for k in range(steps):
        with span("step"):
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for j in range(micro_batches):
                idx = k * micro_batches + j
                last = j == micro_batches - 1
                with (context(last) if context else contextlib.nullcontext()):
                    out = model(X[idx][mine].to(device(), dtype or torch.float32))
                    loss = torch.nn.functional.mse_loss(out, Y[idx][mine].to(device(), dtype or torch.float32)) / micro_batches
                    loss.backward()
                total += loss.item()
            opt.step()
        losses.append(total)
    return losses


def ddp_reference_worker(steps: int = 3, batch: int = 16, sizes=DEFAULT_SIZES, micro_batches: int = 1, seed: int = 0,
                         precision: str = "fp32"):
    """Plain PyTorch DDP + AdamW on the same data: what every stage must equal.

    With ``micro_batches`` > 1 it accumulates under ``no_sync`` until the last micro-batch.
    ``precision`` is ``"fp32"`` or ``"fp64"``. Returns the parameters after the last step and
    the gradients DDP averaged in it (``"grads"``): a gradient off by a constant factor moves
    AdamW's parameters hardly at all (it divides by the root of the second moment), so the
    gradients are what pins the reduction down.
    """
    import contextlib

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    one_of(precision, "precision", ("fp32", "fp64"))
    dtype = torch.float64 if precision == "fp64" else torch.float32
    model = DDP(make_mlp(sizes, seed, dtype=dtype).to(device()))
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    context = lambda last: contextlib.nullcontext() if last else model.no_sync()
    losses = _train_loop(model, opt, steps, batch, sizes, micro_batches, context, dtype)
    return {"params": [p.detach().clone() for p in model.parameters()],
            "grads": [p.grad.detach().clone() for p in model.parameters()], "losses": losses}


def zero_redundancy_worker(steps: int = 3, batch: int = 16, sizes=DEFAULT_SIZES, seed: int = 0):
    """PyTorch's ZeRO-1: DDP + ``ZeroRedundancyOptimizer(AdamW)``; measured like the hand stages.

    It partitions whole parameter tensors between ranks (not equal flat chunks), DDP still
    all-reduces every gradient, and the updated parameters are broadcast from their owners.
    """
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make_mlp(sizes, seed).to(device()))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **ADAMW)
    losses = _train_loop(model, opt, steps, batch, sizes)
    params = list(model.parameters())
    moments, counters = moment_bytes(opt.optim)
    owned = sum(p.numel() for g in opt.optim.param_groups for p in g["params"])
    return {
        "params": [p.detach().clone() for p in params],
        "held": {"weights": tensor_bytes(params), "moments": moments, "counters": counters},
        "owned_params": owned,
        "losses": losses,
    }


def fsdp2_worker(steps: int = 3, batch: int = 16, sizes=DEFAULT_SIZES, seed: int = 0, micro_batches: int = 1,
                 defer_reduce: bool = False):
    """PyTorch's FSDP2 (``fully_shard`` on every Linear, then on the model), AdamW, fp32.

    With ``micro_batches`` > 1 and ``defer_reduce``, gradient reduction is switched off with
    ``set_requires_gradient_sync(False)`` until the last micro-batch (FSDP2 has no ``no_sync``).

    Returns this rank's local shards (``"local"``, dim-0 slices of every parameter; concatenate
    over ranks to rebuild, see :func:`assemble_dim0`), the bytes it holds and the losses.
    """
    import contextlib

    import torch
    from torch.distributed.fsdp import fully_shard

    model = make_mlp(sizes, seed).to(device())
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)

    def context(last):
        model.set_requires_gradient_sync(last or not defer_reduce)
        return contextlib.nullcontext()

    losses = _train_loop(model, opt, steps, batch, sizes, micro_batches, context)
    params = list(model.parameters())
    local = [p.to_local() for p in params]
    moments = [v.to_local() for st in opt.state.values() for v in st.values() if hasattr(v, "to_local")]
    return {
        "local": [t.detach().clone() for t in local],
        "held": {
            "weights": sum(t.numel() * t.element_size() for t in local),
            "gradients": sum(p.grad.to_local().numel() * 4 for p in params if p.grad is not None),
            "moments": sum(t.numel() * t.element_size() for t in moments),
        },
        "losses": losses,
    }


def per_step_comm(run, rank: int = 0) -> dict:
    """Per training step on one rank: calls, payload bytes and ring-model bytes sent, by op.

    Only the collectives issued inside the workers' ``span("step")`` count (DDP's set-up
    broadcasts, for example, do not); totals are divided by the number of steps.
    """

    steps = [s for s in run.spans[rank] if s.name == "step"]
    if not steps:
        raise ValueError("this run recorded no 'step' spans: run a worker from helpers.zero")
    ops = [o for o in run.comm[rank] if any(s.start <= o.t <= s.end for s in steps)]
    return {op: {k: v / len(steps) for k, v in row.items()} for op, row in summarize(ops).items()}


def assemble_dim0(results, key: str = "local") -> list:
    """Full parameters from dim-0 shards returned by every rank (FSDP2's ``Shard(0)`` layout)."""
    import torch

    return [torch.cat([res[key][i] for res in results], dim=0) for i in range(len(results[0][key]))]


# ---- the identity on the ranks: all-reduce = reduce-scatter + all-gather ------------------------

def identity_worker(numel: int = 1 << 12, seed: int = 0):
    """On this rank: all-reduce one random tensor, and reduce-scatter + all-gather a copy (12.1.2).

    Returns both results and the max difference; the launcher logs the bytes of each call.
    """
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    equal_parts(numel, world, "world size {k} does not divide {n} elements into equal chunks")
    g = torch.Generator().manual_seed(seed + rank)
    x = torch.randint(-100, 100, (numel,), generator=g).to(torch.float32).to(device())  # integers: sums are exact
    ar = x.clone()
    dist.all_reduce(ar)
    piece = torch.empty(numel // world, device=device())
    dist.reduce_scatter_single(piece, x)
    rs_ag = torch.empty(numel, device=device())
    dist.all_gather_single(rs_ag, piece)
    return {"all_reduce": ar, "rs_ag": rs_ag, "piece": piece, "equal": bool(torch.equal(ar, rs_ag))}
