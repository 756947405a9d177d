"""Exercise checks for P.9 (pipeline parallelism: bubble, schedules, unequal stages)."""
from fractions import Fraction

from ...pipeline_schedule import bubble_formula, simulate
from . import CheckFailed, check_int, check_number, check_pipeline_order, check_run, check_true, exercise, require

# Exercise 3: forward time of each of 8 layers; the backward takes twice as long.
LAYER_COST = [1, 1, 1, 1, 3, 3, 1, 1]


@exercise
def ex1(answer):
    """Bubble, idle over total, of fill-drain with p = 6 stages and m = 10 micro-batches."""
    check_number(answer, float(bubble_formula(6, 10, definition="total")),
                 what="the bubble fraction (idle / total) for p = 6, m = 10",
                 hint="Count the slots of one pass and how many of each device's slots are idle.")


@exercise
def ex2(answer):
    """Smallest m with the P.9 bubble at most 10 % for p = 8."""
    m = 1
    while bubble_formula(8, m, definition="total") > Fraction(1, 10):
        m += 1
    check_int(answer, m, what="the smallest number of micro-batches with a bubble of at most 10 % at p = 8",
              hint="Solve (p-1)/(m+p-1) <= 0.1 for an integer m.")


def stage_costs(counts, layer_cost=LAYER_COST):
    """Forward time of each stage when the layers are cut into consecutive groups of ``counts``."""
    if (not isinstance(counts, (list, tuple)) or len(counts) != 4
            or any(not isinstance(c, int) or c < 1 for c in counts) or sum(counts) != len(layer_cost)):
        raise ValueError(f"expected 4 positive integer layer counts summing to {len(layer_cost)}, got {counts!r}")
    edges = [sum(counts[:i]) for i in range(5)]
    return [sum(layer_cost[a:b]) for a, b in zip(edges, edges[1:])]


def _makespan(counts, m=16):
    f = stage_costs(counts)
    return simulate("1f1b", 4, m, f=f, b=[2 * x for x in f], w=0).makespan


@exercise
def ex3(answer):
    """Layer counts per stage (4 stages, 8 layers of LAYER_COST) giving the shortest 1F1B step at m = 16."""
    require(answer, "a list of 4 layer counts, one per stage, e.g. [2, 2, 2, 2]")
    try:
        mine = _makespan(answer)
    except ValueError as e:
        raise CheckFailed(str(e)) from None
    best = min(_makespan([a, b, c, 8 - a - b - c]) for a in range(1, 6) for b in range(1, 6)
               for c in range(1, 6) if 8 - a - b - c >= 1)
    check_true(mine == best, what="your split gives the shortest 1F1B step",
               hint=f"your split's slowest stage decides the pace; its makespan is {float(mine):g} time units.")


@exercise
def ex4(answer, run_gpipe, run_1f1b):
    """GPipe's peak activation bytes on rank 0 over 1F1B's, from pipeline_step_worker runs on 4 ranks with m = 16."""
    require(answer, "the ratio of rank 0's peak_bytes, GPipe over 1F1B (a number)")
    for run, schedule in ((run_gpipe, "gpipe"), (run_1f1b, "1f1b")):
        check_run(run, 4)
        check_pipeline_order(run, schedule, 16)
    ratio = run_gpipe.results[0]["peak_bytes"] / run_1f1b.results[0]["peak_bytes"]
    check_number(answer, ratio, rel=1e-6, what="GPipe's peak activation bytes over 1F1B's on rank 0, from your two runs",
                 hint="Take peak_bytes of rank 0 from each run's results and divide.")
