"""Megatron-style tensor parallelism on ranks (P.8, 12.2.1; its sequence-parallel mode serves 12.3.1).

The pieces, smallest first, all parameterised by a process group (``group=None`` is the world):

* the conjugate communication operators, as ``torch.autograd.Function``s:
  ``copy_to_tp`` ("f": identity forward, all-reduce backward) and ``reduce_from_tp``
  ("g": all-reduce forward, identity backward); for sequence parallelism ``gather_from_sp``
  (all-gather along the sequence forward, reduce-scatter backward) and ``reduce_scatter_to_sp``
  (the reverse);
* :class:`ColumnParallelLinear` (``Y_k = X A_k + b_k``, f in front) and
  :class:`RowParallelLinear` (``Z = sum_k Y_k B_k`` by g, then the bias), each built from the
  full weight with :meth:`from_full` or from a shard;
* :class:`ParallelBlock`: a pre-LayerNorm transformer block (attention + GeLU MLP, dropout with
  seeded masks) whose outputs and gradients equal :func:`reference_block` on one process;
* :class:`TorchBlock` and :func:`torch_tp_plan`: the same block for PyTorch's
  ``parallelize_module`` (``ColwiseParallel``/``RowwiseParallel``/``SequenceParallel``);
* the cost model of the section: all-reduce bytes, layer FLOPs, a compute-vs-communication sweep.

Layout: activations are ``(s, b, h)``, sequence first (as in Megatron), so sequence parallelism
splits dim 0. Weights are stored ``(in, out)`` and applied as ``x @ W + b``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from . import costs
from .commlog import as_tuples, mark, ops_since
from .tp_numpy import check_degree, check_divides
from .validate import index_below, integer_at_least, positive_number, probability


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


# ---- dropout with masks that do not depend on the layout --------------------------------------------

def _generator(seed: int, stream: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(stream) * 100_003 + int(index)) % (2**63))


def position_dropout_mask(seed: int, stream: int, positions, b: int, width: int, p: float) -> torch.Tensor:
    """Keep-mask (bool, ``(len(positions), b, width)``) drawn per sequence position.

    Row ``i`` depends only on (seed, stream, positions[i]), so a rank holding positions 8..15
    draws exactly the rows a single process draws there: dropout on s/t rows under sequence
    parallelism equals dropout on all s rows under plain TP, on every rank.
    """
    probability(p, "dropout probability p", below_one=True)
    return torch.stack([torch.rand(b, width, generator=_generator(seed, stream, int(i))) >= p for i in positions])


def head_dropout_mask(seed: int, stream: int, heads, b: int, s: int, p: float) -> torch.Tensor:
    """Keep-mask (bool, ``(b, len(heads), s, s)``) for attention probabilities, drawn per global head."""
    probability(p, "dropout probability p", below_one=True)
    return torch.stack([torch.rand(b, s, s, generator=_generator(seed, stream, int(j))) >= p for j in heads], dim=1)


class _MaskedDropout(torch.autograd.Function):
    """x * mask / (1 - p), keeping only the 1-byte mask for backward (Korthikanti et al.'s count)."""

    @staticmethod
    def forward(ctx, x, mask, scale):
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x * mask * scale

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask * ctx.scale, None, None


def masked_dropout(x, mask, p: float):
    """Dropout with a given keep-mask (bool, broadcastable to x); identity when p == 0."""
    if p == 0.0:
        return x
    return _MaskedDropout.apply(x, mask.to(x.device), 1.0 / (1.0 - p))


# ---- the transformer block --------------------------------------------------------------------------

STREAM_ATTN, STREAM_ATTN_OUT, STREAM_MLP_OUT = 1, 2, 3


@dataclass(frozen=True)
class BlockConfig:
    """Shapes and dropout of one transformer block: hidden h, ``heads`` heads, FFN width ``ffn``."""

    h: int = 32
    heads: int = 4
    ffn: int = 128
    p_drop: float = 0.0
    seed: int = 0  # dropout seed
    eps: float = 1e-5

    def __post_init__(self):
        for name in ("h", "heads", "ffn"):
            integer_at_least(getattr(self, name), name)
        check_divides("the hidden size h", self.h, self.heads)
        probability(self.p_drop, "dropout probability p_drop", below_one=True)

    @property
    def head_dim(self) -> int:
        return self.h // self.heads


def as_config(cfg) -> BlockConfig:
    """A :class:`BlockConfig` from itself, a dict of its fields (e.g. JSON from torchrun) or None (defaults)."""
    if cfg is None:
        return BlockConfig()
    if isinstance(cfg, dict):
        return BlockConfig(**cfg)
    if not isinstance(cfg, BlockConfig):
        raise ValueError(f"cfg must be a BlockConfig, a dict of its fields or None, got {type(cfg).__name__}")
    return cfg


def check_tp_shapes(cfg: BlockConfig, t: int, seq_len: int | None = None) -> None:
    """ValueError unless heads, FFN width (and, for sequence parallelism, s) divide by t (12.2.1, 12.3.1)."""
    check_divides("the number of attention heads", cfg.heads, t)
    check_divides("the FFN width", cfg.ffn, t)
    if seq_len is not None:
        check_divides("the sequence length (sequence parallelism)", seq_len, t)


def make_block_params(cfg: BlockConfig, seed: int = 0, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """Full weights of one block, the same on every rank for the same seed.

    Names: ln1_w, ln1_b, w_qkv (h, 3h) = [Wq | Wk | Wv], b_qkv, w_o (h, h), b_o, ln2_w, ln2_b,
    w_fc1 (h, ffn), b_fc1, w_fc2 (ffn, h), b_fc2.
    """
    g = torch.Generator().manual_seed(seed)
    h, f = cfg.h, cfg.ffn
    r = lambda *shape, scale: (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    return {
        "ln1_w": 1 + r(h, scale=0.1), "ln1_b": r(h, scale=0.1),
        "w_qkv": r(h, 3 * h, scale=h**-0.5), "b_qkv": r(3 * h, scale=0.1),
        "w_o": r(h, h, scale=h**-0.5), "b_o": r(h, scale=0.1),
        "ln2_w": 1 + r(h, scale=0.1), "ln2_b": r(h, scale=0.1),
        "w_fc1": r(h, f, scale=h**-0.5), "b_fc1": r(f, scale=0.1),
        "w_fc2": r(f, h, scale=f**-0.5), "b_fc2": r(h, scale=0.1),
    }


def shard_block_params(P: dict, rank: int, t: int) -> dict[str, torch.Tensor]:
    """What rank ``rank`` of t holds of each full tensor in ``P`` (weights or their gradients).

    Column-parallel: w_qkv/b_qkv (by heads, within each of Q, K, V), w_fc1/b_fc1. Row-parallel:
    w_o, w_fc2. Replicated: LayerNorms and the row-parallel layers' biases.
    """
    out = {}
    for name, W in P.items():
        if name in ("w_qkv", "b_qkv"):
            out[name] = column_shard(W, rank, t, parts=3)
        elif name in ("w_fc1", "b_fc1"):
            out[name] = column_shard(W, rank, t)
        elif name in ("w_o", "w_fc2"):
            out[name] = row_shard(W, rank, t)
        else:
            out[name] = W.clone()
    return out


REPLICATED = ("ln1_w", "ln1_b", "b_o", "ln2_w", "ln2_b", "b_fc2")


def attention_core(qkv: torch.Tensor, cfg: BlockConfig, head_offset: int = 0) -> torch.Tensor:
    """Self-attention over the heads present in ``qkv`` (s, b, 3 * heads_local * d), laid out
    [Q | K | V]; returns (s, b, heads_local * d). Head j here is global head ``head_offset + j``
    (that picks its dropout mask). No causal mask: the block is the same either way for TP."""
    s, b, width = qkv.shape
    d = cfg.head_dim
    if width % (3 * d):
        raise ValueError(f"qkv width {width} is not 3 x (whole heads of width {d})")
    local = width // (3 * d)
    q, k, v = (z.reshape(s, b, local, d).permute(1, 2, 0, 3) for z in qkv.split(local * d, dim=-1))
    probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d)), dim=-1)
    if cfg.p_drop > 0:
        mask = head_dropout_mask(cfg.seed, STREAM_ATTN, range(head_offset, head_offset + local), b, s, cfg.p_drop)
        probs = masked_dropout(probs, mask, cfg.p_drop)
    ctx = torch.matmul(probs, v)  # (b, heads, s, d)
    return ctx.permute(2, 0, 1, 3).reshape(s, b, local * d)


def _row_dropout(x, cfg: BlockConfig, stream: int, first_position: int):
    if cfg.p_drop == 0:
        return x
    mask = position_dropout_mask(cfg.seed, stream, range(first_position, first_position + x.shape[0]),
                                 x.shape[1], x.shape[2], cfg.p_drop)
    return masked_dropout(x, mask, cfg.p_drop)


def reference_block(x: torch.Tensor, P: dict, cfg: BlockConfig) -> torch.Tensor:
    """The block on one process with the full weights: the ground truth for every parallel version.

    h1 = x + Dropout(Attn(LN1(x)) Wo + b_o);  out = h1 + Dropout(GeLU(LN2(h1) W1 + b1) W2 + b2).
    """
    h = cfg.h
    ln1 = F.layer_norm(x, (h,), P["ln1_w"], P["ln1_b"], cfg.eps)
    ctx = attention_core(ln1 @ P["w_qkv"] + P["b_qkv"], cfg, 0)
    h1 = x + _row_dropout(ctx @ P["w_o"] + P["b_o"], cfg, STREAM_ATTN_OUT, 0)
    ln2 = F.layer_norm(h1, (h,), P["ln2_w"], P["ln2_b"], cfg.eps)
    m = F.gelu(ln2 @ P["w_fc1"] + P["b_fc1"], approximate="tanh") @ P["w_fc2"] + P["b_fc2"]
    return h1 + _row_dropout(m, cfg, STREAM_MLP_OUT, 0)


class ParallelBlock(nn.Module):
    """The block of :func:`reference_block` on the t ranks of ``group`` (12.2.1; SP of 12.3.1).

    Attention: QKV column-parallel (heads/t heads per rank), output projection row-parallel.
    MLP: fc1 column-parallel, GeLU local, fc2 row-parallel. LayerNorms, the row-parallel biases
    and the dropouts after each sub-block act on the full (s, b, h) activation, replicated on every
    rank (plain TP), or on this rank's s/t positions (``sequence_parallel=True``; the input and
    output are then (s/t, b, h) blocks and the replicated parameters' gradients are partial sums
    that :func:`allreduce_replicated_grads` completes).
    Per layer: 2 all-reduces forward (g after each sub-block) and 2 backward (f before each), or
    under SP 2 all-gathers + 2 reduce-scatters forward and backward (+2 all-gathers in backward
    when ``regather_input``).
    """

    def __init__(self, P: dict, cfg: BlockConfig, group=None, sequence_parallel=False, regather_input=True):
        super().__init__()
        self.rank, self.t = tp_rank_size(group)
        check_tp_shapes(cfg, self.t)
        self.cfg, self.group, self.sequence_parallel = cfg, group, sequence_parallel
        S = shard_block_params(P, self.rank, self.t)
        ln = lambda w, b: _layer_norm(cfg.h, cfg.eps, w, b)
        self.ln1, self.ln2 = ln(S["ln1_w"], S["ln1_b"]), ln(S["ln2_w"], S["ln2_b"])
        col = dict(group=group, sequence_parallel=sequence_parallel, regather_input=regather_input)
        self.qkv = ColumnParallelLinear(S["w_qkv"], S["b_qkv"], **col)
        self.o = RowParallelLinear(S["w_o"], S["b_o"], group, sequence_parallel)
        self.fc1 = ColumnParallelLinear(S["w_fc1"], S["b_fc1"], **col)
        self.fc2 = RowParallelLinear(S["w_fc2"], S["b_fc2"], group, sequence_parallel)
        self.head_offset = self.rank * (cfg.heads // self.t)

    def forward(self, x):
        first = self.rank * x.shape[0] if self.sequence_parallel else 0
        ctx = attention_core(self.qkv(self.ln1(x)), self.cfg, self.head_offset)
        h1 = x + _row_dropout(self.o(ctx), self.cfg, STREAM_ATTN_OUT, first)
        m = self.fc2(F.gelu(self.fc1(self.ln2(h1)), approximate="tanh"))
        return h1 + _row_dropout(m, self.cfg, STREAM_MLP_OUT, first)

    def named_shards(self) -> dict[str, nn.Parameter]:
        """This rank's parameters under the names of :func:`make_block_params`."""
        return {"ln1_w": self.ln1.weight, "ln1_b": self.ln1.bias, "w_qkv": self.qkv.weight,
                "b_qkv": self.qkv.bias, "w_o": self.o.weight, "b_o": self.o.bias,
                "ln2_w": self.ln2.weight, "ln2_b": self.ln2.bias, "w_fc1": self.fc1.weight,
                "b_fc1": self.fc1.bias, "w_fc2": self.fc2.weight, "b_fc2": self.fc2.bias}

    def grads(self) -> dict[str, torch.Tensor]:
        return {k: p.grad.detach().clone() for k, p in self.named_shards().items()}


def _layer_norm(h, eps, w, b) -> nn.LayerNorm:
    ln = nn.LayerNorm(h, eps=eps, dtype=w.dtype, device=w.device)
    with torch.no_grad():
        ln.weight.copy_(w)
        ln.bias.copy_(b)
    return ln


def allreduce_replicated_grads(block: ParallelBlock) -> int:
    """Sum the gradients of the replicated parameters (LayerNorms, row-parallel biases) over the
    group. Needed under sequence parallelism, where each rank saw only s/t positions; under plain
    TP they are already complete and equal on every rank. Returns the number of all-reduces."""
    params = block.named_shards()
    n = 0
    for name in REPLICATED:
        g = params[name].grad
        if g is not None and block.t > 1:
            dist.all_reduce(g, group=block.group)
            n += 1
    return n


# ---- the same block for PyTorch's tensor-parallel API ----------------------------------------------

class TorchBlock(nn.Module):
    """:func:`reference_block` built from ``nn.Linear``/``nn.LayerNorm`` modules, for
    ``parallelize_module`` (12.2.1, 12.3.1). ``qkv``'s output columns are ordered rank by rank
    ([Q_0 K_0 V_0 | Q_1 K_1 V_1 | ...], see :func:`qkv_for_colwise`) so that ColwiseParallel's
    contiguous split hands each rank its own heads' Q, K and V. Set ``head_offset`` (and, under
    SequenceParallel, ``first_position``) per rank after parallelising."""

    def __init__(self, P: dict, cfg: BlockConfig, t: int = 1):
        super().__init__()
        check_tp_shapes(cfg, t)
        self.cfg, self.t, self.head_offset, self.first_position = cfg, t, 0, 0
        self.ln1 = _layer_norm(cfg.h, cfg.eps, P["ln1_w"], P["ln1_b"])
        self.ln2 = _layer_norm(cfg.h, cfg.eps, P["ln2_w"], P["ln2_b"])
        self.qkv = _linear(qkv_for_colwise(P["w_qkv"], t), qkv_for_colwise(P["b_qkv"], t))
        self.o = _linear(P["w_o"], P["b_o"])
        self.fc1 = _linear(P["w_fc1"], P["b_fc1"])
        self.fc2 = _linear(P["w_fc2"], P["b_fc2"])

    def forward(self, x):
        cfg = self.cfg
        ctx = attention_core(_local(self.qkv(self.ln1(x))), cfg, self.head_offset)
        h1 = x + _row_dropout(_local(self.o(ctx)), cfg, STREAM_ATTN_OUT, self.first_position)
        m = _local(self.fc2(F.gelu(_local(self.fc1(self.ln2(h1))), approximate="tanh")))
        return h1 + _row_dropout(m, cfg, STREAM_MLP_OUT, self.first_position)


def _local(x):
    """A plain tensor from a DTensor (what the next hand-written op expects)."""
    return x.to_local() if hasattr(x, "to_local") else x


def _linear(W, b) -> nn.Linear:
    lin = nn.Linear(W.shape[0], W.shape[1], dtype=W.dtype, device=W.device)
    with torch.no_grad():
        lin.weight.copy_(W.t())
        lin.bias.copy_(b)
    return lin


def qkv_for_colwise(W: torch.Tensor, t: int) -> torch.Tensor:
    """Reorder [Q | K | V] columns (last dim) to [Q_0 K_0 V_0 | ... | Q_{t-1} K_{t-1} V_{t-1}]."""
    return torch.cat([column_shard(W, r, t, parts=3) for r in range(t)], dim=-1)


def torch_tp_plan(sequence_parallel: bool = False) -> dict:
    """The ``parallelize_module`` plan for :class:`TorchBlock` (sequence on dim 0)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    if not sequence_parallel:
        return {"qkv": ColwiseParallel(), "o": RowwiseParallel(), "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    return {
        "ln1": SequenceParallel(sequence_dim=0), "qkv": ColwiseParallel(input_layouts=Shard(0)),
        "o": RowwiseParallel(output_layouts=Shard(0)),
        "ln2": SequenceParallel(sequence_dim=0), "fc1": ColwiseParallel(input_layouts=Shard(0)),
        "fc2": RowwiseParallel(output_layouts=Shard(0)),
    }


def torch_block_grads(block: TorchBlock) -> dict[str, torch.Tensor]:
    """Full gradients of a (parallelised) :class:`TorchBlock` in :func:`make_block_params` names
    and layout ((in, out) weights, [Q | K | V] order)."""
    full = lambda p: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
    t = block.t
    undo = lambda G: _qkv_from_colwise(G, t)
    return {
        "ln1_w": full(block.ln1.weight), "ln1_b": full(block.ln1.bias),
        "w_qkv": undo(full(block.qkv.weight).t()), "b_qkv": undo(full(block.qkv.bias)),
        "w_o": full(block.o.weight).t(), "b_o": full(block.o.bias),
        "ln2_w": full(block.ln2.weight), "ln2_b": full(block.ln2.bias),
        "w_fc1": full(block.fc1.weight).t(), "b_fc1": full(block.fc1.bias),
        "w_fc2": full(block.fc2.weight).t(), "b_fc2": full(block.fc2.bias),
    }


def _qkv_from_colwise(W: torch.Tensor, t: int) -> torch.Tensor:
    """Inverse of :func:`qkv_for_colwise`."""
    per_rank = W.split(W.shape[-1] // t, dim=-1)  # each [Q_r K_r V_r]
    pieces = [p.split(p.shape[-1] // 3, dim=-1) for p in per_rank]
    return torch.cat([torch.cat([pieces[r][j] for r in range(t)], dim=-1) for j in range(3)], dim=-1)


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
    from .worker import device

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

    from .worker import device

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
    out = _local(block(x))
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


# ---- the cost model (P.8, 12.2.1) ---------------------------------------------------------------------

H100_BF16_FLOPS = 989e12  # dense BF16 peak the section uses
NVLINK_ALLREDUCE_BPS = 600e9  # "NVLink effective AllReduce bandwidth ~600 GB/s" (12.2.1)
INFINIBAND_BPS = 25e9  # "InfiniBand (25 GB/s)" (12.2.1)
P8_LINK_BPS = 400e9  # "an assumed 400 GB/s intra-node link" (P.8)


def activation_bytes(s: int, b: int, h: int, bytes_per_element: int = 2) -> int:
    """Bytes of one (s, b, h) activation: the payload of every TP all-reduce."""
    for name, v in (("s", s), ("b", b), ("h", h), ("bytes_per_element", bytes_per_element)):
        integer_at_least(v, name)
    return s * b * h * bytes_per_element


def allreduce_bytes_per_device(s: int, b: int, h: int, t: int, bytes_per_element: int = 2) -> float:
    """What each device sends in a ring all-reduce of the (s, b, h) activation: 2(t-1)/t s b h bytes."""
    t = check_degree(t)
    return costs.allreduce_bytes(t, activation_bytes(s, b, h, bytes_per_element))


def layer_forward_flops(s: int, b: int, h: int, ffn: int, t: int = 1, mlp_matrices: int = 2) -> float:
    """Forward FLOPs of one transformer layer on one of t TP ranks (2 FLOPs per multiply-add).

    QKV 6sbh^2, output projection 2sbh^2, MLP 2 x mlp_matrices x sbh*ffn (2 for GeLU MLPs, 3 for
    SwiGLU), attention scores and weighted values 4bs^2h (:func:`helpers.costs.layer_forward_flops`
    on the s b tokens); all divided by t.
    """
    t = check_degree(t)
    return costs.layer_forward_flops(s * b, h, ffn, s, mlp_matrices) / t


def tp_layer_times(s, b, h, ffn, t, flops_per_s, link_bytes_per_s, alpha_s: float = 0.0,
                   bytes_per_element: int = 2, mlp_matrices: int = 2, allreduces: int = 2) -> dict:
    """Forward compute vs communication time of one layer at TP degree t (no overlap).

    compute = layer_forward_flops / flops_per_s; comm = allreduces x (2(t-1) alpha +
    2(t-1)/t S / link), S = s b h bytes (the ring model of P.7, the convention of P.8 and 12.2.1).
    """
    positive_number(flops_per_s, "flops_per_s")
    positive_number(link_bytes_per_s, "link_bytes_per_s")
    positive_number(alpha_s, "alpha_s", allow_zero=True)
    compute = layer_forward_flops(s, b, h, ffn, t, mlp_matrices) / flops_per_s
    one = 0.0 if t == 1 else costs.alpha_beta_time(t, activation_bytes(s, b, h, bytes_per_element), alpha_s, link_bytes_per_s)
    return {"t": t, "compute_s": compute, "comm_s": allreduces * one, "comm_fraction": allreduces * one / (compute + allreduces * one)}


def tp_sweep(s, b, h, ffn, degrees, flops_per_s, link_for_degree, alpha_s: float = 0.0, **kw) -> list[dict]:
    """:func:`tp_layer_times` over TP degrees; ``link_for_degree(t)`` gives the link bandwidth."""
    return [tp_layer_times(s, b, h, ffn, t, flops_per_s, link_for_degree(t), alpha_s, **kw) for t in degrees]


def book_link(t: int, node_size: int = 8) -> float:
    """12.2.1's links: NVLink (600 GB/s) within an 8-GPU node, InfiniBand (25 GB/s) across nodes."""
    return NVLINK_ALLREDUCE_BPS if t <= node_size else INFINIBAND_BPS


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


# ---- the sections' worked examples, recomputed ------------------------------------------------------

def book_p8(tokens: int = 8192, h: int = 4096, t: int = 4, layers: int = 32, link_bps: float = P8_LINK_BPS,
            bytes_per_element: int = 2) -> dict:
    """P.8's illustrative layer: activation MB, ring MB per device, ms per all-reduce, ms per forward."""
    S = activation_bytes(tokens, 1, h, bytes_per_element)
    sent = allreduce_bytes_per_device(tokens, 1, h, t, bytes_per_element)
    return {"activation MB": S / 1e6, "sent per device MB": sent / 1e6, "ms per all-reduce": sent / link_bps * 1e3,
            "all-reduces per forward": 2 * layers, "ms per forward": 2 * layers * sent / link_bps * 1e3}


def book_12_2_1(s: int = 2048, b: int = 32, h: int = 8192, ffn: int = 28672, t: int = 8, layers: int = 80,
                params: float = 70e9, hbm_gb: float = 80.0) -> dict:
    """12.2.1's 70B example recomputed (decimal GB; BF16; H100 989 TF/s; NVLink 600 GB/s; IB 25 GB/s)."""
    S = activation_bytes(s, b, h)
    sent = allreduce_bytes_per_device(s, b, h, t)
    gemm = 2 * s * b * h * (ffn / t)  # one MLP GEMM on this rank's 1/t of the FFN width
    mlp = 2 * gemm  # up- and down-projection (a GeLU MLP); SwiGLU has three such GEMMs
    return {
        "all-reduce payload, GB": S / 1e9,
        "sent per device per all-reduce, GB": sent / 1e9,
        "ms per all-reduce on NVLink": sent / NVLINK_ALLREDUCE_BPS * 1e3,
        "TFLOP, one MLP GEMM on 1/t of the FFN": gemm / 1e12,
        "TFLOP, MLP forward (two GEMMs) on 1/t": mlp / 1e12,
        "TFLOP, one GEMM on the full FFN width": gemm * t / 1e12,
        "ms, MLP forward (two GEMMs) at 989 TF/s": mlp / H100_BF16_FLOPS * 1e3,
        "comm / compute, one all-reduce per MLP forward": (sent / NVLINK_ALLREDUCE_BPS) / (mlp / H100_BF16_FLOPS),
        "ms per all-reduce on InfiniBand": sent / INFINIBAND_BPS * 1e3,
        "IB all-reduce / MLP compute": (sent / INFINIBAND_BPS) / (mlp / H100_BF16_FLOPS),
        "parameter GB per device": params * 2 / t / 1e9,
        "GB left of 80": hbm_gb - params * 2 / t / 1e9,
        "heads per GPU, 64 heads": 64 / t,
        "heads per GPU, 40 heads": 40 / t,
        "all-reduce payload per step, GB": layers * 4 * S / 1e9,
        "bytes sent per device per step, GB": layers * 4 * sent / 1e9,
        "s per step at 600 GB/s (sent bytes)": layers * 4 * sent / NVLINK_ALLREDUCE_BPS,
    }


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
