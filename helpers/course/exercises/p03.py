"""Exercise checks for P.3 (dependency structures and arithmetic intensity)."""
import numpy as np

from ...intensity import autoregressive, matmul, ridge
from . import check_int, check_number, check_parts, check_run, check_true, exercise


@exercise
def ex1(answer):
    """FLOPs of an 8192 x 8192 weight applied to 512 token vectors."""
    check_number(answer, matmul(512, 8192, 8192).flops, what="the FLOPs of the product",
                 hint="Count one multiply and one add for every term of every dot product.")


@exercise
def ex2(answer):
    """Smallest decode batch that makes the 7B bf16 model compute-bound at 989 TFLOP/s and 3.35 TB/s."""
    r = ridge(989e12, 3.35e12)
    expected = next(b for b in range(1, 10_000) if autoregressive(7e9, 1, batch=b).intensity >= r)
    check_int(answer, expected, what="the smallest batch (an integer number of sequences)",
              hint="Decode intensity grows with the batch: weights are read once per pass for every sequence in it.")


@exercise
def ex3(run, A, B):
    """C = A @ B on 4 ranks from column blocks of B: every rank returns (its block, the gathered product)."""
    check_run(run, 4, ops={"all_gather": 1}, hint="Gather the blocks with dist.all_gather.")
    cols = B.shape[1] // 4
    check_parts(run, [A @ B[:, r * cols:(r + 1) * cols] for r in range(4)],
                pair="its block of C, the product gathered from all blocks",
                wrong=f"rank {{r}}'s block is not A times its block of {cols} columns of B",
                hint="Rank r multiplies all of A by its own block of columns of B.")
    C = np.asarray(run.results[0][1])
    check_true(C.shape == (A.shape[0], B.shape[1]) and np.allclose(C, A @ B, rtol=1e-10, atol=1e-12),
               what="a column split on 4 ranks, and the gathered product equals A @ B",
               hint="Put the gathered blocks side by side in rank order (torch.cat along dim 1).")
