"""Exercise checks for 12.1.2 (ZeRO stages 1-3 and FSDP)."""
import numpy as np

from ...memory import min_world_size_to_fit, per_device_total, smallest_stage_that_fits
from . import check_choice, check_int, check_number, check_run, check_true, exercise

# exercise 4: ZeRO-1 by hand with plain SGD on a flat parameter vector
EX4 = {"dim": 64, "steps": 5, "lr": 0.5}


def target(rank: int, dim: int = EX4["dim"]):
    """Rank ``rank``'s data for exercise 4: its loss is 0.5 * ||theta - target||^2."""
    if rank < 0 or dim < 1:
        raise ValueError(f"need rank >= 0 and dim >= 1, got rank={rank}, dim={dim}")
    return np.random.default_rng(100 + rank).normal(size=dim)


def ex4_reference(world: int, dim: int = EX4["dim"], steps: int = EX4["steps"], lr: float = EX4["lr"]):
    """What plain data-parallel SGD from theta = 0 reaches: theta -= lr * mean_r(theta - target_r)."""
    mean_t = np.mean([target(r, dim) for r in range(world)], axis=0)
    theta = np.zeros(dim)
    for _ in range(steps):
        theta = theta - lr * (theta - mean_t)
    return theta


@exercise
def ex1(answer_gb):
    """Per-device model state (GB) of a 13B bf16-mixed AdamW model on 8 GPUs under ZeRO stage 2."""
    check_number(answer_gb, per_device_total(13e9, 8, 2) / 1e9, what="GB of model state per device under stage 2",
                 hint="Stage 2 keeps the 2-byte weights whole and divides the gradients and the 12 optimizer bytes by M.")


@exercise
def ex2(answer):
    """Lowest stage that fits 13B on 8 x 80 GB with 20 GB per device kept for activations."""
    stage = smallest_stage_that_fits(13e9, 80e9, 8, reserve_bytes=20e9)
    check_choice(answer, "none" if stage is None else stage,
                 what="the lowest stage whose model state fits in 60 GB", options=[0, 1, 2, 3, "none"],
                 hint="Compute the per-device total for each stage in turn and compare it with 80 - 20 GB.")


@exercise
def ex3(answer_devices):
    """Fewest 80 GB devices for a 70B model under stage 3, 20 GB each kept for activations."""
    check_int(answer_devices, min_world_size_to_fit(70e9, 80e9, 3, reserve_bytes=20e9),
              what="the smallest number of devices", hint="16 bytes per parameter divided by M must fit in 60 GB; round up.")


@exercise
def ex4(run):
    """A ZeRO-1 SGD worker on 4 ranks: equals data-parallel SGD, with one reduce-scatter + one all-gather per step."""
    check_run(run, 4)
    world, steps = run.world_size, EX4["steps"]
    ref = ex4_reference(world)
    results = [np.asarray(r, dtype=float).reshape(-1) for r in run.results]
    check_true(all(r.shape == ref.shape for r in results),
               what=f"every rank returns the full parameter vector ({EX4['dim']} values)",
               hint="All-gather the updated chunks into a full-size tensor and return it.")
    check_true(all(np.allclose(r, ref, rtol=1e-5, atol=1e-6) for r in results),
               what="every rank ends with the parameters data-parallel SGD reaches",
               hint="Reduce-scatter sums: divide your chunk of the gradient by the world size before the update.")
    counts = [(run.count("reduce_scatter", r), run.count("all_gather", r), run.count("all_reduce", r)) for r in range(world)]
    check_true(all(c == (steps, steps, 0) for c in counts),
               what="each rank used one reduce-scatter and one all-gather per step, and no all-reduce",
               hint="Use dist.reduce_scatter_single for the gradient and dist.all_gather_single for the parameters.")
