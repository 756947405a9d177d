"""Exercise checks for P.15 (choosing a strategy: the decision sequence)."""
from fractions import Fraction

from ...memory import GB, per_device_total
from ...pipeline_schedule import min_microbatches
from ...planner import book_70b, h100_cluster, plan
from . import check_int, check_number, check_run, check_true, exercise, reject, require


@exercise
def ex1(answer):
    """Smallest m with (p-1)/(m+p-1) <= 10% at p = 8."""
    check_int(answer, min_microbatches(8, Fraction(1, 10), "total"), what="the smallest number of micro-batches",
              hint="Solve (p-1)/(m+p-1) <= 0.1 for m, with P.9's definition of the bubble.")


@exercise
def ex2(answer):
    """Model-state GB per device of a 13B model, BF16 mixed precision AdamW, ZeRO-1 over 64 devices."""
    check_number(answer, per_device_total(13e9, 64, 1) / GB, what="the model state per device in GB",
                 hint="Weights and gradients stay whole (2 + 2 bytes per parameter); 12 bytes per parameter are split 64 ways.")


@exercise
def ex3(answer):
    """The pipeline degree of the planner's best layout for the 70B on 256 H100s at a global batch of 512."""

    require(answer, "an integer, the PP of the best layout")
    check_int(answer, plan(book_70b(), h100_cluster(256), 512).best.layout.pp, what="the pipeline degree of the best layout",
              hint="Run planner.plan(...) with global_batch=512 and read .best.layout.pp.")


@exercise
def ex4(run):
    """td.three_d_worker run as DP2 x TP2 on 4 ranks: the layout, and rank 0's measured bytes against the model's."""
    from ...three_d import expected_bytes, measured_bytes

    check_run(run, 4, hint="td.three_d_worker takes the layout as its dp, pp and tp degrees (a dimension not "
                            "used has degree 1); their product is the number of ranks to launch.")
    results = run.results
    if not all(isinstance(r, dict) and "coord" in r and "groups" in r for r in results):
        reject("that run is not a run of td.three_d_worker (its ranks return 'coord' and 'groups')")
    sizes = {n: max(r["coord"][n] for r in results) + 1 for n in ("dp", "pp", "tp")}
    if sizes != {"dp": 2, "pp": 1, "tp": 2}:
        reject(f"the run's layout is DP{sizes['dp']} x PP{sizes['pp']} x TP{sizes['tp']}; the exercise asks for DP2 x TP2")
    check_true(measured_bytes(results[0]) == expected_bytes(2, 1, 2, 2),
               what="a DP2 x TP2 run on 4 ranks, and rank 0's measured bytes equal the model's bytes")
