"""What real training recipes do beyond the parallelism, for :mod:`helpers.fake_world.step` (issue 26,
"Real recipes, traced with PyTorch's own code"): per-op selective activation checkpointing, the
loss on FP32-upcast logits, and the optimizer's implementation. Each is PyTorch's own mechanism,
configured as torchtitan configures it; the fake world traces it (shapes, bytes, FLOPs), so its
memory and FLOPs are what the recipe costs.

* **Per-op selective activation checkpointing** (:func:`op_sac_context_fn`): every block is run
  through ``torch.utils.checkpoint.checkpoint`` with ``context_fn`` from
  ``create_selective_checkpoint_contexts``, whose policy is torchtitan's ``selective_ac_option =
  "op"`` (``torchtitan/parallelisms/parallelize_llama.py``, ``_save_list`` and
  ``_get_custom_policy``, as of the 2024 runs of ``data/published/memory.csv``): the outputs of the
  ops in :func:`sac_save_ops` are saved, except every second ``aten.mm`` of a block (counted
  afresh in each block's forward, and again in its recompute), and everything else is recomputed
  in backward. In a Llama block the seven matmuls run as wq, wk, wv, wo, w1, w3, w2: wq, wv, w1
  and w2 are saved, wk, wo and w3 recomputed; attention's output and log-sum-exp are saved, so
  attention is not re-run.
* **The loss** (``loss_dtype``): torchtitan computes ``cross_entropy(pred.flatten(0, 1).float(),
  labels)``, on logits upcast to FP32 (``"float32"``): at a 128K vocabulary the FP32 logits, the
  log-softmax it keeps and the gradient are b x s x V x 4 bytes each; ``"bfloat16"`` takes the
  logits as the head gives them.
* **The optimizer** (``optimizer``, :data:`OPTIMIZERS`): ``torch.optim.AdamW`` with torchtitan's
  ``implementation`` choices: per parameter (``"for-loop"``: one parameter's update at a time, its
  temporaries the size of one parameter), ``"foreach"`` (``foreach=True``: the multi-tensor
  kernels, which allocate the square roots of every second moment of the group at once: 4 bytes
  per FP32 parameter shard, the step's temporaries) or ``"fused"`` (``fused=True``: one kernel,
  updated in place, no temporaries). torchtitan's default was foreach at 9dec370 (2024: ``fused``
  off) and ``fused`` at e7c0cae (2025).
"""
from __future__ import annotations

from collections import defaultdict

import torch

LOSS_DTYPES = ("float32", "bfloat16")
OPTIMIZERS = {
    "for-loop": {"foreach": False},  # the fake world's default (its published figures were measured with it)
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def sac_save_ops() -> frozenset:
    """The ops whose outputs torchtitan's per-op policy saves (``_save_list``): ``aten.mm`` (every
    second one recomputed), the flash and memory-efficient attention kernels (and cuDNN's, added
    later), the functional reduce-scatter (sequence parallelism's, so no collective is re-run),
    and ``aten.max`` (added with Float8, whose scales need it). The CPU flash kernel the fake
    tensors run (``_scaled_dot_product_flash_attention_for_cpu``) stands for the CUDA flash kernel
    it replaces: both give the attention output and its log-sum-exp."""
    from ..torch_private import sdpa_flash_cpu

    aten = torch.ops.aten
    return frozenset({aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
                      aten._scaled_dot_product_flash_attention.default,
                      aten._scaled_dot_product_cudnn_attention.default, sdpa_flash_cpu.default,
                      torch.ops._c10d_functional.reduce_scatter_tensor.default, aten.max.default})


def op_sac_context_fn(log: list | None = None):
    """The ``context_fn`` for ``torch.utils.checkpoint.checkpoint`` (through ``checkpoint_wrapper``)
    that applies torchtitan's per-op policy (module docstring). Each call (one per checkpointed
    forward) starts its own matmul counts, as torchtitan's ``selective_checkpointing_context_fn``.
    ``log``: a list that receives ``(op, saved)`` for every op of every forward (not of the
    recompute), in order."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save, mm = sac_save_ops(), torch.ops.aten.mm.default

    def context_fn():
        counts = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            if func == mm:
                counts[mode] += 1
            saved = func in save and not (func == mm and counts[mode] % 2 == 0)
            if log is not None and not ctx.is_recompute:
                log.append((func, saved))
            return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


def make_optimizer(params, implementation: str) -> torch.optim.Optimizer:
    """AdamW over ``params`` with the ``implementation`` of :data:`OPTIMIZERS` (module docstring)."""
    from .. import validate

    validate.one_of(implementation, "optimizer", tuple(OPTIMIZERS))
    return torch.optim.AdamW(params, lr=1e-4, **OPTIMIZERS[implementation])


def loss(out, labels, loss_dtype: str):
    """The last stage's loss: cross-entropy of the logits ``out`` (b, s, V) in ``loss_dtype`` (FP32:
    upcast first, as torchtitan), or, for a model without a vocabulary (``labels`` None), the mean
    square of its hidden states in that dtype."""
    x = out.float() if loss_dtype == "float32" else out
    if labels is None:
        return x.pow(2).mean()
    return torch.nn.functional.cross_entropy(x.flatten(0, 1), labels.flatten())
