"""Exercise checks for 12.2.1 (Megatron-style tensor parallelism)."""
import numpy as np

from ... import tp_numpy as tn
from ...tensor_parallel import allreduce_bytes_per_device
from . import check_int, check_number, check_run, check_true, exercise, op_bytes, reject


@exercise
def ex1(answer):
    """Bytes one device sends for TP all-reduces in one training step: 32 layers, s=4096, b=4, h=4096, t=4, BF16."""
    expected = 32 * 4 * allreduce_bytes_per_device(4096, 4, 4096, 4, 2)
    check_number(answer, expected, what="the bytes each device sends per training step", rel=1e-3,
                 hint="Count the all-reduces per layer in both directions (you counted them on the ranks), "
                      "and use the ring factor 2(t-1)/t on the bytes of one (s, b, h) activation.")


@exercise
def ex2(answer):
    """Largest power-of-two TP degree <= 16 that splits 40 heads and an FFN width of 13824 evenly."""
    ok = [t for t in (1, 2, 4, 8, 16) if 40 % t == 0 and 13824 % t == 0]
    check_int(answer, max(ok), what="the largest valid tensor-parallel degree",
              hint="Both the head count and the FFN width must divide by t (tp.check_tp_shapes says which fails).")


@exercise
def ex3(run, P):
    """A TP MLP from ColumnParallelLinear / RowParallelLinear on 2 ranks equals the numpy MLP on every rank."""
    s, h = P["X"].shape
    check_run(run, 2, ops={"all_reduce": 1},
              hint="RowParallelLinear all-reduces its partial outputs; a whole MLP on each rank needs no communication.")
    for r in range(2):
        if op_bytes(run, "all_reduce", r) != [s * h * 8]:
            reject(f"rank {r} all-reduced {op_bytes(run, 'all_reduce', r)} bytes; the forward of a column-then-row "
                   "MLP all-reduces once, the (s, h) output")
    ref = tn.mlp(P["X"], P["A"], P["B"])
    ok = all(np.shape(Z) == ref.shape and np.allclose(np.asarray(Z), ref, rtol=1e-12, atol=1e-12) for Z in run.results)
    check_true(ok, what="your tensor-parallel MLP on 2 ranks equals GeLU(X A) B on every rank",
               hint="ColumnParallelLinear.from_full(A), GeLU (tanh form), RowParallelLinear.from_full(B); "
                    "the row layer's all-reduce makes the output whole on every rank.")
