"""Exercise checks for 12.3.2 (context parallelism and ring attention)."""
import functools

import numpy as np

from ... import attention_numpy as an
from ... import ring_attention as ra
from . import check_number, exercise
from .p10 import attention_run_equals_reference


@exercise
def ex1(answer):
    """Forward ring bytes one rank sends per layer: s=65,536, p=4, 32 heads of 128, bf16."""
    check_number(answer, ra.ring_bytes_per_rank(65_536, 4, 32, 128, 2), what="the bytes one rank sends per layer",
                 hint="Count the ring steps that move a block, and the K and the V of s/p tokens in each.")


@exercise
def ex2(answer):
    """Attention output of one query whose keys arrive in two blocks (scores/values given)."""
    q = np.array([[1.0]])
    k_a, v_a = np.array([[1.0], [2.0]]), np.array([[10.0], [20.0]])
    k_b, v_b = np.array([[3.0]]), np.array([[30.0]])
    merged = an.merge(an.block_partial(q, k_a, v_a, scale=1.0), an.block_partial(q, k_b, v_b, scale=1.0))
    check_number(answer, float(merged.output()[0, 0]), what="the merged attention output", rel=1e-6,
                 hint="Rescale each block's l and o by exp(m_block - m) with m the larger max, add, divide o by l.")


@functools.lru_cache(maxsize=None)
def _last_over_first() -> float:
    pairs = ra.work_table(8192, 8, "contiguous")["pairs"].sum(1)
    return float(pairs[-1] / pairs[0])


@exercise
def ex3(answer):
    """Causal, contiguous partition, s=8192 over p=8: last rank's unmasked pairs / first rank's."""
    check_number(answer, _last_over_first(), what="the ratio of the last rank's work to the first rank's",
                 hint="Rank 0 scores a triangle of its own block; rank p-1 scores p-1 full blocks plus that triangle.")


@exercise
def ex4(run, s, heads, d):
    """Causal ring attention with the zig-zag partition on 3 ranks equals one-process causal attention."""
    attention_run_equals_reference(
        run, s, heads, d, world=3, scheme="zigzag", causal=True, ops={"send": 2, "recv": 2}, absent=("all_gather",),
        kv_op="send", what="causal zig-zag ring attention on 3 ranks equals one-process causal attention",
        hint="Each rank takes its rows of the zig-zag partition and calls ra.ring_attention(..., scheme='zigzag', "
             "causal=True), which passes K and V round the ring.")
