"""Exercise checks for P.11 (hybrid layouts: rank coordinates, groups, memory)."""
from ...memory import GB, per_device_total
from ...mesh import Mesh
from . import CheckFailed, check_number, check_run, check_true, exercise, reject, require

P11 = Mesh.of(dp=2, pp=2, tp=4)


@exercise
def ex1(answer):
    """(dp, pp, tp) of GPU 13 in P.11's DP2 x PP2 x TP4 layout."""
    require(answer, "a tuple (dp, pp, tp)")
    want = tuple(P11.coord(13).values())
    if not (isinstance(answer, (tuple, list)) and len(answer) == 3):
        raise CheckFailed(f"expected a tuple of three indices (dp, pp, tp), got {answer!r}")
    check_true(tuple(int(a) for a in answer) == want, what="the coordinate of GPU 13",
               hint="Invert rank = 8 dp + 4 pp + tp: divide by 8, then by 4.")


@exercise
def ex2(answer):
    """The ranks of GPU 6's data-parallel group, in increasing order."""
    require(answer, "a list of ranks")
    if not isinstance(answer, (list, tuple)):
        raise CheckFailed(f"expected a list of ranks, got {type(answer).__name__}")
    check_true(sorted(int(a) for a in answer) == P11.group_of(6, "dp") and len(answer) == 2,
               what="the data-parallel group of GPU 6",
               hint="A DP group shares (pp, tp) and differs only in dp.")


@exercise
def ex3(answer):
    """Model-state GB per device for the 40B model on DP2 x TP4 x PP2 with ZeRO-2."""
    check_number(answer, per_device_total(40e9 / 8, 2, 2) / GB, what="the model state per device in GB (ZeRO-2)",
                 hint="Each device holds 1/8 of the weights; ZeRO-2 shards its gradients and optimizer state over the 2 DP replicas.")


@exercise
def ex4(run):
    """DP2 x PP2 x TP2 on 8 ranks: every rank all-reduces its rank id inside its pipeline group and returns the sum."""
    check_run(run, 8, ops={"all_reduce": 1}, hint="Build the groups with hm.build_groups and all-reduce in groups['pp'].")
    for r in range(8):
        if not any(o.op == "all_reduce" and o.group_size == 2 for o in run.comm[r]):
            reject(f"rank {r} all-reduced over no group of 2 ranks: the pipeline groups of DP2 x PP2 x TP2 have 2 members",
                   "Pass group=groups['pp'] to dist.all_reduce.")
    mesh = Mesh.of(dp=2, pp=2, tp=2)
    got = [int(v) if isinstance(v, (int, float)) else v for v in run.results]
    check_true(got == [sum(mesh.group_of(r, "pp")) for r in range(8)],
               what="every rank all-reduced over its own pipeline group",
               hint="Build the groups with helpers.mesh.build_groups and pass groups['pp'] to dist.all_reduce.")
