"""Data parallelism (P.6, 12.1.1): why averaging gradients is exact, and DDP on real ranks.

numpy side: the chapter's least-squares example, shards, the mean of shard means and its
weighted fix. torch side: a small MLP trained for k steps on one process (the reference) and with
``DistributedDataParallel`` on the launcher's ranks, on equal or unequal shards.
"""
from __future__ import annotations

import numpy as np


# ---- numpy: the P.6 example ------------------------------------------------------------------

def mse_grad(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Gradient of 0.5 * mean((X @ w - y)**2) with respect to w (P.6)."""
    if len(X) == 0:
        raise ValueError("a shard must hold at least one example")
    return X.T @ (X @ w - y) / len(y)


def split_evenly(n: int, parts: int) -> list[np.ndarray]:
    """Indices 0..n-1 cut into ``parts`` equal shards; ValueError unless ``parts`` divides ``n``."""
    if parts < 1 or n < 0:
        raise ValueError(f"need parts >= 1 and n >= 0, got parts={parts}, n={n}")
    if n % parts:
        raise ValueError(f"{parts} workers do not divide a batch of {n} evenly ({n} % {parts} = {n % parts})")
    return np.array_split(np.arange(n), parts)


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
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
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


def local_full_gradient_worker(X, y, w, sizes):
    """Data parallelism by hand (P.6): each rank takes its shard, all-reduce(SUM) of n_k * g_k / B.

    Exact for equal and unequal shards alike; returns the gradient every rank ends with.
    """
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    shards = split_at(len(y), list(sizes))
    idx = shards[rank]
    g = torch.from_numpy(len(idx) * mse_grad(X[idx], y[idx], w) / len(y))
    dist.all_reduce(g)  # SUM over ranks
    return g.numpy()


def shard_sizes_for(batch: int, world: int, sizes=None) -> list[int]:
    """Per-rank shard sizes: ``sizes`` as given (checked) or an even split of ``batch``."""
    if sizes is None:
        if batch % world:
            raise ValueError(f"world size {world} does not divide the batch {batch}; pass sizes= for unequal shards")
        return [batch // world] * world
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
    model = DDP(make_model(seed))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    X, y = make_batches(steps, batch)
    scale = world * sizes[rank] / batch if weighted else 1.0
    for k in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(X[k][mine]), y[k][mine])
        (loss * scale).backward()
        opt.step()
    return {"params": [p.detach().clone() for p in model.parameters()], "shard": sizes[rank]}
