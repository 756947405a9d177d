"""Exercise checks for P.6 (data parallelism)."""
import numpy as np

from . import check_int, check_number, check_true, require
from ..data_parallel import effective_batch, mse_grad


def ex1(answer):
    """Effective batch of 16 workers x 2 sequences x 4 accumulation steps."""
    check_int(answer, effective_batch(2, 16, 4), what="the effective batch in sequences",
              hint="Multiply everything that contributes examples to one optimiser update.")


def ex2(answer):
    """Loss scale for the rank holding 20 of 32 examples on 4 ranks, under DDP's averaging."""
    check_number(answer, 4 * 20 / 32, what="the loss scale of the rank with 20 examples",
                 hint="DDP divides the summed gradients by the world size; the full gradient weights each shard by n_k/B.")


def ex3(gradient, X, y, w):
    """A gradient computed on the ranks from unequal shards equals the full-batch gradient."""
    require(gradient, "the gradient your worker returned (a numpy array)")
    g = np.asarray(gradient)
    check_true(g.shape == w.shape and np.allclose(g, mse_grad(X, y, w), rtol=1e-10, atol=1e-12),
               what="your distributed gradient equals the full-batch gradient",
               hint="Sum n_k * g_k over ranks with all_reduce, then divide by the whole batch size.")
