"""Exercise checks for P.4 (Amdahl's law, Gustafson's scaled speedup, the embedding job)."""
from ... import amdahl
from ...dag import embedding_job, list_schedule
from . import check_int, check_number, check_run, exercise, reject, require


@exercise
def ex1(answer):
    """Amdahl speedup of p = 0.95 on 16 workers."""
    check_number(answer, amdahl.speedup(0.95, 16), what="the Amdahl speedup for p = 0.95 on 16 workers",
                 hint="The serial share stays whole; the parallel share is divided by the worker count.")


@exercise
def ex2(answer):
    """The p needed for 80% efficiency on 32 workers."""
    check_number(answer, amdahl.p_for_efficiency(0.8, 32), rel=1e-4,
                 what="the parallel fraction p that gives 80% efficiency on 32 workers",
                 hint="Turn the efficiency into a speedup first (E = S/N), then solve 1/S = (1 - p) + p/N for p.")


@exercise
def ex3(answer):
    """The fewest workers whose greedy schedule of the embedding job reaches speedup >= 6."""
    job = embedding_job()
    n = next(n for n in range(1, 201) if list_schedule(job, n).speedup >= 6)
    check_int(answer, n, what="the smallest worker count whose DAG schedule reaches a speedup of 6",
              hint="Amdahl's answer is one worker too few: tasks are indivisible, so count rounds of 2 s.")


@exercise
def ex4(answer, run_1, run_4):
    """A Karp-Flatt fraction computed from the job times of amdahl_job_worker runs on 1 and 4 ranks."""
    require(answer, "the Karp-Flatt serial fraction of your measured speedup (a number)")
    for run, n in ((run_1, 1), (run_4, 4)):
        check_run(run, n)
        res = run.results
        if not all(isinstance(r, dict) and {"tasks", "elapsed"} <= set(r) for r in res):
            reject(f"the {n}-rank run is not a run of amdahl.amdahl_job_worker (its ranks return 'tasks' and 'elapsed')")
        if sum(r["tasks"] for r in res) != 40:
            reject(f"the {n}-rank run did {sum(r['tasks'] for r in res)} tasks; the exercise's job has 40")
        serial = [s.duration for s in run.spans[0] if s.name == "serial"]
        if not serial or serial[0] < 0.9 * 0.040:
            reject(f"rank 0 of the {n}-rank run has no serial tail of 40 ms", "Pass serial_s=0.040.")
    s = max(r["elapsed"] for r in run_1.results) / max(r["elapsed"] for r in run_4.results)
    check_number(answer, amdahl.karp_flatt(s, 4), rel=1e-6,
                 what="the Karp-Flatt fraction of the speedup your two runs measured",
                 hint="Each run's job time is the largest 'elapsed' over its ranks; S = T(1)/T(4), "
                      "e = (1/S - 1/N) / (1 - 1/N).")
