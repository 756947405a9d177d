"""Exercise checks for P.7 (collectives)."""
from ...collectives import ring_allreduce_bytes
from . import check_number, check_run, check_true, exercise, op_bytes, reject


@exercise
def ex1(answer_gb):
    """GB each of 16 devices sends in a ring all-reduce of 1 GB."""
    check_number(answer_gb, ring_allreduce_bytes(16, 1e9) / 1e9, what="the GB each device sends",
                 hint="Count the chunks a device sends in each of the two phases, and the size of one chunk.")


@exercise
def ex2(answer_bytes):
    """Message size at which the latency and bandwidth terms are equal (N=8, α=10 µs, β=50 GB/s)."""
    n, alpha, beta = 8, 10e-6, 50e9
    check_number(answer_bytes, n * alpha * beta, what="the crossover message size in bytes", rel=1e-2,
                 hint="Set 2(N-1)α equal to 2(N-1)/N · S/β and solve for S.")


@exercise
def ex3(run):
    """An all-reduce of 4000 float64 values built from reduce-scatter + all-gather on 4 ranks, compared with dist.all_reduce."""
    hint = "dist.reduce_scatter_single gives each rank 1/N of the sum; dist.all_gather_single puts the pieces together."
    check_run(run, 4, ops={"reduce_scatter": 1, "all_gather": 1, "all_reduce": 1}, hint=hint)
    for r in range(4):
        sizes = (op_bytes(run, "reduce_scatter", r)[0], op_bytes(run, "all_gather", r)[0])
        if sizes != (4000 * 8, 4000 * 8):
            reject(f"rank {r}'s reduce-scatter and all-gather moved buffers of {sizes[0]} and {sizes[1]} bytes; "
                   "the whole vector is 4000 float64 values", hint)
    ok = all(isinstance(r, dict) and r.get("max_abs_diff", 1.0) < 1e-12 for r in run.results)
    check_true(ok, what="your reduce-scatter + all-gather equals dist.all_reduce on every rank", hint=hint)
