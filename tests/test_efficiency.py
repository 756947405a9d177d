"""helpers.efficiency (P.5): the four losses' models exactly, bad input, and each experiment on ranks."""
import numpy as np
import pytest

from helpers import amdahl
from helpers import efficiency as ef
from helpers.launcher import launch


def test_barrier_model():
    d = [0.06, 0.08, 0.10, 0.15]
    assert ef.barrier_waits(d) == pytest.approx([0.09, 0.07, 0.05, 0.0])
    assert ef.idle_fraction([100, 100, 100, 150]) == pytest.approx(150 / 600)
    assert ef.barrier_speedup([1, 1, 1, 1]) == 4.0
    assert ef.barrier_speedup(d) == pytest.approx(0.39 / 0.15)


def test_section_13_versus_12_5_split():
    counts = ef.task_counts(100, 8)
    assert counts == [13, 13, 13, 13, 12, 12, 12, 12]
    assert sum(counts) == 100 and max(counts) == 13 and np.mean(counts) == 12.5
    assert ef.imbalance_speedup(100, 8) == pytest.approx(100 / 13)
    # Karp-Flatt of pure imbalance: (13/100 - 1/8) / (7/8) = 1/175
    assert amdahl.karp_flatt(ef.imbalance_speedup(100, 8), 8) == pytest.approx(1 / 175)
    # zero where N divides the task count
    assert amdahl.karp_flatt(ef.imbalance_speedup(100, 4), 4) == pytest.approx(0.0, abs=1e-15)
    assert ef.task_counts(3, 5) == [1, 1, 1, 0, 0]


def test_overhead_model_is_an_amdahl_serial_fraction():
    a, b, m = 4e-6, 1e-10, 1 << 20
    ns = np.array([2, 4, 8, 64])
    s = ef.overhead_speedup(a, b, m, ns)
    assert np.allclose(amdahl.karp_flatt(s, ns), ef.overhead_serial_fraction(a, b, m))
    sizes = np.array([1, 10, 100, 1e4, 1e6])
    assert ef.fit_overhead(sizes, a + b * sizes) == pytest.approx((a, b), rel=1e-9)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ef.barrier_waits([0.1, -0.2]), "no negative durations"),
        (lambda: ef.barrier_waits([]), "at least one"),
        (lambda: ef.barrier_waits("ab"), "sequence of numbers"),
        (lambda: ef.idle_fraction([0, 0]), "> 0"),
        (lambda: ef.task_counts(0, 4), "tasks must be an integer >= 1"),
        (lambda: ef.task_counts(10, 0), "workers must be an integer >= 1"),
        (lambda: ef.task_counts(10, 2.5), "workers must be an integer >= 1"),
        (lambda: ef.fit_overhead([1], [1.0]), "length >= 2"),
        (lambda: ef.fit_overhead([0, 1], [1.0, 2.0]), ">= 1 element"),
        (lambda: ef.overhead_speedup(-1.0, 1.0, 10, 2), "must be >= 0"),
        (lambda: ef.overhead_speedup(1.0, 1.0, 10, 0), ">= 1"),
        (lambda: ef.overhead_serial_fraction(0, 0, 10), "not both 0"),
    ],
)
def test_bad_input_names_the_constraint(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_barrier_on_ranks_reports_per_rank_waits():
    run = launch(ef.barrier_worker, [0.0, 0.03], repeats=2, world_size=2, quiet=True)
    for r in run.results:
        assert len(r["compute"]) == len(r["wait"]) == 2
        assert all(x >= 0 for x in r["compute"] + r["wait"])
    assert run.count("barrier") == 4


def test_imbalance_on_ranks_deals_round_robin():
    run = launch(ef.imbalance_worker, 10, 0.001, world_size=4, quiet=True)
    assert [r["tasks"] for r in run.results] == ef.task_counts(10, 4) == [3, 3, 2, 2]
    assert all(r["step"] >= r["busy"] > 0 for r in run.results)


def test_overhead_and_comm_on_ranks():
    run = launch(ef.overhead_worker, [1, 1000], budget_elems=10_000, world_size=1, quiet=True, record=False)
    assert sorted(run.results[0]) == [1, 1000] and all(t > 0 for t in run.results[0].values())
    run = launch(ef.comm_worker, 0.01, 1000, steps=3, world_size=2, quiet=True)
    assert run.count("all_reduce") == 4  # one warm-up + one per step
    assert run.comm[0][0].bytes == 4000
    assert all(len(r["comm"]) == 3 and min(r["step"]) > 0 for r in run.results)


# last: a failed job ends the worker processes, and the next launch would restart them
def test_barrier_worker_rejects_wrong_number_of_durations():
    from helpers.launcher import RankError

    with pytest.raises(RankError, match="one duration per rank"):
        launch(ef.barrier_worker, [0.01], world_size=2, quiet=True)
