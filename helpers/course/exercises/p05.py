"""Exercise checks for P.5 (where efficiency goes)."""
from ... import amdahl, efficiency
from . import CheckFailed, check_number, check_run, check_true, exercise, reject, require


@exercise
def ex1(answer):
    """Total worker-time spent waiting at a barrier for compute times 0.2, 0.3, 0.25, 0.5 s."""
    check_number(answer, sum(efficiency.barrier_waits([0.2, 0.3, 0.25, 0.5])),
                 what="the total waiting time at the barrier, in worker-seconds",
                 hint="Every worker waits for the slowest; add up each worker's gap.")


@exercise
def ex2(answer):
    """Karp-Flatt fraction of 100 equal indivisible tasks on 16 workers."""
    s = efficiency.imbalance_speedup(100, 16)
    check_number(answer, amdahl.karp_flatt(s, 16), rel=1e-6,
                 what="the Karp-Flatt fraction of 100 indivisible tasks on 16 workers",
                 hint="The busiest worker sets the time: count its tasks, form S, then apply Karp-Flatt.")


@exercise
def ex3(answer, a, b):
    """The slice size at which the fixed per-op cost equals the per-element cost."""
    require(answer, "a slice size in elements (a number)")
    if not (a > 0 and b > 0):
        raise CheckFailed(f"a and b must be your fitted overhead (s) and per-element cost (s/element), both > 0; "
                          f"got {a!r}, {b!r}")
    check_number(answer, a / b, rel=1e-6, what="the slice size where a = b * k",
                 hint="Set the fixed part equal to the part that grows with the slice and solve for k.")


@exercise
def ex4(counts, run):
    """Tasks per rank, in rank order, from a launch of imbalance_worker (30 tasks of 2 ms) on 4 ranks."""
    require(counts, "the list of task counts per rank, from run.results")
    check_run(run, 4)
    if not all(isinstance(r, dict) and "tasks" in r for r in run.results):
        reject("that run is not a run of ef.imbalance_worker (its ranks return 'tasks')")
    done = [r["tasks"] for r in run.results]
    if sum(done) != 30:
        reject(f"the run dealt {sum(done)} tasks; the exercise asks for 30")
    busy = [sum(s.duration for s in run.spans[r] if s.name == "tasks") for r in range(4)]
    if any(b < 0.9 * 0.002 * n for b, n in zip(busy, done)):
        reject("a rank's 'tasks' span is shorter than its tasks of 2 ms each would take", "Pass task_s=0.002.")
    if not isinstance(counts, (list, tuple)) or [int(c) for c in counts] != done:
        reject("your list is not the ranks' task counts as the run returned them, in rank order",
               "Read r['tasks'] from each rank's result.")
    check_true(done == efficiency.task_counts(30, 4), what="the per-rank task counts of 30 tasks dealt over 4 ranks")
