"""Exercise checks for P.4 (Amdahl's law, Gustafson's scaled speedup, the embedding job)."""
from . import check_int, check_number, require
from .. import amdahl
from ..dag import embedding_job, list_schedule


def ex1(answer):
    """Amdahl speedup of p = 0.95 on 16 workers."""
    check_number(answer, amdahl.speedup(0.95, 16), what="the Amdahl speedup for p = 0.95 on 16 workers",
                 hint="The serial share stays whole; the parallel share is divided by the worker count.")


def ex2(answer):
    """The p needed for 80% efficiency on 32 workers."""
    check_number(answer, amdahl.p_for_efficiency(0.8, 32), rel=1e-4,
                 what="the parallel fraction p that gives 80% efficiency on 32 workers",
                 hint="Turn the efficiency into a speedup first (E = S/N), then solve 1/S = (1 - p) + p/N for p.")


def ex3(answer):
    """The fewest workers whose greedy schedule of the embedding job reaches speedup >= 6."""
    job = embedding_job()
    n = next(n for n in range(1, 201) if list_schedule(job, n).speedup >= 6)
    check_int(answer, n, what="the smallest worker count whose DAG schedule reaches a speedup of 6",
              hint="Amdahl's answer is one worker too few: tasks are indivisible, so count rounds of 2 s.")


def ex4(answer, t1, tn, n):
    """A Karp-Flatt fraction computed from the student's own measured T(1) and T(N)."""
    require(answer, "the Karp-Flatt serial fraction of your measured speedup (a number)")
    for name, v in (("t1", t1), ("tn", tn)):
        if not (isinstance(v, (int, float)) and v > 0):
            raise AssertionError(f"{name} must be a measured job time in seconds (> 0), got {v!r}")
    if not (isinstance(n, int) and n > 1):
        raise AssertionError(f"n must be the worker count of the parallel run (an integer > 1), got {n!r}")
    check_number(answer, amdahl.karp_flatt(t1 / tn, n), rel=1e-6,
                 what="the Karp-Flatt fraction of your measured speedup T(1)/T(N)",
                 hint="e = (1/S - 1/N) / (1 - 1/N) with S = T(1)/T(N).")
