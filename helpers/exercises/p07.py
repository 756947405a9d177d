"""Exercise checks for P.7 (collectives)."""
from . import check_number, check_true, require
from ..collectives import ring_allreduce_bytes


def ex1(answer_gb):
    """GB each of 16 devices sends in a ring all-reduce of 1 GB."""
    check_number(answer_gb, ring_allreduce_bytes(16, 1e9) / 1e9, what="the GB each device sends",
                 hint="Count the chunks a device sends in each of the two phases, and the size of one chunk.")


def ex2(answer_bytes):
    """Message size at which the latency and bandwidth terms are equal (N=8, α=10 µs, β=50 GB/s)."""
    n, alpha, beta = 8, 10e-6, 50e9
    check_number(answer_bytes, n * alpha * beta, what="the crossover message size in bytes", rel=1e-2,
                 hint="Set 2(N-1)α equal to 2(N-1)/N · S/β and solve for S.")


def ex3(run):
    """An all-reduce built from reduce-scatter + all-gather on the ranks equals dist.all_reduce."""
    require(run, "the Run your launch returned")
    ok = all(r["max_abs_diff"] < 1e-12 for r in run.results)
    check_true(ok, what="your reduce-scatter + all-gather equals dist.all_reduce on every rank",
               hint="reduce_scatter_single gives each rank 1/N of the sum; all_gather_single puts the pieces back together.")
    counts = (run.count("reduce_scatter"), run.count("all_gather"))
    check_true(counts[0] >= 1 and counts[1] >= 1, what="it used one reduce-scatter and one all-gather",
               hint=f"the comm log shows {counts[0]} reduce-scatter(s) and {counts[1]} all-gather(s)")
