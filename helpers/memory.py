"""Memory accounting for data-parallel training (12.1.1 naive DDP; 12.1.2 ZeRO stages).

Bytes per parameter, split by component, for a precision recipe and an optimizer (the table lives
in :mod:`helpers.costs`: :func:`bytes_per_param`, :data:`PRECISIONS`, :data:`OPTIMIZERS`); per-device
model-state memory for a world size and a ZeRO stage (0 = naive DDP, every device holds it all);
and the measurement of what a real PyTorch model and optimizer hold, to put beside the model.

Units: sizes in bytes; the chapters' "GB" is decimal (1e9 bytes), and so is :data:`GB`.
"""
from __future__ import annotations

import math

from . import costs
from .costs import COMPONENTS, OPTIMIZERS, PRECISIONS, BytesPerParam, bytes_per_param  # noqa: F401 (this section's names)
from .validate import integer_at_least, positive_number
from .validate import zero_stage as check_zero_stage

GB = 1e9


def _check_counts(n_params, world_size):
    positive_number(n_params, "n_params")
    integer_at_least(world_size, "world_size")


def per_device_bytes(
    n_params: float, world_size: int = 1, zero_stage: int = 0, precision: str = "bf16-mixed", optimizer: str = "adamw"
) -> dict[str, float]:
    """Model-state bytes one device holds, by component, under ZeRO stage 0-3 (12.1.1, 12.1.2).

    Stage 0 is naive DDP (nothing sharded); stage 1 shards the optimizer state (master + moments)
    over ``world_size`` devices, stage 2 the gradients too, stage 3 the weights too.
    Activations are not model state and are not counted.
    """
    _check_counts(n_params, world_size)
    zero_stage = check_zero_stage(zero_stage)
    b = bytes_per_param(precision, optimizer)
    shard = lambda stage: world_size if zero_stage >= stage else 1
    return {
        "weights": n_params * b.weights / shard(3),
        "gradients": n_params * b.gradients / shard(2),
        "master": n_params * b.master / shard(1),
        "moments": n_params * b.moments / shard(1),
    }


def per_device_total(n_params: float, world_size: int = 1, zero_stage: int = 0, precision="bf16-mixed", optimizer="adamw") -> float:
    """Sum of :func:`per_device_bytes`."""
    return sum(per_device_bytes(n_params, world_size, zero_stage, precision, optimizer).values())


def max_params_that_fit(device_bytes: float, world_size: int = 1, zero_stage: int = 0, precision="bf16-mixed", optimizer="adamw", reserve_bytes: float = 0.0) -> float:
    """Largest parameter count whose model state fits in ``device_bytes - reserve_bytes``."""
    if device_bytes <= 0 or reserve_bytes < 0 or reserve_bytes >= device_bytes:
        raise ValueError("need device_bytes > reserve_bytes >= 0")
    return (device_bytes - reserve_bytes) / per_device_total(1.0, world_size, zero_stage, precision, optimizer)


def allreduce_bytes_per_rank(n_params: float, world_size: int, grad_bytes: int = 2) -> float:
    """Bytes each rank sends in a ring all-reduce of the gradients: 2(M-1)/M * |theta| * grad_bytes."""
    _check_counts(n_params, world_size)
    return costs.allreduce_bytes(world_size, n_params * grad_bytes)


def min_tokens_per_gpu(n_params: float, allreduce_s: float, flops_per_s: float, ratio: float = 3.0) -> float:
    """Tokens each GPU must process per step so that compute is ``ratio`` x the all-reduce time.

    12.1.1's rule of thumb (compute at least 2-3x the all-reduce), with the usual estimate of
    6 * n_params FLOPs per token for forward plus backward.
    """
    if min(n_params, allreduce_s, flops_per_s, ratio) <= 0:
        raise ValueError("n_params, allreduce_s, flops_per_s and ratio must all be positive")
    return ratio * allreduce_s * flops_per_s / costs.training_flops_per_token(n_params)


# ---- measuring what real tensors hold (inside a rank or in one process) ---------------------

def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a shared storage counts once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def measure_model_state(params, optimizer=None, master=None) -> dict[str, int]:
    """Bytes a process holds, by component: weights, gradients, master copy, optimizer moments.

    ``params`` are the model's parameters (their ``.grad`` count as gradients); ``master`` the
    fp32 copies a mixed-precision recipe keeps (if any); ``optimizer`` a torch optimizer whose
    per-parameter state tensors (Adam's ``exp_avg`` and ``exp_avg_sq``...) count as moments.
    The optimizer's step counters (state key ``"step"``) are reported apart as ``counters``; a
    one-element moment (of a one-element bias) stays a moment.
    """
    import torch

    params = list(params)
    moments, counters = [], []
    if optimizer is not None:
        for state in optimizer.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    (counters if k == "step" else moments).append(v)
    return {
        "weights": tensor_bytes(params),
        "gradients": tensor_bytes(p.grad for p in params),
        "master": tensor_bytes(master or []),
        "moments": tensor_bytes(moments),
        "counters": tensor_bytes(counters),
    }


# ---- 12.1.2: which ZeRO stage, and how many devices, a model needs ------------------------------

def smallest_stage_that_fits(n_params: float, device_bytes: float, world_size: int, reserve_bytes: float = 0.0,
                             precision: str = "bf16-mixed", optimizer: str = "adamw"):
    """The lowest ZeRO stage (0-3) whose per-device model state fits in ``device_bytes - reserve_bytes``.

    Returns None when even stage 3 does not fit on ``world_size`` devices (12.1.2: "use Stage 3
    only when the model state does not fit even with Stage 2").
    """
    _check_counts(n_params, world_size)
    if device_bytes <= 0 or reserve_bytes < 0 or reserve_bytes >= device_bytes:
        raise ValueError("need device_bytes > reserve_bytes >= 0")
    for stage in range(4):
        if per_device_total(n_params, world_size, stage, precision, optimizer) <= device_bytes - reserve_bytes:
            return stage
    return None


def min_world_size_to_fit(n_params: float, device_bytes: float, zero_stage: int, reserve_bytes: float = 0.0,
                          precision: str = "bf16-mixed", optimizer: str = "adamw"):
    """The fewest devices on which ``n_params`` fits under ``zero_stage`` (12.1.2), or None if none does.

    Stage s keeps an unsharded part (stage 0: everything; stage 1: weights and gradients; stage 2:
    weights; stage 3: nothing) that no number of devices removes; when that part alone does not
    fit, the answer is None.
    """
    _check_counts(n_params, 1)
    if device_bytes <= 0 or reserve_bytes < 0 or reserve_bytes >= device_bytes:
        raise ValueError("need device_bytes > reserve_bytes >= 0")
    zero_stage = check_zero_stage(zero_stage)
    room = device_bytes - reserve_bytes
    one = per_device_bytes(n_params, 1, zero_stage, precision, optimizer)
    b = bytes_per_param(precision, optimizer)
    fixed = n_params * ((b.weights if zero_stage < 3 else 0) + (b.gradients if zero_stage < 2 else 0)
                        + (b.optimizer_state if zero_stage < 1 else 0))
    sharded = sum(one.values()) - fixed
    if fixed > room or (fixed == room and sharded > 0):
        return None
    m = max(1, math.ceil(sharded / (room - fixed))) if sharded > 0 else 1
    while per_device_total(n_params, m, zero_stage, precision, optimizer) > room:  # guard against rounding
        m += 1
    return m
