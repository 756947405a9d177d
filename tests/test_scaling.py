"""helpers.scaling (P.13): the protocol, its analysis, the chapter's table, and the three measures."""
import pytest

from helpers import amdahl
from helpers import scaling as sc


def test_work_matches_its_closed_form():
    for n in (0, 1, 6, 7, 8, 100, 12345):
        assert sc.work(n) == sc.work_reference(n)


def test_chapter_table_analysis():
    rows = sc.analyze({1: 100, 2: 56, 4: 33, 8: 22})
    s = [r["speedup"] for r in rows]
    e = [r["serial_fraction"] for r in rows]
    assert [round(x, 2) for x in s] == [1.0, 1.79, 3.03, 4.55]
    assert [round(r["efficiency"], 3) for r in rows] == [1.0, 0.893, 0.758, 0.568]
    assert e[0] is None
    assert e[1:] == pytest.approx([0.12, 8 / 75, 0.76 / 7])
    assert round(s[3] / s[2], 2) == 1.5
    # rounding to whole seconds: every e is compatible with one constant value near 0.11
    ranges = [sc.karp_flatt_range(100, t, n, 0.5) for n, t in ((2, 56), (4, 33), (8, 22))]
    assert max(lo for lo, _ in ranges) < min(hi for _, hi in ranges)
    assert all(lo < e_ < hi for (lo, hi), e_ in zip(ranges, e[1:]))


def test_weak_analysis_inverts_gustafson():
    p = 0.9
    times = {n: 10.0 * n / amdahl.gustafson(p, n) for n in (1, 2, 4, 8)}
    rows = sc.analyze(times, mode="weak")
    assert [r["serial_fraction"] for r in rows[1:]] == pytest.approx([0.1, 0.1, 0.1])
    assert rows[-1]["speedup"] == pytest.approx(7.3)


def test_baseline_changes_the_speedup():
    rows = sc.analyze({1: 12.0, 2: 6.0}, baseline=10.0)
    assert rows[0]["speedup"] == pytest.approx(10 / 12) and rows[1]["speedup"] == pytest.approx(10 / 6)


def _fake(p, t1=1.0, outlier=None):
    """A measure whose trials follow Amdahl exactly; trial number ``outlier`` takes 10x as long."""
    def measure(n, count):
        serial, par = t1 * (1 - p), t1 * p / n
        trials = []
        for i in range(count):
            phases = {"compute": 10 * (serial + par), "serial": 0.0} if i == outlier else {"compute": par, "serial": serial}
            trials.append(sc.Trial(phases, tuple([par] * n)))
        return trials
    return measure


def test_protocol_discards_warmup_takes_median_and_recovers_p():
    ex = sc.run_protocol(_fake(0.8, outlier=0), workers=(1, 2, 4, 8), repeats=5, warmup=1)
    assert all(len(s.trials) == 5 and len(s.warmup) == 1 for s in ex.settings.values())
    assert ex.settings[1].warmup[0].total == pytest.approx(10.0)  # the outlier was the warm-up
    rows = ex.analysis()
    assert [r["serial_fraction"] for r in rows[1:]] == pytest.approx([0.2, 0.2, 0.2])
    assert ex.settings[4].phase_medians()["serial"] == pytest.approx(0.2)
    # an outlier among the kept runs moves the spread, not the median
    ex2 = sc.run_protocol(_fake(0.8, outlier=3), workers=(2,), repeats=5, warmup=1)
    assert ex2.settings[2].median() == pytest.approx(amdahl.time_on(1.0, 0.8, 2))
    assert ex2.settings[2].spread()[1] == pytest.approx(10 * amdahl.time_on(1.0, 0.8, 2))
    assert ex2.settings[2].imbalance() == pytest.approx(1.0)


def test_interleave_goes_round_robin_and_environment_is_recorded():
    calls = []

    def measure(n, count):
        calls.append((n, count))
        return [sc.Trial({"t": float(n)}, (1.0,) * n) for _ in range(count)]

    ex = sc.run_protocol(measure, workers=(1, 2), repeats=2, warmup=1, interleave=True)
    assert calls == [(1, 1), (2, 1)] * 3
    assert ex.times() == {1: 1.0, 2: 2.0}
    assert ex.environment["cores"] >= 1 and set(ex.environment) == {"cores", "load_before", "load_after"}
    calls.clear()
    sc.run_protocol(measure, workers=(1, 2), repeats=2, warmup=1)
    assert calls == [(1, 3), (2, 3)]


def test_phase_timer_accumulates():
    t = sc.PhaseTimer()
    for _ in range(3):
        with t.phase("a"):
            pass
    assert set(t.phases) == {"a"} and t.phases["a"] >= 0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: sc.analyze({}), "at least one"),
        (lambda: sc.analyze({2: 5.0}), "no baseline"),
        (lambda: sc.analyze({1: 0.0}), r"the time T\(1\) must be a finite number > 0"),
        (lambda: sc.analyze({0: 1.0}), "worker count must be an integer >= 1"),
        (lambda: sc.analyze({1: 1.0}, mode="medium"), "mode must be one of"),
        (lambda: sc.analyze({1: 1.0}, baseline=-1.0), r"baseline \(the one-worker time\) must be a finite number > 0"),
        (lambda: sc.run_protocol(_fake(0.5), repeats=0), "repeats must be an integer >= 1"),
        (lambda: sc.run_protocol(_fake(0.5), warmup=-1), "warmup must be an integer >= 0"),
        (lambda: sc.run_protocol(_fake(0.5), workers=(1, 1)), "distinct"),
        (lambda: sc.run_protocol(_fake(0.5), workers=()), "at least one worker count"),
        (lambda: sc.run_protocol(lambda n, c: [], workers=(1,)), "must return"),
        (lambda: sc.Trial({}), "at least one timed phase"),
        (lambda: sc.Trial({"a": -1.0}), "finite and >= 0"),
        (lambda: sc.Trial({"a": 1.0}, (1.0, 1.0), None, (1.0,)), "one entry per worker"),
        (lambda: sc.Setting(1, [sc.Trial({"a": 1.0}, (1.0,))]).cpu_share(), "no per-worker CPU times"),
        (lambda: sc.task_sizes("strong", 0, 4, 10), "workers must be an integer >= 1"),
        (lambda: sc.karp_flatt_range(100, 56, 2, -1), "half_width must be a finite number >= 0"),
        (lambda: sc.work_reference(-1), ">= 0"),
    ],
)
def test_bad_input_names_the_constraint(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_task_sizes_strong_vs_weak():
    assert sc.task_sizes("strong", 4, 8, 10) == [10] * 8
    assert sc.task_sizes("weak", 4, 8, 10) == [10] * 32


def test_serial_and_pool_measures_compute_the_right_sum():
    ref = 8 * sc.work_reference(2000)
    (trial,) = sc.serial_measure(tasks=8, size=2000)(1, 1)
    assert trial.result == ref and trial.total > 0
    trials = sc.pool_measure(tasks=8, size=2000)(2, 1)
    assert trials[0].result == ref
    assert set(trials[0].phases) == {"startup", "parallel", "teardown", "combine"}
    assert len(trials[0].per_worker) == len(trials[0].per_worker_cpu) == 2
    assert 0 < sc.Setting(2, trials).cpu_share() <= 1.5
    weak = sc.pool_measure(tasks=2, size=2000, mode="weak")(2, 1)[0]
    assert weak.result == 4 * sc.work_reference(2000)


def test_rank_measure_on_two_ranks():
    ex = sc.run_protocol(sc.rank_measure(tasks=4, size=2000), workers=(1, 2), repeats=2, warmup=1)
    for n, s in ex.settings.items():
        assert all(t.result == 4 * sc.work_reference(2000) for t in s.trials)
        assert all(len(t.per_worker) == len(t.per_worker_cpu) == n and t.total > 0 for t in s.trials)
    assert ex.analysis()[1]["serial_fraction"] is not None
