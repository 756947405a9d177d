"""Exercise checks for P.14 (how parallel jobs fail)."""
import numpy as np

from . import check_number, check_true, require
from ..failures import cluster_mtbf, plain_and_weighted, straggler_arithmetic, token_grad_numpy, young_interval


def ex1(answer):
    """Young's interval, in seconds, for 4,096 devices of 80,000 h MTBF and a 120 s checkpoint."""
    check_number(answer, young_interval(120, cluster_mtbf(80_000 * 3600, 4096)), rel=2e-3,
                 what="Young's checkpoint interval in seconds",
                 hint="First the job's MTBF (device MTBF over the device count, in seconds), then sqrt(2 C M).")


def ex2(answer):
    """Idle fraction of 8 workers, seven at 80 ms and one at 120 ms, with a 10 ms all-reduce."""
    check_number(answer, straggler_arithmetic([80] * 7 + [120], 10)["idle_fraction"], rel=2e-3,
                 what="the idle fraction (a number between 0 and 1)",
                 hint="Idle is the worker-time spent waiting for the slowest; divide by workers x step time.")


def ex3(gradient, X, y, seq, w, assignment):
    """A gradient from the ranks equals the per-token mean gradient over the whole batch."""
    require(gradient, "the gradient your worker returned on rank 0 (a numpy array)")
    g = np.asarray(gradient, dtype=float)
    full = token_grad_numpy(X, y, w)
    plain, _ = plain_and_weighted(X, y, seq, w, assignment)
    if g.shape == full.shape and np.allclose(g, plain, rtol=1e-10, atol=1e-12):
        raise AssertionError("not yet: that is the plain average of per-rank token means, which over-weights "
                             "the ranks with few tokens. Weight each rank by its token count.")
    check_true(g.shape == full.shape and np.allclose(g, full, rtol=1e-10, atol=1e-12),
               what="your gradient equals the per-token mean gradient of the whole batch",
               hint="All-reduce the token-sum gradient and the token count, then divide.")
