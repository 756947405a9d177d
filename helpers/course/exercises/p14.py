"""Exercise checks for P.14 (how parallel jobs fail)."""
import numpy as np

from ...failures import cluster_mtbf, plain_and_weighted, straggler_arithmetic, token_grad_numpy, young_interval
from . import CheckFailed, check_number, check_run, check_true, exercise, reject


@exercise
def ex1(answer):
    """Young's interval, in seconds, for 4,096 devices of 80,000 h MTBF and a 120 s checkpoint."""
    check_number(answer, young_interval(120, cluster_mtbf(80_000 * 3600, 4096)), rel=2e-3,
                 what="Young's checkpoint interval in seconds",
                 hint="First the job's MTBF (device MTBF over the device count, in seconds), then sqrt(2 C M).")


@exercise
def ex2(answer):
    """Idle fraction of 8 workers, seven at 80 ms and one at 120 ms, with a 10 ms all-reduce."""
    check_number(answer, straggler_arithmetic([80] * 7 + [120], 10)["idle_fraction"], rel=2e-3,
                 what="the idle fraction (a number between 0 and 1)",
                 hint="Idle is the worker-time spent waiting for the slowest; divide by workers x step time.")


@exercise
def ex3(run, X, y, seq, w, assignment):
    """The per-token mean gradient of the whole batch on 3 ranks, each holding its sequences of ``assignment``;
    every rank returns (gradient, its token count)."""
    check_run(run, 3, ops={"all_reduce": 1}, hint="Combine the ranks' sums with dist.all_reduce.")
    if not all(isinstance(r, (list, tuple)) and len(r) == 2 for r in run.results):
        reject("every rank must return a pair (the gradient, the number of tokens it holds)")
    seq = np.asarray(seq)
    for r, (_, n) in enumerate(run.results):
        if int(n) != int(np.isin(seq, assignment[r]).sum()):
            reject(f"rank {r} reports {int(n)} tokens; its sequences of the assignment hold a different number",
                   "Each rank uses only the tokens of its own sequences, assignment[rank].")
    full = token_grad_numpy(X, y, w)
    plain, _ = plain_and_weighted(X, y, seq, w, assignment)
    g = np.asarray(run.results[0][0], dtype=float)
    if g.shape == full.shape and np.allclose(g, plain, rtol=1e-10, atol=1e-12):
        raise CheckFailed("not yet: that is the plain average of per-rank token means, which over-weights "
                             "the ranks with few tokens. Weight each rank by its token count.")
    ok = all(np.shape(gr) == full.shape and np.allclose(np.asarray(gr, dtype=float), full, rtol=1e-10, atol=1e-12)
             for gr, _ in run.results)
    check_true(ok, what="every rank's gradient equals the per-token mean gradient of the whole batch",
               hint="All-reduce the token-sum gradient and the token count, then divide.")
