"""A Llama-style decoder built from a :class:`helpers.planner.Model`, one pipeline stage at a time
(12.2.1, 12.3.1, 12.4.1, 12.4.2, P.11; used by :mod:`helpers.fake_world`).

The same planner ``Model`` that the layout planner reads (hidden, FFN, heads, KV heads, layers,
vocabulary, sequence length) becomes real ``torch.nn`` modules here, so the planner's figures and
what PyTorch holds can be compared on one object:

* :class:`Attention`: Q, K, V and output projections (grouped-query attention when
  ``kv_heads < heads``), rotary position embedding, ``F.scaled_dot_product_attention`` (causal,
  GQA inside the kernel); under context parallelism K and V are all-gathered over the CP group,
  as Llama 3 did (their gradients are reduce-scattered in backward);
* :class:`FeedForward`: SwiGLU when ``mlp_matrices == 3`` (Llama), GeLU MLP when 2 (GPT);
* :class:`Block`: pre-norm residual block (:class:`RMSNorm`), optional :class:`Dropout` after
  attention and MLP (Korthikanti et al.'s accounting keeps those two 1-byte masks); both keep
  for backward what their CUDA kernels keep, not what the CPU kernels under the fake tensors
  would (the rest of the model is plain ``torch.nn``, whose kernels keep the same on both);
* :class:`Stage`: the layers of one pipeline stage; the first stage also has the token embedding,
  the last the final norm and the output head. Models without a vocabulary (``vocab == 0``, such
  as the chapters' 100B and 40B, whose vocabulary the book does not give) take hidden states in and
  give hidden states out.

:func:`tp_plan` is the ``parallelize_module`` plan (Megatron's column/row split, with sequence
parallelism on the norms and dropouts when asked), as torchtitan writes it for Llama.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

DROPOUT_P = 0.1


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm keeping what the fused CUDA kernel keeps for backward: the input and the FP32
    reciprocal RMS per token. (On the CPU, which fake tensors run on, ``torch.rms_norm`` is
    decomposed into steps that keep two FP32 copies of the input instead of the BF16 input: 6 bytes
    per element more, measured beside torchtitan's ``nn.RMSNorm``: benchmarks/torchtitan_compare.py.)"""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, g):
        x, weight, rstd = ctx.saved_tensors
        acc = rstd.dtype
        n = x.to(acc) * rstd
        gn = g.to(acc) * weight.to(acc)
        gx = rstd * (gn - n * (gn * n).mean(-1, keepdim=True))
        gw = (g.to(acc) * n).sum(dim=tuple(range(g.dim() - 1)))
        return gx.to(x.dtype), gw.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return _RMSNormFunction.apply(x, self.weight, self.eps)


class Dropout(nn.Module):
    """Dropout through ``native_dropout``, which keeps a 1-byte mask as the CUDA kernel does (the
    CPU path of ``F.dropout`` keeps a mask in the activations' dtype, 2 bytes in BF16)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        return torch.native_dropout(x, self.p, True)[0]


def stage_layer_ids(layers: int, stages: list) -> list:
    """Global layer indices of each stage, for per-stage layer counts ``stages`` (summing to ``layers``)."""
    if sum(stages) != layers:
        raise ValueError(f"the stages' layer counts {stages} sum to {sum(stages)}, not the model's {layers} layers")
    out, start = [], 0
    for n in stages:
        out.append(list(range(start, start + n)))
        start += n
    return out


def rope_tables(positions: torch.Tensor, head_dim: int, dtype, theta: float = 500000.0):
    """cos and sin of rotary embedding for ``positions`` (shape (s,)), each (s, head_dim) in ``dtype``."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, cp_group=None):
        super().__init__()
        self.head_dim = head_dim
        self.wq = nn.Linear(hidden, heads * head_dim, bias=False)
        self.wk = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, hidden, bias=False)
        self.cp_group = cp_group

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)  # -1: the heads this TP rank holds
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        causal = True
        if self.cp_group is not None:
            # Llama 3's context parallelism: all-gather K and V of every CP rank (backward:
            # reduce-scatter of their gradients). The load-balanced causal mask of the 2 x CP
            # chunks is not applied (values are not those of causal attention; shapes, bytes
            # and communication are; FLOPs are counted for full attention, as PyTorch's counter
            # does for causal attention anyway).
            from ..torch_private import all_gather_single_autograd

            k = all_gather_single_autograd(k.contiguous(), gather_dim=2, group=self.cp_group)
            v = all_gather_single_autograd(v.contiguous(), gather_dim=2, group=self.cp_group)
            causal = False
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, hidden: int, ffn: int, gated: bool):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False) if gated else None

    def forward(self, x):
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x)))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, model, dropout: bool = False, cp_group=None):
        super().__init__()
        self.attention_norm = RMSNorm(model.hidden)
        self.attention = Attention(model.hidden, model.heads, model.kv, model.hd, cp_group)
        self.ffn_norm = RMSNorm(model.hidden)
        self.feed_forward = FeedForward(model.hidden, model.ffn, model.mlp_matrices == 3)
        self.attention_dropout = Dropout(DROPOUT_P) if dropout else nn.Identity()
        self.ffn_dropout = Dropout(DROPOUT_P) if dropout else nn.Identity()

    def forward(self, x, cos, sin):
        x = x + self.attention_dropout(self.attention(self.attention_norm(x), cos, sin))
        return x + self.ffn_dropout(self.feed_forward(self.ffn_norm(x)))


class Stage(nn.Module):
    """The layers ``layer_ids`` of a decoder; the embedding if ``first``, norm and head if ``last``."""

    def __init__(self, model, layer_ids, first: bool, last: bool, dropout: bool = False, cp_group=None):
        super().__init__()
        self.head_dim = model.hd
        self.tok_embeddings = nn.Embedding(model.vocab, model.hidden) if first and model.vocab else None
        self.layers = nn.ModuleDict({str(i): Block(model, dropout, cp_group) for i in layer_ids})
        self.norm = RMSNorm(model.hidden) if last else None
        self.output = nn.Linear(model.hidden, model.vocab, bias=False) if last and model.vocab else None

    def forward(self, x, positions):
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        cos, sin = rope_tables(positions, self.head_dim, h.dtype)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h


def tp_plan(stage: Stage, sequence_parallel: bool) -> tuple:
    """(plan for the stage's own modules, plan for every block) for ``parallelize_module``.

    Megatron's split: Q, K, V and the first MLP matrices column-wise, the output projection and
    the last MLP matrix row-wise; with ``sequence_parallel`` the norms (and the dropouts, which
    act on the block's sequence-sharded residual) run on s/t positions, each row-wise output is
    reduce-scattered along the sequence and each block input all-gathered (torchtitan's plan).
    The output head returns vocabulary-sharded logits for ``loss_parallel``.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    sp = sequence_parallel
    act = Shard(1) if sp else Replicate()
    top = {}
    if stage.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=act)
    if stage.norm is not None and sp:
        top["norm"] = SequenceParallel()
    if stage.output is not None:
        top["output"] = ColwiseParallel(input_layouts=act, output_layouts=Shard(-1), use_local_output=False)
    block = {
        "attention": PrepareModuleInput(input_layouts=(act, None, None), desired_input_layouts=(Replicate(), None, None)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=act),
        "feed_forward": PrepareModuleInput(input_layouts=(act,), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=act),
    }
    if stage.layers and next(iter(stage.layers.values())).feed_forward.w3 is not None:
        block["feed_forward.w3"] = ColwiseParallel()
    if sp:
        block["attention_norm"] = SequenceParallel()
        block["ffn_norm"] = SequenceParallel()
    return top, block
