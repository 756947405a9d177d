"""Exercise checks for P.2 (concurrency versus parallelism)."""
from ...concurrency import count_mod7_exact, model_calls
from . import check_number, check_run, check_true, exercise, reject


@exercise
def ex1(answer):
    """ms for policy search (120) and order lookup (200), both needed by a 450 ms generation call."""
    expected = 1000 * model_calls({"policy": 0.12, "order": 0.2, "generate": 0.45},
                                  edges=[("policy", "generate"), ("order", "generate")])
    check_number(answer, expected, what="the time of the three calls in milliseconds",
                 hint="Only calls that do not need each other's results overlap.")


@exercise
def ex2(answer):
    """ms for 12 independent 100 ms calls with at most 5 in flight."""
    check_number(answer, 1000 * model_calls([0.1] * 12, limit=5),
                 what="the time of 12 calls of 100 ms with at most 5 in flight, in milliseconds",
                 hint="Count how many waves of calls the limit forces.")


@exercise
def ex3(run, n):
    """count_mod7 over range(n) on 3 ranks: contiguous slices (the last takes the rest), then all_reduce.
    Every rank returns (start, stop, total)."""
    check_run(run, 3, ops={"all_reduce": 1}, hint="Combine the partial counts with dist.all_reduce.")
    if not all(isinstance(r, (list, tuple)) and len(r) == 3 for r in run.results):
        reject("every rank must return a triple (start, stop, total): its slice of range(n) and the total")
    size = n // 3
    for r, (start, stop, _) in enumerate(run.results):
        want = (r * size, n if r == 2 else (r + 1) * size)
        if (int(start), int(stop)) != want:
            reject(f"rank {r} took range({start}, {stop}); the exercise asks for contiguous slices of n // 3 "
                   "in rank order, the last rank taking whatever is left over")
    check_true(all(int(r[2]) == count_mod7_exact(n) for r in run.results),
               what="every rank returns the total of i*i % 7 over range(n)",
               hint="Count your own slice, then all_reduce the partial counts (SUM).")
