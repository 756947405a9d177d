"""Activation recomputation of a transformer block: none, selective, full (12.3.1; 12.1.1, 12.4.1).

Korthikanti et al. 2022 count what one layer keeps for backward (16-bit activations, 1-byte
dropout masks, FFN width 4h): s b h (34 + 5 a s / h). Recomputation trades those bytes for
FLOPs in backward (:data:`POLICIES`, the formulas in :mod:`helpers.costs`):

* ``"none"``: everything is kept;
* ``"selective"``: only the attention core (Q K^T, softmax, its dropout, x V) is recomputed; its
  5 a s^2 b bytes are not kept, Q, K and V (the core's input) are: 34 s b h;
* ``"full"``: only the layer's input is kept (2 s b h); backward first runs the layer's forward again.

This module runs :class:`helpers.tensor_parallel.block.TorchBlock` (the block of 12.2.1 and 12.3.1) under
``torch.utils.checkpoint`` (non-reentrant) with each policy (:class:`RecomputeBlock`) and
measures, on one process (:func:`measure`):

* the bytes autograd keeps for backward, with the saved-tensor hooks of
  :class:`helpers.sequence_parallel.SavedActivations` (each storage once, parameters excluded;
  what checkpoint keeps, its inputs, passes through the same hooks; what it keeps inside its
  region does not exist until backward);
* the FLOPs of forward and backward with ``torch.utils.flop_counter.FlopCounterMode`` (the
  recomputed forward runs inside backward and is counted there);
* the gradients, to compare with the block without checkpoint.

:func:`compare` sets the three policies beside the formulas; :func:`peak_growth` measures, with
``torch.distributed._tools.mem_tracker.MemTracker``, how the peak memory of a step grows with each
layer added to a stack (the planner's "kept bytes x layers" term, :mod:`helpers.planner.assess`).
With ``cfg.seed=None`` the block draws its dropout masks from torch's global RNG (as
``nn.Dropout`` does): checkpoint's ``preserve_rng_state`` is then what keeps the gradients right.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from . import costs
from .sequence_parallel import SavedActivations, is_layernorm_stat
from .tensor_parallel.block import BlockConfig, TorchBlock, as_config, make_block_params, torch_block_grads
from .validate import integer_at_least, one_of

POLICIES = costs.RECOMPUTE_POLICIES


class RecomputeBlock(TorchBlock):
    """:class:`~helpers.tensor_parallel.block.TorchBlock` with activation recomputation (one process, t = 1).

    ``policy="full"`` wraps the whole forward in ``checkpoint`` (only the input is kept);
    ``"selective"`` wraps only :meth:`TorchBlock.attention` (the attention core). Non-reentrant
    checkpoint; ``preserve_rng_state`` and ``early_stop`` are passed to it (``early_stop``: stop
    the recomputation as soon as the last tensor backward needs exists, PyTorch's default).
    """

    def __init__(self, P: dict, cfg: BlockConfig, policy: str = "none", preserve_rng_state: bool = True,
                 early_stop: bool = True):
        super().__init__(P, cfg)
        self.policy = one_of(policy, "the recomputation policy", POLICIES)
        self._ckpt = dict(use_reentrant=False, preserve_rng_state=bool(preserve_rng_state), early_stop=bool(early_stop))

    def attention(self, qkv):
        if self.policy == "selective":
            return checkpoint(super().attention, qkv, **self._ckpt)
        return super().attention(qkv)

    def forward(self, x):
        if self.policy == "full":
            return checkpoint(super().forward, x, **self._ckpt)
        return super().forward(x)


def _check_shape(cfg: BlockConfig, s: int, b: int) -> tuple[int, int]:
    return integer_at_least(s, "the sequence length s"), integer_at_least(b, "the micro-batch b")


def measure_block(block: TorchBlock, s: int, b: int, dtype=torch.bfloat16, rng_seed: int = 0) -> dict:
    """One forward and backward of ``block`` (a :class:`~helpers.tensor_parallel.block.TorchBlock`, e.g. a
    :class:`RecomputeBlock`, in ``dtype``) on (s, b, h) inputs; returns

    ``saved`` (bytes kept for backward at the end of forward: every storage once, parameters
    excluded), ``layernorm_stats`` (its part that is LayerNorm's per-token mean and 1/std, which
    the formula leaves out), ``activations`` (the rest), ``entries`` (shape, dtype, bytes),
    ``forward_flops``, ``backward_flops`` (FlopCounterMode; the recomputation is in backward),
    ``out``, ``grads`` (in :func:`~helpers.tensor_parallel.block.make_block_params` names, plus ``"x"``).
    Inputs and upstream gradient are fixed by ``rng_seed``; so is the global RNG before forward
    (used by the dropout masks when ``cfg.seed is None``); the caller's RNG state is restored.
    """
    if not isinstance(block, TorchBlock):
        raise TypeError(f"block must be a helpers.tensor_parallel.block.TorchBlock (or a subclass), got {type(block).__name__}")
    cfg = block.cfg
    s, b = _check_shape(cfg, s, b)
    g = torch.Generator().manual_seed(rng_seed)
    x = torch.randn(s, b, cfg.h, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    upstream = torch.randn(s, b, cfg.h, generator=g, dtype=torch.float64).to(dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng_seed)
        with FlopCounterMode(display=False) as fwd, SavedActivations(exclude=list(block.parameters())) as log:
            out = block(x)
        with FlopCounterMode(display=False) as bwd:
            out.backward(upstream)
    stats = sum(e[2] for e in log.entries if is_layernorm_stat(e, s, b))
    grads = torch_block_grads(block)
    grads["x"] = x.grad.detach().clone()
    return {"policy": getattr(block, "policy", None), "saved": log.total_bytes, "layernorm_stats": stats,
            "activations": log.total_bytes - stats, "entries": log.entries, "forward_flops": fwd.get_total_flops(),
            "backward_flops": bwd.get_total_flops(), "out": out.detach(), "grads": grads}


def measure(cfg: BlockConfig | dict | None, s: int, b: int, policy: str, dtype=torch.bfloat16, *,
            preserve_rng_state: bool = True, early_stop: bool = True, rng_seed: int = 0) -> dict:
    """:func:`measure_block` of a :class:`RecomputeBlock` with ``policy`` (weights of
    :func:`~helpers.tensor_parallel.block.make_block_params`, seed 0, in ``dtype``)."""
    cfg = as_config(cfg)
    block = RecomputeBlock(make_block_params(cfg, 0, dtype), cfg, policy, preserve_rng_state, early_stop)
    return measure_block(block, s, b, dtype, rng_seed)


def formula_check(cfg: BlockConfig) -> BlockConfig:
    """ValueError unless the block has the shapes Korthikanti's count assumes: FFN width 4h and
    dropout on (p_drop > 0: the formula counts the 1-byte masks)."""
    cfg = as_config(cfg)
    if cfg.ffn != 4 * cfg.h:
        raise ValueError(f"Korthikanti et al.'s count assumes FFN width 4h = {4 * cfg.h}, got ffn={cfg.ffn}")
    if cfg.p_drop == 0:
        raise ValueError("Korthikanti et al.'s count includes the dropout masks: use p_drop > 0")
    return cfg


def modelled(cfg: BlockConfig, s: int, b: int, policy: str) -> dict:
    """The formulas of :mod:`helpers.costs` at the block's shape: bytes kept per layer, forward
    FLOPs F, FLOPs of forward + backward (3F plus what the policy recomputes)."""
    cfg = formula_check(cfg)
    s, b = _check_shape(cfg, s, b)
    F = costs.layer_forward_flops(s * b, cfg.h, cfg.ffn, s)
    return {"kept": costs.recompute_kept_bytes(policy, s, b, cfg.h, cfg.heads),
            "rematerialised": costs.recompute_rematerialised_bytes(policy, s, b, cfg.h, cfg.heads),
            "forward_flops": F, "step_flops": 3 * F + costs.recompute_forward_flops(policy, s * b, cfg.h, cfg.ffn, s)}


def max_grad_difference(a: dict, b: dict) -> float:
    """Largest |difference| over all gradients of two :func:`measure` results (0.0: bitwise equal)."""
    return max((a["grads"][k].double() - b["grads"][k].double()).abs().max().item() for k in a["grads"])


def compare(cfg: BlockConfig, s: int, b: int, dtype=torch.bfloat16, early_stop: bool = True) -> list[dict]:
    """Each policy measured beside its model: one row per policy with the measured bytes
    (activations, LayerNorm stats), the formula's kept bytes, step FLOPs measured and modelled,
    their ratio to "none", and the largest gradient difference from the block without checkpoint."""
    cfg = formula_check(cfg)
    runs = {p: measure(cfg, s, b, p, dtype, early_stop=early_stop) for p in POLICIES}
    base = runs["none"]
    rows = []
    for p, r in runs.items():
        m = modelled(cfg, s, b, p)
        step = r["forward_flops"] + r["backward_flops"]
        rows.append({"policy": p, "measured": r["activations"], "layernorm_stats": r["layernorm_stats"],
                     "formula": m["kept"], "step_flops": step, "model_flops": m["step_flops"],
                     "flops_ratio": step / (base["forward_flops"] + base["backward_flops"]),
                     "model_ratio": m["step_flops"] / modelled(cfg, s, b, "none")["step_flops"],
                     "grad_diff": max_grad_difference(r, base), "run": r})
    return rows


def rng_check(cfg: BlockConfig, s: int, b: int, policy: str, dtype=torch.bfloat16) -> dict:
    """Gradient differences from the un-checkpointed block with checkpoint's RNG preservation on
    and off, for a block whose dropout draws from the global RNG (``cfg.seed`` set to None)."""
    cfg = as_config(cfg)
    if cfg.p_drop == 0:
        raise ValueError("the RNG matters only with dropout: use p_drop > 0")
    cfg = replace(cfg, seed=None)
    base = measure(cfg, s, b, "none", dtype)
    return {flag: max_grad_difference(measure(cfg, s, b, policy, dtype, preserve_rng_state=flag), base)
            for flag in (True, False)}


def peak_bytes(cfg: BlockConfig, s: int, b: int, policy: str, layers: int, dtype=torch.bfloat16) -> int:
    """Peak memory over one forward + backward of a stack of ``layers`` blocks, parameters left
    out, as ``MemTracker`` counts it (activations, their gradients, weight gradients, temporaries)."""
    from .torch_private import MemTracker

    cfg = as_config(cfg)
    s, b = _check_shape(cfg, s, b)
    layers = integer_at_least(layers, "layers")
    P = make_block_params(cfg, 0, dtype)
    net = torch.nn.Sequential(*[RecomputeBlock(P, cfg, policy) for _ in range(layers)])
    x = torch.randn(s, b, cfg.h, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype).requires_grad_()
    tracker = MemTracker()
    tracker.track_external(net, x)
    with tracker:
        net(x).float().sum().backward()
    peak = tracker.get_tracker_snapshot("peak")[x.device]
    return peak["Total"] - sum(v for k, v in peak.items() if getattr(k, "value", None) == "Parameter")


def peak_growth(cfg: BlockConfig, s: int, b: int, policy: str, layers=(1, 3), dtype=torch.bfloat16) -> float:
    """Bytes the step's peak grows by per layer added to the stack, between ``layers[0]`` and
    ``layers[1]`` blocks: each layer's kept bytes, when they exceed the layer's weight gradients
    (else the peak moves to the end of backward and grows by the gradients)."""
    lo, hi = (integer_at_least(n, "layers") for n in layers)
    if hi <= lo:
        raise ValueError(f"layers must be two increasing stack depths, got {layers!r}")
    return (peak_bytes(cfg, s, b, policy, hi, dtype) - peak_bytes(cfg, s, b, policy, lo, dtype)) / (hi - lo)
