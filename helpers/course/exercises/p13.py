"""Exercise checks for P.13 (the scaling experiment)."""
from ... import amdahl, scaling
from . import CheckFailed, check_choice, check_number, exercise, require


@exercise
def ex1(answer):
    """Karp-Flatt fraction of T(1) = 80 s, T(4) = 26 s."""
    check_number(answer, amdahl.karp_flatt(80 / 26, 4), rel=1e-6,
                 what="the Karp-Flatt serial fraction at N = 4",
                 hint="S = T(1)/T(4), then e = (1/S - 1/N) / (1 - 1/N).")


@exercise
def ex2(answer):
    """Gustafson serial fraction of a weak-scaling run: T(1) = 10 s, T(8) = 12.5 s."""
    row = scaling.analyze({1: 10.0, 8: 12.5}, mode="weak")[-1]
    check_number(answer, row["serial_fraction"], rel=1e-6,
                 what="the serial fraction implied by the weak-scaling times",
                 hint="Weak scaling: scaled speedup N T(1)/T(N), then invert N - (1 - p)(N - 1).")


DIAGNOSES = ("fixed serial part", "overhead growing with N")


@exercise
def ex3(answer):
    """Which diagnosis fits T = 100, 55, 32.5, 25 s on 1, 2, 4, 8 workers."""
    rows = scaling.analyze({1: 100.0, 2: 55.0, 4: 32.5, 8: 25.0})
    e = [r["serial_fraction"] for r in rows[1:]]
    expected = DIAGNOSES[1] if e[-1] > 1.2 * e[0] else DIAGNOSES[0]
    check_choice(answer, expected, what="the diagnosis the Karp-Flatt values support", options=DIAGNOSES,
                 hint="Compute e at every N and look at its trend, not at its first value.")


@exercise
def ex4(experiment):
    """An experiment the student ran with the protocol on the ranks: weak mode, 1 and 2 ranks, >= 5 repeats,
    3 tasks of 100,000 iterations per worker (sc.rank_measure)."""
    require(experiment, "the Experiment returned by scaling.run_protocol")
    problems = []
    if not isinstance(experiment, scaling.Experiment):
        raise CheckFailed(f"expected the scaling.Experiment that run_protocol returns, "
                          f"got {type(experiment).__name__}")
    if experiment.mode != "weak":
        problems.append("the experiment must run in weak-scaling mode (mode='weak')")
    if sorted(experiment.settings) != [1, 2]:
        problems.append("it must measure exactly 1 and 2 workers")
    settings = experiment.settings.values()
    if not all(len(s.trials) >= 5 and len(s.warmup) >= 1 for s in settings):
        problems.append("every setting must keep >= 5 repeats and discard >= 1 warm-up run")
    trials = [(s.workers, t) for s in settings for t in s.trials]
    if not all(set(t.phases) == {"compute", "combine"} and len(t.per_worker) == n for n, t in trials):
        found = sorted({p for _, t in trials for p in t.phases})
        problems.append(f"its trials were timed with phases {found}, not on the ranks (compute, then the combining "
                        "all-reduce, one time per rank): measure with sc.rank_measure")
    elif not all(t.result == n * 3 * scaling.work_reference(100_000) for n, t in trials):
        problems.append("the ranks' summed result is not that of 3 tasks of 100,000 iterations per worker")
    if problems:
        raise CheckFailed("not yet: " + "; ".join(problems))
    print("correct: a weak-scaling experiment on 1 and 2 ranks, warm-up discarded, >= 5 repeats each")
