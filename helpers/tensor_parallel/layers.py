"""Megatron's tensor-parallel layers on ranks (P.8, 12.2.1; the sequence-parallel mode serves 12.3.1).

All parameterised by a process group (``group=None`` is the world):

* the collectives along the sequence and the conjugate communication operators, as
  ``torch.autograd.Function``s: ``copy_to_tp`` ("f": identity forward, all-reduce backward) and
  ``reduce_from_tp`` ("g": all-reduce forward, identity backward); for sequence parallelism
  ``gather_from_sp`` (all-gather along the sequence forward, reduce-scatter backward) and
  ``reduce_scatter_to_sp`` (the reverse);
* :class:`ColumnParallelLinear` (``Y_k = X A_k + b_k``, f in front) and
  :class:`RowParallelLinear` (``Z = sum_k Y_k B_k`` by g, then the bias), each built from the
  full weight with :meth:`from_full` or from a shard.

The block built from them is :mod:`helpers.tensor_parallel.block`; the public face of the section is
:mod:`helpers.tensor_parallel`.

Layout: activations are ``(s, b, h)``, sequence first (as in Megatron), so sequence parallelism
splits dim 0. Weights are stored ``(in, out)`` and applied as ``x @ W + b``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..tp_numpy import check_degree, check_divides
from ..validate import index_below

# ---- the group -----------------------------------------------------------------------------------

def tp_rank_size(group=None) -> tuple[int, int]:
    """(rank within the group, group size); (0, 1) when torch.distributed is not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialised")
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


# ---- collectives along the sequence dimension (dim 0) ------------------------------------------

def all_reduce_sum(x: torch.Tensor, group=None) -> torch.Tensor:
    """A new tensor: the sum of ``x`` over the group (the input is left alone)."""
    _, t = tp_rank_size(group)
    if t == 1:
        return x
    y = x.contiguous().clone()
    dist.all_reduce(y, group=group)
    return y


def all_gather_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along dim 0, in rank order: (s/t, ...) -> (s, ...)."""
    _, t = tp_rank_size(group)
    if t == 1:
        return x
    out = torch.empty((t * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_single(out, x.contiguous(), group=group)
    return out


def reduce_scatter_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``x`` over the group and keep this rank's block of dim 0: (s, ...) -> (s/t, ...)."""
    rank, t = tp_rank_size(group)
    if t == 1:
        return x
    n = check_divides("the sequence length", x.shape[0], t)
    out = torch.empty((n,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_single(out, x.contiguous(), group=group)
    return out


def split_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's block of dim 0 (no communication): (s, ...) -> (s/t, ...)."""
    rank, t = tp_rank_size(group)
    n = check_divides("the sequence length", x.shape[0], t)
    return x[rank * n:(rank + 1) * n]


# ---- the conjugate operators ----------------------------------------------------------------------

class _CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce backward (in front of a column-parallel layer)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_sum(grad, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward, identity backward (after a row-parallel layer)."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromSP(torch.autograd.Function):
    """all-gather along the sequence forward, reduce-scatter backward (SP's replacement for f)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_seq(grad, ctx.group), None


class _ReduceScatterToSP(torch.autograd.Function):
    """reduce-scatter along the sequence forward, all-gather backward (SP's replacement for g)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_seq(grad, ctx.group), None


def copy_to_tp(x, group=None):
    """f (12.2.1, Shoeybi et al. 2019): identity forward, all-reduce of the gradient backward."""
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x, group=None):
    """g: all-reduce (sum) forward, identity backward."""
    return _ReduceFromTP.apply(x, group)


def gather_from_sp(x, group=None):
    """SP (12.3.1): all-gather (s/t, b, h) -> (s, b, h) forward; reduce-scatter backward."""
    return _GatherFromSP.apply(x, group)


def reduce_scatter_to_sp(x, group=None):
    """SP (12.3.1): reduce-scatter (s, b, h) partial sums -> (s/t, b, h) forward; all-gather backward."""
    return _ReduceScatterToSP.apply(x, group)


class _GatherLinear(torch.autograd.Function):
    """all-gather the sequence shard, then ``x @ W + b``; backward reduce-scatters dX.

    With ``regather=True`` only the (s/t, b, h) shard is kept for backward and it is all-gathered
    a second time there (Korthikanti et al. 2022, section 4.2.2): activation memory /t, one more
    all-gather per layer in backward. With ``regather=False`` the gathered input is kept.
    """

    @staticmethod
    def forward(ctx, x_shard, weight, bias, group, regather):
        full = all_gather_seq(x_shard, group)
        ctx.group, ctx.regather, ctx.has_bias = group, regather, bias is not None
        ctx.save_for_backward(x_shard if regather else full, weight)
        y = full @ weight
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, gy):
        saved, weight = ctx.saved_tensors
        full = all_gather_seq(saved, ctx.group) if ctx.regather else saved
        gx = reduce_scatter_seq(gy @ weight.t(), ctx.group)
        gw = full.reshape(-1, full.shape[-1]).t() @ gy.reshape(-1, gy.shape[-1])
        gb = gy.reshape(-1, gy.shape[-1]).sum(0) if ctx.has_bias else None
        return gx, gw, gb, None, None


# ---- sharding a full weight ---------------------------------------------------------------------

def column_shard(W: torch.Tensor, rank: int, t: int, parts: int = 1) -> torch.Tensor:
    """Rank ``rank``'s columns (last dim) of W for degree t.

    ``parts`` > 1 treats W as ``parts`` equal blocks side by side (e.g. [Q | K | V]) and takes the
    rank's slice of each block, so a fused QKV weight splits by heads.
    """
    index_below(rank, "rank", check_degree(t))
    width = check_divides("the number of weight blocks' columns", W.shape[-1], parts)
    n = check_divides("the output width of a column-parallel layer", width, t)
    blocks = W.split(width, dim=-1)
    return torch.cat([blk[..., rank * n:(rank + 1) * n] for blk in blocks], dim=-1).clone()


def row_shard(W: torch.Tensor, rank: int, t: int) -> torch.Tensor:
    """Rank ``rank``'s rows (first dim) of W for degree t."""
    index_below(rank, "rank", check_degree(t))
    n = check_divides("the input width of a row-parallel layer", W.shape[0], t)
    return W[rank * n:(rank + 1) * n].clone()


# ---- the two layers -------------------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """Y_k = X A_k + b_k on rank k: A split by output columns, X replicated (P.8, 12.2.1).

    Forward: f (identity) then a local matmul; no communication. Backward: the input gradient is
    a partial sum over this rank's columns, and f's all-reduce completes it.
    With ``sequence_parallel=True`` (12.3.1) the input is this rank's (s/t, b, h) block of the
    sequence and f becomes an all-gather (reduce-scatter in backward); ``regather_input`` keeps
    only the shard for backward (see :class:`_GatherLinear`). The output stays split by columns.
    """

    def __init__(self, weight_shard, bias_shard=None, group=None, sequence_parallel=False, regather_input=True):
        super().__init__()
        self.weight = nn.Parameter(weight_shard.detach().clone())
        self.bias = None if bias_shard is None else nn.Parameter(bias_shard.detach().clone())
        self.group, self.sequence_parallel, self.regather_input = group, sequence_parallel, regather_input

    @classmethod
    def from_full(cls, weight, bias=None, group=None, parts: int = 1, **kw):
        """Take this rank's columns of the full ``weight`` (in, out) and ``bias`` (out,)."""
        rank, t = tp_rank_size(group)
        b = None if bias is None else column_shard(bias, rank, t, parts)
        return cls(column_shard(weight, rank, t, parts), b, group, **kw)

    def forward(self, x):
        if self.sequence_parallel:
            return _GatherLinear.apply(x, self.weight, self.bias, self.group, self.regather_input)
        y = copy_to_tp(x, self.group) @ self.weight
        return y + self.bias if self.bias is not None else y


class RowParallelLinear(nn.Module):
    """Z = sum_k Y_k B_k + b: B split by input rows, Y arriving split by columns (P.8, 12.2.1).

    Forward: a local matmul gives a partial sum, g all-reduces it, then the (replicated) bias is
    added once. Backward: g is the identity. With ``sequence_parallel=True`` (12.3.1) g becomes a
    reduce-scatter along the sequence (all-gather in backward) and the output is (s/t, b, h).
    """

    def __init__(self, weight_shard, bias=None, group=None, sequence_parallel=False):
        super().__init__()
        self.weight = nn.Parameter(weight_shard.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.group, self.sequence_parallel = group, sequence_parallel

    @classmethod
    def from_full(cls, weight, bias=None, group=None, **kw):
        """Take this rank's rows of the full ``weight`` (in, out); the bias is replicated."""
        rank, t = tp_rank_size(group)
        return cls(row_shard(weight, rank, t), bias, group, **kw)

    def forward(self, x):
        partial = x @ self.weight
        z = reduce_scatter_to_sp(partial, self.group) if self.sequence_parallel else reduce_from_tp(partial, self.group)
        return z + self.bias if self.bias is not None else z
