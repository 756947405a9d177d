"""Exercise checks for P.8 (tensor parallelism)."""
import numpy as np

from ... import tp_numpy as tn
from ...tensor_parallel import book_p8
from . import CheckFailed, check_number, check_parts, check_run, check_true, exercise, require


@exercise
def ex1(answer):
    """Row split of W = [[1, 2], [3, 4]] on 2 devices, X = [3, -1]: device 1's partial product."""
    require(answer, "device 1's partial product P1, as a list of two numbers")
    X = np.array([[3, -1]])
    expected = tn.row_parallel(X, np.array([[1, 2], [3, 4]]), 2)[1][0]
    got = np.asarray(answer, dtype=float).ravel()
    if got.shape != (2,):
        raise CheckFailed(f"expected two numbers (one per output column), got {answer!r}")
    check_true(np.array_equal(got, expected), what="device 1's partial product",
               hint="Device 1 holds the second input row of W and only the matching entry of X.")


@exercise
def ex2(answer):
    """Forward-pass TP communication: 4096 tokens, h = 8192, T = 8, 48 layers, 2 bytes, 400 GB/s."""
    expected = book_p8(tokens=4096, h=8192, t=8, layers=48)["ms per forward"]
    check_number(answer, expected, what="the all-reduce time per forward pass in milliseconds", rel=5e-3,
                 hint="Per all-reduce each device sends 2(T-1)/T of the activation bytes; count two per layer.")


@exercise
def ex3(run, X, W):
    """Y = X W with a row split of W on 4 ranks: every rank returns (its partial product, Y after all_reduce)."""
    check_run(run, 4, ops={"all_reduce": 1}, hint="dist.all_reduce adds the partial products.")
    k = X.shape[1] // 4
    check_parts(run, [X[:, r * k:(r + 1) * k] @ W[r * k:(r + 1) * k] for r in range(4)], pair="its partial product, Y",
                wrong=f"rank {{r}}'s partial product is not its {k} columns of X times its {k} rows of W",
                hint="Rank k holds block k of W's rows and the matching columns of X.", rtol=1e-12)
    ok = all(np.shape(Y) == (X @ W).shape and np.allclose(Y, X @ W, rtol=1e-12, atol=1e-12) for _, Y in run.results)
    check_true(ok, what="a row split on 4 ranks, and every rank's Y equals X @ W",
               hint="dist.all_reduce sums the partial products.")
