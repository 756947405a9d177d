"""Exercise checks for P.2 (concurrency versus parallelism)."""
from . import check_number, check_true, require
from ..concurrency import count_mod7_exact, model_calls


def ex1(answer):
    """ms for policy search (120) and order lookup (200), both needed by a 450 ms generation call."""
    expected = 1000 * model_calls({"policy": 0.12, "order": 0.2, "generate": 0.45},
                                  edges=[("policy", "generate"), ("order", "generate")])
    check_number(answer, expected, what="the time of the three calls in milliseconds",
                 hint="Only calls that do not need each other's results overlap.")


def ex2(answer):
    """ms for 12 independent 100 ms calls with at most 5 in flight."""
    check_number(answer, 1000 * model_calls([0.1] * 12, limit=5),
                 what="the time of 12 calls of 100 ms with at most 5 in flight, in milliseconds",
                 hint="Count how many waves of calls the limit forces.")


def ex3(results, n):
    """``results`` = run.results of a 3-rank launch that summed count_mod7 over range(n)."""
    require(results, "run.results of your 3-rank launch")
    check_true(isinstance(results, (list, tuple)) and len(results) == 3,
               what="the launch ran on 3 ranks", hint="Pass world_size=3 to launch.")
    check_true(all(int(r) == count_mod7_exact(n) for r in results),
               what="every rank returns the total of i*i % 7 over range(n)",
               hint="Give each rank a contiguous part of range(n) (the last takes the remainder), then all_reduce.")
