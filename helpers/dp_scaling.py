"""What data parallelism buys and what a larger batch changes (P.6).

* :func:`throughput_worker`: one global batch split over the ranks, DDP; the time per step, the
  samples per second, the time one all-reduce of the gradients takes alone, and the model state
  each rank holds (:func:`helpers.memory.measure_model_state`). Run it on 1, 2 and 4 ranks: the
  compute per rank falls as 1/N, the memory per replica does not.
* :func:`train_epochs`: SGD on one process over shuffled mini-batches for a number of epochs,
  for the linear scaling rule (a k times larger batch takes k times fewer steps per epoch and
  needs about k times the learning rate, :func:`helpers.costs.linear_scaled_lr`).
* :func:`big_batch_gradient`: one backward pass over the concatenation of the micro-batches that
  :func:`helpers.data_parallel.accumulation_worker` accumulates on the ranks: the two are equal.
"""
from __future__ import annotations

from .costs import step_time
from .data_parallel import make_batches, make_model, rank_rows
from .launcher.worker import device
from .memory import measure_model_state
from .validate import integer_at_least, positive_number

THROUGHPUT_SIZES = (64, 512, 512, 512, 1)


def throughput_worker(global_batch: int = 512, sizes=THROUGHPUT_SIZES, steps: int = 5, warmup: int = 2, seed: int = 0):
    """DDP with AdamW on ``global_batch / N`` rows per rank, float32 (P.6). Returns the median
    seconds per step and of its parts (``compute_s``: forward and backward with DDP's
    all-reduce; ``optimizer_s``: the AdamW step, which every replica repeats in full), the
    median seconds of one blocking all-reduce of all the gradients alone, the parameter count
    and the bytes this rank holds (weights, gradients, moments). Gradients are views into DDP's buckets
    (``gradient_as_bucket_view``), so they are not stored twice."""
    import statistics
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(seed, sizes).float().to(device())
    ddp = DDP(model, gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    X, y = make_batches(1, global_batch, features=sizes[0])
    mine = rank_rows(global_batch, rank, world)
    x, t = X[0][mine].float().to(device()), y[0][mine].float().to(device())
    times = {"step": [], "compute": [], "optimizer": []}
    for k in range(integer_at_least(warmup, "warmup", 0) + integer_at_least(steps, "steps")):
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(ddp(x), t).backward()
        mid = time.perf_counter()
        opt.step()
        if k >= warmup:
            end = time.perf_counter()
            for name, dt in (("step", end - start), ("compute", mid - start), ("optimizer", end - mid)):
                times[name].append(dt)
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    comm = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(flat)
        comm.append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"world": world, "rows": mine.stop - mine.start, "step_s": med["step"], "compute_s": med["compute"],
            "optimizer_s": med["optimizer"], "samples_per_s": global_batch / med["step"],
            "allreduce_s": statistics.median(comm), "n_params": sum(p.numel() for p in model.parameters()),
            "held": measure_model_state(list(model.parameters()), opt)}


def scaling_table(runs: dict, cores: int) -> list[dict]:
    """Measured beside modelled for :func:`throughput_worker` runs on several world sizes
    (``runs``: N -> Run, N = 1 included). Per N, with the slowest rank's figures (it sets the
    pace): the measured step and samples per second, and the model
    T(N) = compute(1) / N + optimizer(1) + all-reduce(N) (no overlap assumed), also with the
    compute divided by min(N, ``cores``) only: N processes on fewer cores share them."""

    base = max(runs[1].results, key=lambda r: r["step_s"])
    rows = []
    for n, run in sorted(runs.items()):
        r = max(run.results, key=lambda r: r["step_s"])
        comm = r["allreduce_s"] if n > 1 else 0.0
        model = step_time(base["compute_s"] / n + base["optimizer_s"], comm)
        model_cores = step_time(base["compute_s"] / min(n, integer_at_least(cores, "cores")) + base["optimizer_s"], comm)
        rows.append({"N": n, "rows per rank": r["rows"], "step_s": r["step_s"], "samples_per_s": r["samples_per_s"],
                     "allreduce_s": r["allreduce_s"], "model_s": model, "model_cores_s": model_cores,
                     "model_samples_per_s": base["rows"] / model_cores})
    return rows


def _regression(n: int, seed: int, features: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, features, generator=g, dtype=torch.float64)
    return X, torch.sin(X.sum(-1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)


def train_epochs(batch: int, lr: float, epochs: int = 10, n: int = 2048, sizes=(8, 64, 1), seed: int = 0) -> dict:
    """Plain SGD on one process, ``epochs`` passes over ``n`` examples in shuffled mini-batches
    of ``batch`` (P.6). Returns the number of optimizer steps and the loss on all ``n`` examples
    after each epoch (``inf`` once it overflowed or became NaN: a learning rate too large for
    the batch). Runs on one torch thread (tiny matrices: more threads only wait on each other)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _sgd_epochs(batch, lr, epochs, n, sizes, seed)
    finally:
        torch.set_num_threads(threads)


def _sgd_epochs(batch, lr, epochs, n, sizes, seed):
    import math

    import torch

    batch, epochs = integer_at_least(batch, "batch"), integer_at_least(epochs, "epochs")
    if n % batch:
        raise ValueError(f"the batch {batch} must divide the {n} examples, so every epoch has the same steps")
    X, y = _regression(n, seed + 1, sizes[0])
    model = make_model(seed, sizes)
    opt = torch.optim.SGD(model.parameters(), lr=positive_number(lr, "lr"))
    g = torch.Generator().manual_seed(seed + 2)
    losses, steps = [], 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=g)
        for i in range(0, n, batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(X[idx]), y[idx]).backward()
            opt.step()
            steps += 1
        with torch.no_grad():
            loss = torch.nn.functional.mse_loss(model(X), y).item()
        losses.append(loss if math.isfinite(loss) else math.inf)
    return {"steps": steps, "losses": losses}


def big_batch_gradient(micro_batches: int = 4, world: int = 4, micro: int = 8, seed: int = 0):
    """The gradient of one backward pass over all ``micro_batches x world x micro`` examples that
    :func:`helpers.data_parallel.accumulation_worker` spreads over ranks and micro-batches
    (same model, same data), flattened."""
    import torch

    model = make_model(seed)
    X, y = make_batches(micro_batches, micro * world, seed=seed + 1)
    torch.nn.functional.mse_loss(model(X.reshape(-1, X.shape[-1])), y.reshape(-1, 1)).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])
