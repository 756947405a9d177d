"""Exercise checks for P.5 (where efficiency goes)."""
from . import check_number, check_true, require
from .. import amdahl, efficiency


def ex1(answer):
    """Total worker-time spent waiting at a barrier for compute times 0.2, 0.3, 0.25, 0.5 s."""
    check_number(answer, sum(efficiency.barrier_waits([0.2, 0.3, 0.25, 0.5])),
                 what="the total waiting time at the barrier, in worker-seconds",
                 hint="Every worker waits for the slowest; add up each worker's gap.")


def ex2(answer):
    """Karp-Flatt fraction of 100 equal indivisible tasks on 16 workers."""
    s = efficiency.imbalance_speedup(100, 16)
    check_number(answer, amdahl.karp_flatt(s, 16), rel=1e-6,
                 what="the Karp-Flatt fraction of 100 indivisible tasks on 16 workers",
                 hint="The busiest worker sets the time: count its tasks, form S, then apply Karp-Flatt.")


def ex3(answer, a, b):
    """The slice size at which the fixed per-op cost equals the per-element cost."""
    require(answer, "a slice size in elements (a number)")
    if not (a > 0 and b > 0):
        raise AssertionError(f"a and b must be your fitted overhead (s) and per-element cost (s/element), both > 0; got {a!r}, {b!r}")
    check_number(answer, a / b, rel=1e-6, what="the slice size where a = b * k",
                 hint="Set the fixed part equal to the part that grows with the slice and solve for k.")


def ex4(counts, tasks, world):
    """Tasks per rank that the student's launch of ``imbalance_worker`` brought back."""
    require(counts, "the list of task counts per rank, from run.results")
    check_true(list(counts) == efficiency.task_counts(tasks, world),
               what=f"the per-rank task counts of {tasks} tasks dealt over {world} ranks",
               hint="Read r['tasks'] from each rank's result, in rank order.")
