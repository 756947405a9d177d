"""helpers.dag (P.1): work, span, the greedy list scheduler, real runs on a pool and on ranks."""
import math
import random

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from helpers import dag as D
from helpers.launcher import launch

# ---- the chapter's job -------------------------------------------------------------------------

def test_embedding_job_work_span_bound():
    g = D.embedding_job()
    assert len(g) == 102 and len(g.edges) == 101
    assert g.work() == 100 * 2 + 10 + 20 == 230
    assert g.span() == 2 + 10 + 20 == 32
    assert g.parallelism() == 230 / 32
    assert g.critical_path() == ["embed[0]", "merge", "index"]
    assert D.work(g) == g.work() and D.span(g) == g.span()


def test_eight_workers_reproduce_the_chapter_figure():
    g = D.embedding_job()
    s = D.list_schedule(g, 8)
    s.check(g)
    assert s.makespan == 56
    assert s.speedup == 230 / 56 and round(s.speedup, 2) == 4.11 and round(s.efficiency, 2) == 0.51
    assert s.tasks_per_worker("embed") == [13, 13, 13, 13, 12, 12, 12, 12]
    assert (s.slot("merge").start, s.slot("merge").end) == (26, 36)
    assert (s.slot("index").start, s.slot("index").end) == (36, 56)
    assert max(e.end for e in s.slots if D.kind(e.task) == "embed") == 26
    assert math.isclose(s.idle_fraction(), 1 - s.efficiency)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 33, 50, 99, 100, 101, 250])
def test_makespan_is_rounds_plus_tail_for_every_n(n):
    g = D.embedding_job()
    s = D.list_schedule(g, n)
    s.check(g)
    assert s.makespan == math.ceil(100 / n) * 2 + 30
    b = D.bounds(g, n)
    assert b["lower"] <= s.makespan <= b["greedy_upper"]


def test_bounds_values():
    b = D.bounds(D.embedding_job(), 8)
    assert b == {"lower": 32.0, "greedy_upper": (230 - 32) / 8 + 32, "speedup_bound": 230 / 32}
    assert D.bounds(D.embedding_job(), 4)["speedup_bound"] == 4


def test_durations_change_work_and_span():
    g = D.embedding_job(n_chunks=10, embed_s=3, merge_s=1, index_s=0.5)
    assert g.work() == 31.5 and g.span() == 4.5
    assert D.list_schedule(g, 4).makespan == 3 * 3 + 1.5
    assert g.scaled(2).work() == 63


def random_dag(rng, n):
    durations = {f"t{i}": rng.choice([0, 1, 2, 3, 5]) for i in range(n)}
    edges = [(f"t{i}", f"t{j}") for i in range(n) for j in range(i + 1, n) if rng.random() < 0.2]
    return D.DAG(durations, edges)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("priority", D.PRIORITIES)
def test_random_graphs_give_valid_greedy_schedules_within_bounds(seed, priority):
    rng = random.Random(seed)
    g = random_dag(rng, 25)
    for n in (1, 2, 3, 5):
        s = D.list_schedule(g, n, priority)
        s.check(g)
        b = D.bounds(g, n)
        assert b["lower"] - 1e-9 <= s.makespan <= b["greedy_upper"] + 1e-9
    assert D.list_schedule(g, 1).makespan == g.work()
    assert D.list_schedule(g, 100).makespan == g.span()


def test_span_is_longest_path_by_brute_force():
    rng = random.Random(42)
    g = random_dag(rng, 12)

    def longest_from(u):
        return g.durations[u] + max((longest_from(v) for v in g.succs[u]), default=0)

    assert g.span() == max(longest_from(u) for u in g.durations)
    path = g.critical_path()
    assert sum(g.durations[u] for u in path) == g.span()
    assert all((a, b) in g.edges for a, b in zip(path, path[1:]))


def test_critical_priority_beats_graph_order_when_it_matters():
    g = D.DAG({"x1": 1, "x2": 1, "y": 1, "z": 3}, [("y", "z")])
    assert D.list_schedule(g, 2, "order").makespan == 5
    assert D.list_schedule(g, 2, "critical").makespan == 4



def test_tasks_that_end_together_are_all_released_before_anyone_picks():
    # a and b end together at t = 1; b's successors come first in the graph's order, so the two free
    # workers take y1 and y2, and x waits (a worker picking as soon as a alone is released takes x)
    g = D.DAG({"a": 1, "b": 1, "y1": 5, "y2": 5, "x": 10}, [("a", "x"), ("b", "y1"), ("b", "y2")])
    s = D.list_schedule(g, 2)
    assert (s.slot("y1").start, s.slot("y2").start, s.slot("x").start, s.makespan) == (1, 1, 6, 16)


# ---- bad input -----------------------------------------------------------------------------------

def test_cycle_is_rejected_and_named():
    with pytest.raises(ValueError, match=r"acyclic; it has the cycle b -> c -> d -> b"):
        D.DAG({"a": 1, "b": 1, "c": 1, "d": 1}, [("a", "b"), ("b", "c"), ("c", "d"), ("d", "b")])
    with pytest.raises(ValueError, match="acyclic: task 'a' depends on itself"):
        D.DAG({"a": 1}, [("a", "a")])


@pytest.mark.parametrize("durations, edges, match", [
    ({"a": -1}, [], "the duration of task 'a' must be a finite number >= 0, got -1"),
    ({"a": float("nan")}, [], "duration of task 'a' must be a finite number >= 0"),
    ({"a": "2"}, [], "duration of task 'a' must be a number"),
    ({}, [], "non-empty dict"),
    ({"a": 1}, [("a", "b")], "names task 'b', which has no duration"),
    ({"a": 1, "b": 1}, [("a",)], "must be a pair"),
])
def test_bad_graphs(durations, edges, match):
    with pytest.raises(ValueError, match=match):
        D.DAG(durations, edges)


def test_bad_scheduler_input():
    g = D.embedding_job()
    for bad in (0, -2, 2.5, True, "8"):
        with pytest.raises(ValueError, match="the number of workers N must be an integer >= 1"):
            D.list_schedule(g, bad)
    with pytest.raises(ValueError, match="priority must be one of"):
        D.list_schedule(g, 2, "random")
    with pytest.raises(ValueError, match="dag must be a helpers.dag.DAG"):
        D.list_schedule({"a": 1}, 2)
    with pytest.raises(ValueError, match="n_chunks must be an integer >= 1"):
        D.embedding_job(0)
    with pytest.raises(ValueError, match=r"the duration of task .embed\[0\]. must be a finite number >= 0"):
        D.embedding_job(embed_s=-2)
    with pytest.raises(ValueError, match="seconds must be a finite number >= 0"):
        D.burn(-1)
    with pytest.raises(ValueError, match="span is 0"):
        D.DAG({"a": 0}).parallelism()


def test_check_catches_a_broken_schedule():
    g = D.DAG({"a": 1, "b": 1}, [("a", "b")])
    with pytest.raises(ValueError, match="dependency violated"):
        D.Schedule(2, [D.Slot("a", 0, 0, 1), D.Slot("b", 1, 0.5, 1.5)], 2).check(g)
    with pytest.raises(ValueError, match="at the same time"):
        D.Schedule(1, [D.Slot("a", 0, 0, 1), D.Slot("b", 0, 0.5, 1.5)], 2).check(D.DAG({"a": 1, "b": 1}))
    with pytest.raises(ValueError, match="exactly once"):
        D.Schedule(1, [D.Slot("a", 0, 0, 1)], 2).check(g)


def test_gantt_draws_one_bar_per_task():
    s = D.list_schedule(D.embedding_job(), 8)
    ax = D.gantt(s)
    assert len(ax.patches) == len(s.slots)


# ---- running for real ------------------------------------------------------------------------------

def test_execute_on_a_process_pool_respects_the_graph():
    g = D.embedding_job(n_chunks=12, embed_s=0.002, merge_s=0.004, index_s=0.004)
    m = D.execute(g, 2)
    m.check(g, tol=1e-6)
    assert sorted(m.results) == sorted(g.durations)
    assert np.array_equal(m.results["index"], D.embedding_reference(12))
    assert all(s.duration >= 0.99 * g.durations[s.task] for s in m.slots)  # wall >= the CPU time burned


def test_median_schedule_on_a_warm_pool():
    g = D.embedding_job(n_chunks=4, embed_s=0.001, merge_s=0.001, index_s=0.001)
    pool, startup = D.start_pool(2)
    try:
        runs = [D.execute(g, 2, pool=pool) for _ in range(3)]
    finally:
        pool.shutdown()
    assert startup > 0
    assert D.median_schedule(runs).makespan == sorted(r.makespan for r in runs)[1]
    with pytest.raises(ValueError, match="at least one schedule"):
        D.median_schedule([])


def test_embedding_task_data():
    ref = D.embedding_reference(5, dim=4)
    assert ref.shape == (5,) and set(ref) <= set(range(5)) and all(ref[i] != i for i in range(5))
    with pytest.raises(ValueError, match="does not know task"):
        D.embedding_task("shuffle", 0, {})


def test_embedding_job_on_gloo_ranks_matches_the_serial_index():
    run = launch(D.embedding_job_worker, n_chunks=20, embed_s=0.001, merge_s=0.002, index_s=0.002,
                 world_size=2, quiet=True)
    assert np.array_equal(run.results[0], D.embedding_reference(20))
    assert run.results[1] is None
    names = [[s.name for s in spans] for spans in run.spans]
    assert names[0].count("embed") == 10 and names[1].count("embed") == 10
    assert "merge" in names[0] and "merge" not in names[1]
