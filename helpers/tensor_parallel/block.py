"""A Megatron transformer block on the ranks of a tensor-parallel group (12.2.1; SP of 12.3.1; P.8).

* :class:`BlockConfig` and :func:`make_block_params`: the shapes and full weights of one
  pre-LayerNorm block (attention + GeLU MLP), the same on every rank for the same seed;
  :func:`shard_block_params`: what each rank holds of them;
* :func:`reference_block`: the block on one process, the ground truth;
* :class:`ParallelBlock`: the block built from :mod:`helpers.tensor_parallel.layers`' column- and row-parallel
  layers, with dropout masks drawn per position and per head so that every layout drops the same
  elements (:func:`position_dropout_mask`, :func:`head_dropout_mask`);
* :class:`TorchBlock` and :func:`torch_tp_plan`: the same block for PyTorch's
  ``parallelize_module`` (``ColwiseParallel``/``RowwiseParallel``/``SequenceParallel``).

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

from ..tp_numpy import check_divides
from ..validate import integer_at_least, probability
from .layers import ColumnParallelLinear, RowParallelLinear, column_shard, row_shard, tp_rank_size

# ---- dropout with masks that do not depend on the layout --------------------------------------------

def _generator(seed: int | None, stream: int, index: int) -> torch.Generator | None:
    if seed is None:  # torch's global RNG, as nn.Dropout draws (what checkpoint's preserve_rng_state restores)
        return None
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
    seed: int | None = 0  # dropout seed; None draws the masks from torch's global RNG (one process only)
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

    def attention(self, qkv):
        """The attention core on this rank's heads (Q K^T, softmax, dropout, x V); a subclass may
        wrap it (selective recomputation, :mod:`helpers.recompute`)."""
        return attention_core(qkv, self.cfg, self.head_offset)

    def forward(self, x):
        cfg = self.cfg
        ctx = self.attention(to_local(self.qkv(self.ln1(x))))
        h1 = x + _row_dropout(to_local(self.o(ctx)), cfg, STREAM_ATTN_OUT, self.first_position)
        m = to_local(self.fc2(F.gelu(to_local(self.fc1(self.ln2(h1))), approximate="tanh")))
        return h1 + _row_dropout(m, cfg, STREAM_MLP_OUT, self.first_position)


def to_local(x):
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
