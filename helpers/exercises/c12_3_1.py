"""Exercise checks for 12.3.1 (sequence parallelism)."""
from . import check_int, check_number, check_run, reject
from ..costs import activation_bytes_per_layer


def ex1(answer):
    """Replicated ('stranded') activation bytes per layer under TP alone: s=2048, b=8, h=4096."""
    check_number(answer, 10 * 2048 * 8 * 4096, what="the replicated activation bytes per layer", rel=1e-3,
                 hint="Korthikanti et al.: the part of sbh(10 + 24/t) that does not shrink with t; it already counts bytes.")


def ex2(answer):
    """Per-rank activation bytes per layer with TP + SP and no stored attention scores: s=4096, b=4, h=5120, t=4."""
    expected = activation_bytes_per_layer(4096, 4, 5120, 80, 4, sequence_parallel=True, attention_scores=False)
    check_number(answer, expected, what="the activation bytes per layer per rank under TP + SP", rel=1e-3,
                 hint="With sequence parallelism every one of the 34 sbh terms is divided by t.")


def ex3(run, s, b, h, a):
    """Activation bytes measured on rank 0 of a TP + SP run on 2 ranks equal the TP+SP formula."""
    check_run(run, 2, ops={"all_gather": 1, "reduce_scatter": 1}, absent=("all_reduce",),
              hint="Sequence parallelism replaces TP's all-reduces by all-gathers and reduce-scatters: "
                   "pass sequence_parallel=True to sp.activation_memory_worker.")
    res = run.results[0]
    if not (isinstance(res, dict) and "activations" in res):
        reject("rank 0 must return sp.activation_memory_worker's dict (with 'activations')")
    check_int(int(res["activations"]), int(activation_bytes_per_layer(s, b, h, a, 2, sequence_parallel=True)),
              what="the measured activation bytes of rank 0 under TP + SP on 2 ranks",
              hint="Read results[0]['activations'] (LayerNorm statistics excluded).")
