"""Exercise checks for P.3 (dependency structures and arithmetic intensity)."""
import numpy as np

from . import check_int, check_number, check_true, require
from ..intensity import autoregressive, matmul, ridge


def ex1(answer):
    """FLOPs of an 8192 x 8192 weight applied to 512 token vectors."""
    check_number(answer, matmul(512, 8192, 8192).flops, what="the FLOPs of the product",
                 hint="Count one multiply and one add for every term of every dot product.")


def ex2(answer):
    """Smallest decode batch that makes the 7B bf16 model compute-bound at 989 TFLOP/s and 3.35 TB/s."""
    r = ridge(989e12, 3.35e12)
    expected = next(b for b in range(1, 10_000) if autoregressive(7e9, 1, batch=b).intensity >= r)
    check_int(answer, expected, what="the smallest batch (an integer number of sequences)",
              hint="Decode intensity grows with the batch: weights are read once per pass for every sequence in it.")


def ex3(C, A, B):
    """C assembled on the ranks from column blocks of B equals A @ B."""
    require(C, "the product your ranks assembled (a numpy array)")
    C = np.asarray(C)
    check_true(C.shape == (A.shape[0], B.shape[1]) and np.allclose(C, A @ B, rtol=1e-10, atol=1e-12),
               what="your distributed product equals A @ B",
               hint="Rank r multiplies A by its block of columns of B; gather the blocks and put them side by side.")
