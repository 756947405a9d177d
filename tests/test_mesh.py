"""Rank coordinates and groups of hybrid layouts (P.11): the helper against numpy, PyTorch's
DeviceMesh and real all-reduces on 8 gloo ranks."""
import numpy as np
import pytest

from helpers.launcher import launch
from helpers.mesh import Mesh, device_mesh_worker, draw, hand_groups_worker, node_of, placement, stage_hops


def test_p11_formula_and_groups():
    m = Mesh.of(dp=2, pp=2, tp=4)
    assert m.world == 16 and m.strides == (8, 4, 1)
    for r in range(16):
        c = m.coord(r)
        assert r == 8 * c["dp"] + 4 * c["pp"] + c["tp"] == m.rank(**c)
    assert np.array_equal(m.grid(), np.arange(16).reshape(2, 2, 4))
    assert m.groups("tp") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert len(m.groups("pp")) == 8 and m.group_of(0, "pp") == [0, 4]
    assert len(m.groups("dp")) == 8 and m.group_of(0, "dp") == [0, 8]
    # each dimension's groups partition the ranks, and a group varies only along its dimension
    for name in m.names:
        flat = sorted(r for g in m.groups(name) for r in g)
        assert flat == list(range(16))
        for g in m.groups(name):
            others = {tuple(v for k, v in m.coord(r).items() if k != name) for r in g}
            assert len(others) == 1


def test_placement_over_servers():
    pl = placement(Mesh.of(dp=2, pp=2, tp=4), 4)
    assert pl["tp"]["intra-node"] and not pl["pp"]["intra-node"] and not pl["dp"]["intra-node"]
    assert pl["tp"]["groups"] == 4 and pl["dp"]["groups"] == 8
    # TP outermost puts every TP group across all four servers
    bad = placement(Mesh.of(tp=4, pp=2, dp=2), 4)
    assert bad["tp"]["max servers per group"] == 4 and bad["dp"]["intra-node"]
    assert node_of(13, 4) == 3
    with pytest.raises(ValueError, match="do not fill servers"):
        placement(Mesh.of(dp=3, tp=2), 4)


def test_stage_hops_say_which_hand_offs_cross_servers():
    # 12.2.2: a stage per server (TP innermost): every hand-off crosses; a pipeline per server: none does
    aligned = stage_hops(Mesh.of(pp=8, tp=8), 8)
    assert len(aligned) == 8 * 7 and all(c for _, _, c in aligned)
    assert aligned[:2] == [(0, 8, True), (8, 16, True)]
    assert not any(c for _, _, c in stage_hops(Mesh.of(tp=8, pp=8), 8))
    # two stages per server: hand-offs 0->1, 2->3, ... stay inside, 1->2, 3->4, ... cross (7 of 15 per pipeline)
    two = stage_hops(Mesh.of(pp=16, tp=4), 8)
    assert len(two) == 4 * 15 and sum(c for _, _, c in two) == 4 * 7
    assert stage_hops(Mesh.of(dp=4, pp=1), 2) == []
    with pytest.raises(ValueError, match="devices_per_node must be an integer >= 1"):
        stage_hops(Mesh.of(pp=2), 0)


def test_bad_input():
    with pytest.raises(ValueError, match="one size per dimension"):
        Mesh(("dp", "tp"), (2,))
    with pytest.raises(ValueError, match="distinct"):
        Mesh(("dp", "dp"), (2, 2))
    with pytest.raises(ValueError, match="integer >= 1"):
        Mesh.of(dp=0, tp=2)
    m = Mesh.of(dp=2, tp=2)
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 4\)"):
        m.coord(4)
    with pytest.raises(ValueError, match="unknown dimension"):
        m.groups("pp")
    with pytest.raises(ValueError, match="exactly the dimensions"):
        m.rank(dp=1)
    with pytest.raises(ValueError, match=r"index of 'tp' must be an integer in \[0, 2\)"):
        m.rank(dp=0, tp=2)
    with pytest.raises(ValueError, match="integer >= 1"):
        node_of(3, 0)


def test_draw_runs():
    import matplotlib

    matplotlib.use("Agg")
    ax = draw(Mesh.of(dp=2, pp=2, tp=4), 4, highlight={"tp": "C0", "pp": "C1", "dp": "C2"})
    assert len(ax.lines) == 4 + 8 + 8


def test_groups_on_ranks_match_device_mesh():
    m = Mesh.of(dp=2, pp=2, tp=2)
    dm = launch(device_mesh_worker, m.names, m.sizes, world_size=8, quiet=True)
    hand = launch(hand_groups_worker, m.names, m.sizes, world_size=8, quiet=True)
    for r in range(8):
        assert dm.results[r]["coord"] == m.coord(r) == hand.results[r]["coord"]
        assert dm.results[r]["mesh"] == m.grid().tolist()
        for name in m.names:
            assert dm.results[r]["groups"][name] == m.group_of(r, name) == hand.results[r]["groups"][name]
            assert hand.results[r]["sums"][name] == sum(m.group_of(r, name))
    # one all-reduce per dimension, each over a group of 2
    assert hand.count("all_reduce", 0) == 3
    assert all(op.group_size == 2 for op in hand.comm[0] if op.op == "all_reduce")
