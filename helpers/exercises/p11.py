"""Exercise checks for P.11 (hybrid layouts: rank coordinates, groups, memory)."""
from . import check_number, check_true, require
from ..memory import GB, per_device_total
from ..mesh import Mesh

P11 = Mesh.of(dp=2, pp=2, tp=4)


def ex1(answer):
    """(dp, pp, tp) of GPU 13 in P.11's DP2 x PP2 x TP4 layout."""
    require(answer, "a tuple (dp, pp, tp)")
    want = tuple(P11.coord(13).values())
    if not (isinstance(answer, (tuple, list)) and len(answer) == 3):
        raise AssertionError(f"expected a tuple of three indices (dp, pp, tp), got {answer!r}")
    check_true(tuple(int(a) for a in answer) == want, what="the coordinate of GPU 13",
               hint="Invert rank = 8 dp + 4 pp + tp: divide by 8, then by 4.")


def ex2(answer):
    """The ranks of GPU 6's data-parallel group, in increasing order."""
    require(answer, "a list of ranks")
    if not isinstance(answer, (list, tuple)):
        raise AssertionError(f"expected a list of ranks, got {type(answer).__name__}")
    check_true(sorted(int(a) for a in answer) == P11.group_of(6, "dp") and len(answer) == 2,
               what="the data-parallel group of GPU 6",
               hint="A DP group shares (pp, tp) and differs only in dp.")


def ex3(answer):
    """Model-state GB per device for the 40B model on DP2 x TP4 x PP2 with ZeRO-2."""
    check_number(answer, per_device_total(40e9 / 8, 2, 2) / GB, what="the model state per device in GB (ZeRO-2)",
                 hint="Each device holds 1/8 of the weights; ZeRO-2 shards its gradients and optimizer state over the 2 DP replicas.")


def ex4(pp_sums):
    """Per rank (0..7) of DP2 x PP2 x TP2: the sum of the ranks in its pipeline group, from the ranks."""
    require(pp_sums, "a list of 8 integers, the all-reduced sums by rank")
    mesh = Mesh.of(dp=2, pp=2, tp=2)
    want = [sum(mesh.group_of(r, "pp")) for r in range(8)]
    if not isinstance(pp_sums, (list, tuple)) or len(pp_sums) != 8:
        raise AssertionError(f"expected 8 values (one per rank), got {pp_sums!r}")
    check_true([int(v) for v in pp_sums] == want, what="every rank all-reduced over its own pipeline group",
               hint="Build the groups with helpers.mesh.build_groups and pass groups['pp'] to dist.all_reduce.")
