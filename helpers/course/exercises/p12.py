"""Exercise checks for P.12 (parallelism in inference)."""
import functools

import numpy as np

from ...inference import (
    build_decoder,
    decode_inputs,
    decode_time_per_token,
    largest_tp_for_efficiency,
    poisson_workload,
    run_decoder,
    simulate_serving,
    step_cost_from_model,
)
from . import check_int, check_number, check_run, check_true, exercise


@exercise
def ex1(answer):
    """Per-token decode time (ms) of a 140 GB model on TP 8, 3,350 GB/s, 80 layers, alpha 10 us."""
    expected = 1e3 * decode_time_per_token(140e9, 3350e9, tp=8, layers=80, allreduces_per_layer=2, alpha=10e-6)["total_s"]
    check_number(answer, expected, rel=2e-3, what="the time per token in milliseconds",
                 hint="Memory part: the bytes each device reads over its bandwidth; add 2 all-reduces per layer x alpha.")


@exercise
def ex2(answer):
    """Largest power-of-two TP degree with decode efficiency >= 0.5 for the section's example."""
    check_int(answer, largest_tp_for_efficiency(0.5, 14e9, 1000e9, layers=32, alpha=15e-6),
              what="the largest power-of-two TP degree with efficiency >= 0.5",
              hint="Efficiency = speedup / t, with speedup = 14 ms / (14 ms / t + 64 x 15 us).")


@functools.lru_cache(maxsize=None)
def smallest_batch_for_p99(limit_s: float = 10.0, rate: float = 6.0, n: int = 1000, seed: int = 0) -> int:
    """Smallest continuous-batching ``max_batch`` whose p99 latency stays under ``limit_s`` (a few
    seconds of simulation, so computed once per set of arguments)."""
    w = poisson_workload(n, rate, 64, seed)
    cost = step_cost_from_model(prefill_s=0.05)
    for b in range(1, 65):
        if simulate_serving(w, "continuous", b, cost).percentiles("latency", (99,))["p99"] < limit_s:
            return b
    raise ValueError("no max_batch up to 64 meets the limit")


@exercise
def ex3(answer):
    """Smallest max_batch for continuous batching with p99 latency < 10 s at 6 requests/s."""
    check_int(answer, smallest_batch_for_p99(), what="the smallest max_batch that meets the p99 target",
              hint="Loop max_batch = 1, 2, ... and simulate each; stop at the first p99 below 10 s.")


@exercise
def ex4(run, cfg, layers: int, steps: int, batch: int):
    """Tensor-parallel decode on 2 ranks (rank 0's result: the outputs, or a dict with 'out') equals the
    single-process decode with the same seeds."""
    import torch

    check_run(run, 2, ops={"all_reduce": 2 * layers * steps},
              hint="Tensor parallelism all-reduces twice per layer for every token: build the decoder on the ranks.")
    res = run.results[0]
    outputs = res["out"] if isinstance(res, dict) else res
    ref = run_decoder(build_decoder(cfg, layers), decode_inputs(cfg, steps, batch))["out"]
    out = torch.as_tensor(np.asarray(outputs)) if not isinstance(outputs, torch.Tensor) else outputs
    check_true(tuple(out.shape) == tuple(ref.shape) and torch.allclose(out.double(), ref, rtol=1e-10, atol=1e-10),
               what="your tensor-parallel decode on 2 ranks matches the single-process decode",
               hint=f"Expected shape {tuple(ref.shape)} (steps, 1, batch, h); use seed 0 and float64.")
