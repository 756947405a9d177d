"""Data parallelism (P.6, 12.1.1): why averaging gradients is exact, and DDP on real ranks.

numpy side: the chapter's least-squares example, shards, the mean of shard means and its
weighted fix. torch side: a small MLP trained for k steps on one process (the reference) and with
``DistributedDataParallel`` on the launcher's ranks, on equal or unequal shards.
"""
from __future__ import annotations

import numpy as np

from .launcher.worker import device
from .memory import measure_model_state
from .validate import equal_parts, index_below, integer_at_least

# ---- numpy: the P.6 example ------------------------------------------------------------------

def mse_grad(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Gradient of 0.5 * mean((X @ w - y)**2) with respect to w (P.6)."""
    if len(X) == 0:
        raise ValueError("a shard must hold at least one example")
    return X.T @ (X @ w - y) / len(y)


def split_evenly(n: int, parts: int) -> list[np.ndarray]:
    """Indices 0..n-1 cut into ``parts`` equal shards; ValueError unless ``parts`` divides ``n``."""
    parts = equal_parts(n, parts, "{k} workers do not divide a batch of {n} evenly ({n} % {k} = {r})")
    return [np.arange(p.start, p.stop) for p in parts]


def split_at(n: int, sizes: list[int]) -> list[np.ndarray]:
    """Indices 0..n-1 cut into consecutive shards of the given sizes (which must sum to n)."""
    if any(s < 1 for s in sizes):
        raise ValueError(f"every shard needs at least one example, got sizes {sizes}")
    if sum(sizes) != n:
        raise ValueError(f"shard sizes {sizes} sum to {sum(sizes)}, not the batch size {n}")
    return np.split(np.arange(n), np.cumsum(sizes)[:-1])


def mean_of_shard_grads(X, y, w, shards) -> np.ndarray:
    """What all-reduce(average) of per-shard mean gradients returns: the plain mean of means."""
    return np.mean([mse_grad(X[i], y[i], w) for i in shards], axis=0)


def weighted_shard_grads(X, y, w, shards) -> np.ndarray:
    """Each shard's mean gradient weighted by its share of the batch: equals the full gradient."""
    n = sum(len(i) for i in shards)
    return sum(len(i) * mse_grad(X[i], y[i], w) for i in shards) / n


def effective_batch(per_worker: int, workers: int, accumulation: int = 1) -> int:
    """Examples per optimiser update: per-worker batch x workers x accumulation steps (P.6)."""
    for name, v in (("per_worker", per_worker), ("workers", workers), ("accumulation", accumulation)):
        integer_at_least(v, name)
    return per_worker * workers * accumulation


# ---- torch: a small model, its data, and training --------------------------------------------

def make_model(seed: int = 0, sizes=(8, 32, 1)):
    """A small MLP (Linear-Tanh-Linear), initialised from ``seed``: the same on every rank."""
    import torch

    torch.manual_seed(seed)
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(a, b, dtype=torch.float64), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def make_batches(steps: int, batch: int, seed: int = 1, features: int = 8):
    """``steps`` regression batches of ``batch`` examples each, identical on every rank."""
    import torch

    g = torch.Generator().manual_seed(seed)
    X = torch.randn(steps, batch, features, generator=g, dtype=torch.float64)
    y = torch.sin(X.sum(-1, keepdim=True)) + 0.1 * torch.randn(steps, batch, 1, generator=g, dtype=torch.float64)
    return X, y


def train_single(steps: int = 5, batch: int = 32, lr: float = 0.1, seed: int = 0):
    """Reference: ``steps`` SGD steps on one process over the whole batch. Returns (params, losses)."""
    import torch

    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    X, y = make_batches(steps, batch)
    losses = []
    for k in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(X[k]), y[k])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().clone() for p in model.parameters()], losses


def rank_rows(batch: int, rank: int, world: int) -> slice:
    """The contiguous rows of a ``batch`` that ``rank`` of ``world`` takes in an even split (P.6).

    Raises ``ValueError`` naming the constraint unless ``world`` divides ``batch``.
    """
    mine = equal_parts(batch, world, "world size {k} does not divide the batch {n}")[index_below(rank, "rank", world)]
    return slice(mine.start, mine.stop)


def shard_sizes_for(batch: int, world: int, sizes=None) -> list[int]:
    """Per-rank shard sizes: ``sizes`` as given (checked) or an even split of ``batch``."""
    if sizes is None:
        return [len(p) for p in equal_parts(batch, world, "world size {k} does not divide the batch {n}; pass sizes= for unequal shards")]
    if len(sizes) != world:
        raise ValueError(f"{len(sizes)} shard sizes given for {world} ranks")
    split_at(batch, list(sizes))  # validates
    return list(sizes)


def ddp_train_worker(steps: int = 5, batch: int = 32, lr: float = 0.1, seed: int = 0, sizes=None, weighted: bool = True):
    """Each rank trains its shard of every batch with DDP (P.6). Run on the launcher's ranks.

    DDP averages gradients over ranks, i.e. it computes the mean of per-rank means. With unequal
    shards that is not the full-batch gradient unless each rank scales its loss by
    ``world * n_rank / batch`` (``weighted=True``). Returns this rank's final parameters and its
    shard size.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = shard_sizes_for(batch, world, sizes)
    lo = sum(sizes[:rank])
    mine = slice(lo, lo + sizes[rank])
    model = DDP(make_model(seed).to(device()))  # NCCL reduces CUDA tensors only
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    X, y = (t.to(device()) for t in make_batches(steps, batch))
    scale = world * sizes[rank] / batch if weighted else 1.0
    for k in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(X[k][mine]), y[k][mine])
        (loss * scale).backward()
        opt.step()
    return {"params": [p.detach().clone() for p in model.parameters()], "shard": sizes[rank]}


# ---- 12.1.1: what a naive-DDP rank holds, and gradient accumulation with no_sync -------------

def mixed_precision_ddp_worker(sizes=(64, 256, 256, 8), steps: int = 2, batch: int = 16, seed: int = 0):
    """Naive DDP with the bf16 mixed-precision AdamW recipe of 12.1.1, measured on each rank.

    The model's weights and gradients are bf16; AdamW updates fp32 master copies and keeps two fp32
    moments per parameter. DDP uses ``gradient_as_bucket_view`` so the gradients live in its
    communication buckets and are not stored twice. Returns the parameter count and the bytes this
    rank holds per component after ``steps`` steps (see :func:`helpers.memory.measure_model_state`).
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(seed)
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to(torch.bfloat16)
    ddp = DDP(model, gradient_as_bucket_view=True)
    master = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.AdamW(master, lr=1e-3)
    g = torch.Generator().manual_seed(seed + 1 + dist.get_rank())
    for _ in range(steps):
        x = torch.randn(batch, sizes[0], generator=g).to(torch.bfloat16)
        ddp(x).float().pow(2).mean().backward()  # DDP all-reduces the bf16 gradients
        for m, p in zip(master, model.parameters()):
            m.grad = p.grad.float()
        opt.step()
        for m, p in zip(master, model.parameters()):
            m.grad = None  # the fp32 gradient copy is transient
            p.data.copy_(m.data)  # bf16 weights follow the fp32 master copy
    n_params = sum(p.numel() for p in model.parameters())
    return {"n_params": n_params, "held": measure_model_state(list(model.parameters()), opt, master)}


def accumulation_worker(micro_batches: int = 4, use_no_sync: bool = True, micro: int = 8, seed: int = 0):
    """Gradient accumulation over ``micro_batches`` with DDP, with or without ``no_sync`` (12.1.1).

    Without ``no_sync`` DDP all-reduces after every micro-batch's backward; with it, only after the
    last one. Both end with the same accumulated gradient. Returns the gradient (flattened).
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    integer_at_least(micro_batches, "micro_batches")
    ddp = DDP(make_model(seed))
    X, y = make_batches(micro_batches, micro * dist.get_world_size(), seed=seed + 1)
    rank = slice(dist.get_rank() * micro, (dist.get_rank() + 1) * micro)
    for k in range(micro_batches):
        last = k == micro_batches - 1
        ctx = ddp.no_sync() if (use_no_sync and not last) else _nullcontext()
        with ctx:
            loss = torch.nn.functional.mse_loss(ddp(X[k][rank]), y[k][rank]) / micro_batches
            loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in ddp.parameters()])


def accumulated_gradient_single(micro_batches: int = 4, world: int = 4, micro: int = 8, seed: int = 0):
    """Reference for :func:`accumulation_worker`: the same accumulation on one process."""
    import torch

    model = make_model(seed)
    X, y = make_batches(micro_batches, micro * world, seed=seed + 1)
    for k in range(micro_batches):
        (torch.nn.functional.mse_loss(model(X[k]), y[k]) / micro_batches).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _nullcontext():
    from contextlib import nullcontext

    return nullcontext()
