"""The exercise checks that read a launch's Run (helpers.course.exercises.check_run): every rank's
communication log is read, not only rank 0's. Runs are built by hand (no ranks are launched)."""
import pytest

from helpers.course.exercises import check_run
from helpers.launcher import RankPlan, Run
from helpers.launcher.commlog import CommOp


def _run(calls_per_rank: list[dict]) -> Run:
    """A Run on len(calls_per_rank) ranks whose rank r issued calls_per_rank[r][op] calls of each op."""
    world = len(calls_per_rank)
    comm = [[CommOp(op, 64, world, float(k)) for op, n in calls.items() for k in range(n)]
            for calls in calls_per_rank]
    return Run(plan=RankPlan("gloo", "cpu", world), results=[None] * world, outputs=[""] * world, comm=comm,
               spans=[[] for _ in range(world)], wall_s=0.0, started_pool=False)


def test_every_rank_must_issue_the_calls():
    check_run(_run([{"all_reduce": 2}, {"all_reduce": 3}]), 2, ops={"all_reduce": 2})  # passes
    with pytest.raises(AssertionError, match="rank 1 issued 0 all_reduce calls"):
        check_run(_run([{"all_reduce": 2}, {}]), 2, ops={"all_reduce": 1})
    with pytest.raises(AssertionError, match="rank 2 issued 1 all_gather call;"):
        check_run(_run([{"all_gather": 2}, {"all_gather": 2}, {"all_gather": 1}]), 3, ops={"all_gather": 2})
    with pytest.raises(AssertionError, match="rank 0 issued 0 send calls"):
        check_run(_run([{}, {"send": 1}]), 2, ops={"send": 1})


def test_no_rank_may_issue_an_absent_op():
    check_run(_run([{"reduce_scatter": 1}, {"reduce_scatter": 1}]), 2, absent=("all_reduce",))  # passes
    with pytest.raises(AssertionError, match="rank 1 issued 1 all_reduce call; the exercise's method uses none"):
        check_run(_run([{}, {"all_reduce": 1}]), 2, absent=("all_reduce",))


def test_the_world_size_and_the_type_are_checked():
    with pytest.raises(AssertionError, match="your launch ran on 2 ranks; the exercise asks for 4"):
        check_run(_run([{}, {}]), 4)
    with pytest.raises(AssertionError, match="expected the Run that launch"):
        check_run([1, 2], 2)
