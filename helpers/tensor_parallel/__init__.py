"""Megatron-style tensor parallelism on ranks (P.8, 12.2.1; its sequence-parallel mode serves 12.3.1).

The public face of the section: import everything from here. The pieces, smallest first, live in
modules that each read in one sitting:

* :mod:`helpers.tensor_parallel.layers`: the conjugate communication operators (``copy_to_tp`` "f",
  ``reduce_from_tp`` "g", and for sequence parallelism ``gather_from_sp`` and
  ``reduce_scatter_to_sp``) and the :class:`ColumnParallelLinear` / :class:`RowParallelLinear`
  layers built from them;
* :mod:`helpers.tensor_parallel.block`: :class:`ParallelBlock`, a pre-LayerNorm transformer block (attention +
  GeLU MLP, dropout with seeded masks) whose outputs and gradients equal :func:`reference_block`
  on one process, and :class:`TorchBlock` / :func:`torch_tp_plan`, the same block for PyTorch's
  ``parallelize_module``;
* :mod:`helpers.tensor_parallel.costs` (torch-free): the cost model of the sections, all-reduce bytes, layer
  FLOPs, a compute-vs-communication sweep, and the worked examples;
* this module: the workers that run the block on the launcher's ranks (or under torchrun)
  against :func:`reference_step`, and the checks of what they return. The numpy version of
  every split is :mod:`helpers.tp_numpy`.

Layout: activations are ``(s, b, h)``, sequence first (as in Megatron), so sequence parallelism
splits dim 0. Weights are stored ``(in, out)`` and applied as ``x @ W + b``.
"""
from __future__ import annotations

import torch

from ..launcher.commlog import as_tuples, mark, ops_since
from ..launcher.worker import device
from ..validate import integer_at_least
from .block import (
    REPLICATED,
    STREAM_ATTN,
    STREAM_ATTN_OUT,
    STREAM_MLP_OUT,
    BlockConfig,
    ParallelBlock,
    TorchBlock,
    allreduce_replicated_grads,
    as_config,
    attention_core,
    check_tp_shapes,
    head_dropout_mask,
    make_block_params,
    masked_dropout,
    position_dropout_mask,
    qkv_for_colwise,
    reference_block,
    shard_block_params,
    to_local,
    torch_block_grads,
    torch_tp_plan,
)
from .costs import (
    H100_BF16_FLOPS,
    INFINIBAND_BPS,
    NVLINK_ALLREDUCE_BPS,
    P8_LINK_BPS,
    activation_tensor_bytes,
    allreduce_bytes_per_device,
    book_12_2_1,
    book_link,
    book_p8,
    per_rank_layer_flops,
    tp_layer_times,
    tp_sweep,
)
from .layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    all_gather_seq,
    all_reduce_sum,
    column_shard,
    copy_to_tp,
    gather_from_sp,
    reduce_from_tp,
    reduce_scatter_seq,
    reduce_scatter_to_sp,
    row_shard,
    split_seq,
    tp_rank_size,
)

__all__ = [
    # tp_layers
    "tp_rank_size", "all_reduce_sum", "all_gather_seq", "reduce_scatter_seq", "split_seq", "copy_to_tp", "reduce_from_tp",
    "gather_from_sp", "reduce_scatter_to_sp", "column_shard", "row_shard", "ColumnParallelLinear", "RowParallelLinear",
    # tp_block
    "position_dropout_mask", "head_dropout_mask", "masked_dropout", "STREAM_ATTN", "STREAM_ATTN_OUT", "STREAM_MLP_OUT",
    "BlockConfig", "as_config", "check_tp_shapes", "make_block_params", "shard_block_params", "REPLICATED",
    "attention_core", "reference_block", "ParallelBlock", "allreduce_replicated_grads", "TorchBlock", "qkv_for_colwise",
    "torch_tp_plan", "torch_block_grads", "to_local",
    # tp_costs
    "H100_BF16_FLOPS", "NVLINK_ALLREDUCE_BPS", "INFINIBAND_BPS", "P8_LINK_BPS", "activation_tensor_bytes",
    "allreduce_bytes_per_device", "per_rank_layer_flops", "tp_layer_times", "tp_sweep", "book_link", "book_p8",
    "book_12_2_1",
    # this module
    "block_inputs", "reference_step", "tp_block_worker", "torch_tp_worker", "count_ops", "measure_matmul_flops",
    "ops_in_spans", "max_differences",
]


# ---- workers (run under the launcher, or torchrun) ---------------------------------------------------

def block_inputs(cfg: BlockConfig, s: int, b: int, seed: int = 1, dtype=torch.float64):
    """The input x (s, b, h) and the output-gradient weights R of the loss sum(out * R)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(s, b, cfg.h, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(s, b, cfg.h, generator=g, dtype=torch.float64).to(dtype))


def reference_step(cfg: BlockConfig, s: int, b: int, param_seed: int = 0, data_seed: int = 1):
    """Forward + backward of :func:`reference_block` on one process: output, dx and the gradients."""
    P = {k: v.requires_grad_() for k, v in make_block_params(cfg, param_seed).items()}
    x, R = block_inputs(cfg, s, b, data_seed)
    x.requires_grad_()
    out = reference_block(x, P, cfg)
    (out * R).sum().backward()
    return {"out": out.detach(), "dx": x.grad.detach(), "grads": {k: v.grad.detach() for k, v in P.items()}}


def tp_block_worker(cfg: BlockConfig | dict | None = None, s: int = 16, b: int = 2, param_seed: int = 0, data_seed: int = 1,
                    sequence_parallel: bool = False, regather_input: bool = True, sync_replicated: bool = True):
    """One forward + backward of :class:`ParallelBlock` on this rank (12.2.1 / 12.3.1).

    Returns the output and input gradient this rank holds (full under TP, its s/t rows under SP),
    its parameter-shard gradients (under SP the replicated ones are summed over the group unless
    ``sync_replicated=False``), and the collectives of the forward and the backward:
    (op, payload bytes, group size).
    """

    cfg = as_config(cfg)
    rank, t = tp_rank_size()
    check_tp_shapes(cfg, t, s if sequence_parallel else None)
    dev = device()
    P = {k: v.to(dev) for k, v in make_block_params(cfg, param_seed).items()}
    block = ParallelBlock(P, cfg, sequence_parallel=sequence_parallel, regather_input=regather_input)
    x, R = (z.to(dev) for z in block_inputs(cfg, s, b, data_seed))
    if sequence_parallel:
        x, R = split_seq(x), split_seq(R)
    x = x.clone().requires_grad_()
    m0 = mark()
    out = block(x)
    m1 = mark()
    (out * R).sum().backward()
    m2 = mark()
    n_sync = allreduce_replicated_grads(block) if sequence_parallel and sync_replicated else 0
    return {"out": out.detach(), "dx": x.grad.detach(), "grads": block.grads(),
            "forward": as_tuples(ops_since(m0, m1)), "backward": as_tuples(ops_since(m1, m2)),
            "grad_sync": as_tuples(ops_since(m2)), "n_grad_sync": n_sync}


def torch_tp_worker(cfg: BlockConfig | dict | None = None, s: int = 16, b: int = 2, param_seed: int = 0, data_seed: int = 1,
                    sequence_parallel: bool = False):
    """The same forward + backward with ``parallelize_module`` on a 1-D device mesh of all ranks.

    Returns this rank's output (full, or its s/t rows under SequenceParallel), dx, full parameter
    gradients (from the DTensors) and the collectives of the forward and the backward.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    cfg = as_config(cfg)
    rank, t = tp_rank_size()
    check_tp_shapes(cfg, t, s if sequence_parallel else None)
    dev = device()
    mesh = init_device_mesh(dev.type, (t,))
    P = {k: v.to(dev) for k, v in make_block_params(cfg, param_seed).items()}
    block = TorchBlock(P, cfg, t)
    parallelize_module(block, mesh, torch_tp_plan(sequence_parallel))
    block.head_offset = rank * (cfg.heads // t)
    x, R = (z.to(dev) for z in block_inputs(cfg, s, b, data_seed))
    if sequence_parallel:
        x, R = split_seq(x), split_seq(R)
        block.first_position = rank * x.shape[0]
    x = x.clone().requires_grad_()
    m0 = mark()
    out = to_local(block(x))
    m1 = mark()
    (out * R).sum().backward()
    m2 = mark()
    grads = torch_block_grads(block)
    return {"out": out.detach(), "dx": x.grad.detach(), "grads": grads,
            "forward": as_tuples(ops_since(m0, m1)), "backward": as_tuples(ops_since(m1, m2))}


def count_ops(ops) -> dict[str, int]:
    """{op name: number of calls} for a list of (op, bytes, group size)."""
    out: dict[str, int] = {}
    for op, *_ in ops:
        out[op] = out.get(op, 0) + 1
    return out


# ---- the compute term, measured -------------------------------------------------------------------

def measure_matmul_flops(n: int = 256, repeats: int = 5, dtype=torch.float32, threads: int | None = None) -> float:
    """FLOP/s of an n x n x n matmul on this process (median of ``repeats``): the compute term."""
    import statistics
    import time

    integer_at_least(n, "n")
    integer_at_least(repeats, "repeats")
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        a, c = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ c
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ c
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    return 2 * n**3 / statistics.median(times)


# ---- checking what the ranks returned ---------------------------------------------------------------

def ops_in_spans(run, rank: int = 0) -> dict[str, list[str]]:
    """The collectives rank ``rank`` issued inside each named span of a launched job, in order
    (e.g. ``{"forward": ["all_reduce"], "backward": ["all_reduce"]}``)."""
    spans = run.spans[rank]
    out: dict[str, list[str]] = {sp.name: [] for sp in spans}
    for o in run.comm[rank]:
        for sp in spans:
            if sp.start <= o.t <= sp.end:
                out[sp.name].append(o.op)
                break
    return out


def max_differences(results: list[dict], ref: dict, sequence_parallel: bool = False, full_grads: bool = False) -> dict:
    """Largest |difference| over ranks between launched results and :func:`reference_step`.

    Output and dx are compared with the reference (this rank's s/t rows under sequence
    parallelism); gradients with this rank's shards of the reference gradients (or with the full
    ones when ``full_grads``, as :func:`torch_tp_worker` returns).
    """
    t = len(results)
    rows = lambda x, r: x[r * (x.shape[0] // t):(r + 1) * (x.shape[0] // t)] if sequence_parallel else x
    d = {"out": 0.0, "dx": 0.0, "grads": 0.0}
    for r, res in enumerate(results):
        d["out"] = max(d["out"], (res["out"] - rows(ref["out"], r)).abs().max().item())
        d["dx"] = max(d["dx"], (res["dx"] - rows(ref["dx"], r)).abs().max().item())
        expect = ref["grads"] if full_grads else shard_block_params(ref["grads"], r, t)
        d["grads"] = max(d["grads"], max((res["grads"][k] - g).abs().max().item() for k, g in expect.items()))
    return d
