"""helpers.amdahl: Amdahl, Gustafson, Karp-Flatt (P.4, P.5, P.13): exact values, bad input, ranks."""
from fractions import Fraction

import numpy as np
import pytest

from helpers import amdahl
from helpers.dag import embedding_job, list_schedule


def test_section_worked_example_p09_n8():
    assert amdahl.time_on(1.0, 0.9, 8) == pytest.approx(0.2125, abs=1e-15)
    assert amdahl.speedup(0.9, 8) == pytest.approx(1 / 0.2125, rel=1e-15)
    assert round(amdahl.speedup(0.9, 8), 3) == 4.706
    assert round(amdahl.efficiency(0.9, 8), 3) == 0.588
    assert round(amdahl.wasted_workers(0.9, 8), 1) == 3.3
    assert amdahl.ceiling(0.9) == pytest.approx(10.0)
    assert amdahl.ceiling(1.0) == np.inf and amdahl.ceiling(0.0) == 1.0


def test_p_for_ninety_percent_on_eight_is_62_over_63():
    # 1/7.2 = (1 - p) + p/8  <=>  p = (1 - 5/36) * 8/7 = 62/63
    assert amdahl.p_for_efficiency(0.9, 8) == pytest.approx(62 / 63, rel=1e-14)
    assert round(amdahl.p_for_efficiency(0.9, 8), 3) == 0.984
    assert amdahl.speedup(amdahl.p_for_efficiency(0.9, 8), 8) == pytest.approx(7.2)
    assert amdahl.p_for_speedup(1.0, 8) == 0.0 and amdahl.p_for_speedup(8.0, 8) == pytest.approx(1.0)


def test_gustafson_and_its_inverse():
    assert amdahl.gustafson(0.9, 8) == pytest.approx(7.3)
    assert amdahl.gustafson(0.9, 1) == 1.0
    assert amdahl.gustafson_serial_fraction(7.3, 8) == pytest.approx(0.1)
    # weak scaling beats strong scaling for every p < 1 and N > 1
    p, n = np.linspace(0, 0.99, 12), np.array([2, 4, 8, 64])[:, None]
    assert np.all(amdahl.gustafson(p, n) >= amdahl.speedup(p, n) - 1e-12)


@pytest.mark.parametrize("p", [0.0, 0.3, 0.87, 0.9, 0.984, 1.0])
def test_karp_flatt_recovers_serial_fraction_on_amdahl_data(p):
    ns = np.array([2, 3, 4, 8, 16, 1000])
    assert np.allclose(amdahl.karp_flatt(amdahl.speedup(p, ns), ns), 1 - p, atol=1e-12)


def test_karp_flatt_is_exact_in_rational_arithmetic():
    # the algebra, with no rounding: 1/S - 1/N = (1 - p)(1 - 1/N)
    for p in (Fraction(9, 10), Fraction(20, 23), Fraction(1, 3)):
        for n in (2, 8, 100):
            inv_s = (1 - p) + p / n
            assert (inv_s - Fraction(1, n)) / (1 - Fraction(1, n)) == 1 - p


def test_karp_flatt_negative_for_superlinear_and_one_at_no_gain():
    assert amdahl.karp_flatt(5.0, 4) < 0
    assert amdahl.karp_flatt(1.0, 4) == pytest.approx(1.0)


def test_fit_amdahl_recovers_p_and_table_rows():
    ns = np.array([2, 4, 8, 16])
    assert amdahl.fit_amdahl(ns, amdahl.speedup(0.75, ns)) == pytest.approx(0.75)
    rows = amdahl.table(0.9, ns=(1, 8))
    assert rows[0]["speedup"] == 1.0 and rows[1]["efficiency"] == pytest.approx(0.5882352941)


def test_embedding_job_amdahl_vs_dag():
    job = embedding_job()
    p = 200 / 230
    assert amdahl.speedup(p, 8) == pytest.approx(230 / 55)
    assert round(amdahl.speedup(p, 8), 2) == 4.18
    assert list_schedule(job, 8).makespan == amdahl.granular_time(100, 2.0, 30.0, 8) == 56.0
    for n in range(1, 41):
        dag_t = list_schedule(job, n).makespan
        assert dag_t == amdahl.granular_time(100, 2.0, 30.0, n)
        assert dag_t >= amdahl.time_on(230.0, p, n) - 1e-9
        assert (abs(dag_t - amdahl.time_on(230.0, p, n)) < 1e-9) == (100 % n == 0)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: amdahl.speedup(1.2, 8), r"p \(the parallel fraction\) must lie in \[0, 1\]"),
        (lambda: amdahl.speedup(-0.1, 8), r"must lie in \[0, 1\]"),
        (lambda: amdahl.efficiency(0.9, 0), r"N \(the number of workers\) must be a finite number >= 1"),
        (lambda: amdahl.speedup(0.9, [4, 0.5]), ">= 1"),
        (lambda: amdahl.speedup(float("nan"), 2), "must not be NaN"),
        (lambda: amdahl.speedup(True, 2), "boolean"),
        (lambda: amdahl.speedup("a", 2), "real number"),
        (lambda: amdahl.time_on(-1, 0.9, 2), "T1 .* >= 0"),
        (lambda: amdahl.karp_flatt(1.5, 1), "N must be > 1 for the Karp-Flatt metric"),
        (lambda: amdahl.karp_flatt(0.0, 4), r"S \(a speedup\) must be a finite number > 0"),
        (lambda: amdahl.p_for_speedup(9.0, 8), "1 <= s <= n"),
        (lambda: amdahl.p_for_speedup(0.5, 8), "1 <= s <= n"),
        (lambda: amdahl.p_for_speedup(2.0, 1), "n must be > 1"),
        (lambda: amdahl.p_for_efficiency(0.05, 8), "1/n <= e <= 1"),
        (lambda: amdahl.p_for_efficiency(1.1, 8), "1/n <= e <= 1"),
        (lambda: amdahl.gustafson(0.9, 0.5), ">= 1"),
        (lambda: amdahl.gustafson_serial_fraction(3.0, 1), "N must be > 1"),
        (lambda: amdahl.table([0.5, 0.6]), "single number"),
        (lambda: amdahl.fit_amdahl([1, 1], [1, 1]), "N > 1"),
        (lambda: amdahl.fit_amdahl([2, 4], [1.5]), "equal length"),
        (lambda: amdahl.granular_time(0, 1.0, 1.0, 2), "n_tasks must be an integer >= 1"),
        (lambda: amdahl.granular_time(10, -1.0, 1.0, 2), "durations task_s and serial_s must be finite and >= 0"),
        (lambda: amdahl.granular_time(10, 1.0, 1.0, 0), "n must be an integer >= 1"),
    ],
)
def test_bad_input_names_the_constraint(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_amdahl_job_on_ranks_deals_tasks_and_finishes():
    from helpers.launcher import launch

    run = launch(amdahl.amdahl_job_worker, 7, 0.002, 0.01, world_size=3, quiet=True)
    assert [r["tasks"] for r in run.results] == [3, 2, 2]
    assert all(r["elapsed"] > 0 and r["busy"] > 0 for r in run.results)
    assert run.count("barrier") == 3
    assert [s.name for s in run.spans[0]].count("serial") == 1
    assert "serial" not in [s.name for s in run.spans[1]]
