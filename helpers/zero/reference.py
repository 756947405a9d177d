"""ZeRO on paper and in numpy (12.1.2): what each stage sends, and why sharding the optimizer is exact.

* :func:`comm_bytes_per_rank` and :func:`collectives_per_step`: the bytes one rank sends per step
  under a ring (on :mod:`helpers.costs`) and the collectives the hand-built stages issue.
* AdamW is elementwise, so updating one chunk with its own moments gives exactly the numbers a
  full update gives there; ZeRO-1 on simulated devices (reduce-scatter, local AdamW, all-gather)
  equals DDP (all-reduce, full AdamW): :func:`adamw_numpy`, :func:`zero1_numpy`, :func:`ddp_numpy`.

Torch-free. The stages on ranks are :mod:`helpers.zero` (built on :mod:`helpers.zero.hand`).

Units: bytes throughout. The chapter's 2|θ| and 3|θ| are multiples of one copy of the
communicated parameters in bytes (count x bytes per element); per rank, a ring sends (M-1)/M of
that per reduce-scatter or all-gather (:func:`comm_bytes_per_rank`).
"""
from __future__ import annotations

import math

import numpy as np

from .. import costs
from ..collectives import all_gather, reduce_scatter, ring_allreduce
from ..validate import integer_at_least, positive_number
from ..validate import zero_stage as check_zero_stage

# ---- models of the communication ------------------------------------------------------------

def comm_bytes_per_rank(n_params: float, world_size: int, zero_stage: int, bytes_per_element: float = 2) -> dict:
    """Bytes one rank sends per training step under a ring, by collective (12.1.2).

    Stage 0 (naive DDP): one all-reduce of the gradients, 2(M-1)/M x S with S = n_params x
    bytes_per_element. Stages 1 and 2: a reduce-scatter of the gradients and an all-gather of the
    updated parameters, (M-1)/M x S each. Stage 3: two all-gathers of the parameters (forward and
    backward) and one reduce-scatter. ``"units"`` is the total in the chapter's units of
    (M-1)/M x S: 2, 2, 2, 3.
    """
    positive_number(n_params, "n_params")
    integer_at_least(world_size, "world_size")
    check_zero_stage(zero_stage)
    positive_number(bytes_per_element, "bytes_per_element")
    payload = n_params * bytes_per_element
    unit = costs.ring_bytes_sent("reduce_scatter", payload, world_size)
    parts = {"all_reduce": 0.0, "reduce_scatter": 0.0, "all_gather": 0.0}
    if zero_stage == 0:
        parts["all_reduce"] = costs.allreduce_bytes(world_size, payload)
    else:
        parts["reduce_scatter"] = unit
        parts["all_gather"] = (2 if zero_stage == 3 else 1) * unit
    total = sum(parts.values())
    return {**parts, "total": total, "units": total / unit if unit else float(2 + (zero_stage == 3))}


def collectives_per_step(zero_stage: int, n_layers: int, micro_batches: int = 1, defer: bool = False) -> dict:
    """How many collectives each rank issues per optimizer step in :func:`zero_train_worker`.

    Stage 0: one all-reduce; stage 1: one reduce-scatter and one all-gather (all layers packed
    together); stage 2: one reduce-scatter per layer per backward (per micro-batch, or only in the
    last one when ``defer``) and one packed all-gather; stage 3: per micro-batch, one all-gather
    per layer in forward and in backward and one reduce-scatter per layer.
    """
    check_zero_stage(zero_stage)
    integer_at_least(n_layers, "n_layers")
    integer_at_least(micro_batches, "micro_batches")
    if zero_stage == 0:
        return {"all_reduce": 1, "reduce_scatter": 0, "all_gather": 0}
    if zero_stage == 1:
        return {"all_reduce": 0, "reduce_scatter": 1, "all_gather": 1}
    if zero_stage == 2:
        return {"all_reduce": 0, "reduce_scatter": n_layers * (1 if defer else micro_batches), "all_gather": 1}
    return {"all_reduce": 0, "reduce_scatter": n_layers * micro_batches, "all_gather": 2 * n_layers * micro_batches}


# ---- numpy: the optimizer step is elementwise, so it shards -----------------------------------

def adamw_numpy(p, g, m, v, t: int, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
    """One AdamW step in numpy, PyTorch's formula; returns new (p, m, v). Elementwise in every array."""
    if t < 1:
        raise ValueError(f"the step count t starts at 1, got {t}")
    b1, b2 = betas
    p = p * (1 - lr * weight_decay)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v) / math.sqrt(1 - b2**t) + eps
    return p - lr / (1 - b1**t) * m / denom, m, v


def _lsq_grads(w, Xs, ys):
    return np.stack([X.T @ (X @ w - y) / len(y) for X, y in zip(Xs, ys)])


def ddp_numpy(w0, Xs, ys, steps: int, **adamw):
    """Naive DDP on simulated devices: every device all-reduces (ring) and updates everything."""

    w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    n_dev = len(Xs)
    for t in range(1, steps + 1):
        g = ring_allreduce(_lsq_grads(w, Xs, ys))[0] / n_dev
        w, m, v = adamw_numpy(w, g, m, v, t, **adamw)
    return w


def zero1_numpy(w0, Xs, ys, steps: int, **adamw):
    """ZeRO-1 on simulated devices: reduce-scatter, AdamW on the owned chunk, all-gather.

    Device d keeps moments only for chunk d (1/M of them). Returns (final w on every device, the
    per-device moment lengths).
    """

    n_dev, n = len(Xs), len(w0)
    if n % n_dev:
        raise ValueError(f"{n_dev} devices do not divide {n} parameters into equal chunks")
    c = n // n_dev
    w = np.tile(w0, (n_dev, 1))  # every device's copy of the parameters
    m, v = np.zeros((n_dev, c)), np.zeros((n_dev, c))
    for t in range(1, steps + 1):
        grads = np.stack([_lsq_grads(w[d], Xs[d : d + 1], ys[d : d + 1])[0] for d in range(n_dev)])
        owned = reduce_scatter(grads) / n_dev  # device d: the summed gradient of chunk d
        new = np.empty((n_dev, c))
        for d in range(n_dev):
            new[d], m[d], v[d] = adamw_numpy(w[d, d * c : (d + 1) * c], owned[d], m[d], v[d], t, **adamw)
        w = all_gather(new)
    return w, [m[d].size + v[d].size for d in range(n_dev)]
