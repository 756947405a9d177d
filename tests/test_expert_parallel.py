"""helpers.expert_parallel (12.4.1, 12.4.2): the mixture-of-experts layer on 4 ranks with all-to-all
dispatch and combine, against the numpy layer and the torch single-process one (outputs and
gradients, with and without dropped tokens), and the all-to-all bytes against the routing and the
closed form."""
import numpy as np
import pytest
import torch

from helpers import costs
from helpers import expert_parallel as epl
from helpers import moe_numpy as mn
from helpers.launcher import RankError, launch

ARGS = dict(tokens=24, h=6, f=5, experts=8, top_k=2, seed=3, skew=1.5)


@pytest.fixture(scope="module")
def runs():
    return {cf: launch(epl.ep_worker, capacity_factor=cf, world_size=4, quiet=True, **ARGS) for cf in (None, 1.0)}


@pytest.mark.parametrize("cf", [None, 1.0])
def test_four_ranks_equal_one_process(runs, cf):
    run, ref = runs[cf], mn.reference(capacity_factor=cf, ranks=4, **ARGS)
    diff = epl.max_differences(run.results, ref)
    assert max(diff.values()) < 1e-12, diff
    dropped = sum(r["dropped"] for r in run.results)
    assert dropped == (~ref["keep"]).sum() and (dropped > 0) == (cf is not None)
    # the torch single-process layer (autograd) agrees too
    P = ref["problem"]
    T = {k: torch.tensor(P[k], requires_grad=True) for k in ("x", "router", "w1", "w3", "w2")}
    y = epl.moe_single(T["x"], T, ARGS["top_k"], cf, groups=4)
    (y * torch.tensor(P["dy"])).sum().backward()
    n = ARGS["tokens"]
    for r in run.results:
        rows, exp = slice(n * r["rank"], n * r["rank"] + n), slice(2 * r["rank"], 2 * r["rank"] + 2)
        assert r["experts"] == list(range(exp.start, exp.stop))
        assert torch.allclose(r["y"], y[rows].detach(), rtol=0, atol=1e-12)
        assert torch.allclose(r["dx"], T["x"].grad[rows], rtol=0, atol=1e-12)
        assert torch.allclose(r["w2"], T["w2"].grad[exp], rtol=0, atol=1e-12)
    assert torch.allclose(sum(r["router"] for r in run.results), T["router"].grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cf", [None, 1.0])
def test_the_all_to_alls_carry_the_routed_rows(runs, cf):
    run, ref = runs[cf], mn.reference(capacity_factor=cf, ranks=4, **ARGS)
    D = mn.dispatch_counts(ref["idx"], ref["keep"], ARGS["experts"], 4)  # rows group r sends rank q
    row = ARGS["h"] * 8  # float64
    for r, res in enumerate(run.results):
        assert res["send"] == D[r].tolist() and res["recv"] == D[:, r].tolist()
        # forward: counts (E int64), dispatch, combine; backward: the reverse of each token all-to-all
        assert [op for op, *_ in res["forward"] + res["backward"]] == ["all_to_all"] * 5
        assert all(g == 4 for *_, g in res["forward"] + res["backward"])
        counts, dispatch, combine = (b for _, b, _ in res["forward"])
        assert counts == ARGS["experts"] * 8 and dispatch == D[r].sum() * row and combine == D[:, r].sum() * row
        assert [b for _, b, _ in res["backward"]] == [dispatch, combine]
        assert [(o.op, o.bytes) for o in run.comm[r]] == [(op, b) for op, b, _ in res["forward"] + res["backward"]]
    table = epl.bytes_table(run.results)
    for t in table:
        assert t["dispatch (log)"] == t["dispatch kept"] and t["combine (log)"] == t["combine rows x h x bytes"]
        assert t["dispatch model"] == costs.moe_dispatch_bytes(ARGS["tokens"], ARGS["top_k"], ARGS["h"], 8)
        assert (t["dispatch (log)"] == t["dispatch model"]) == (cf is None)  # nothing dropped: the closed form exactly
        r = t["rank"]
        assert t["sent to others"] == (D[r].sum() - D[r, r]) * row
        if cf is None:  # the closed form with the measured share of copies for other ranks' experts
            share = (D[r].sum() - D[r, r]) / D[r].sum()
            assert t["sent to others"] == pytest.approx(costs.moe_all_to_all_sent(ARGS["tokens"], ARGS["top_k"], ARGS["h"], 4, 8, share))
    assert sum(t["dispatch (log)"] for t in table) == sum(t["combine (log)"] for t in table)


def test_keep_mask_in_torch_equals_numpy():
    rng = np.random.default_rng(0)
    idx = np.stack([rng.permutation(6)[:3] for _ in range(40)])
    for cap in (1, 5, 20, 40):
        assert epl.keep_mask(torch.tensor(idx), 6, cap).numpy().tolist() == mn.keep_mask(idx, 6, cap).tolist()


def test_experts_not_divisible_by_ranks_is_refused_on_the_ranks():
    with pytest.raises(RankError, match="6 experts must be divisible by the 4 expert-parallel ranks"):
        launch(epl.ep_worker, tokens=8, experts=6, world_size=4, quiet=True)
    with pytest.raises(ValueError, match="divisible"):
        epl.local_experts(6, 4, 0)
    assert list(epl.local_experts(8, 4, 3)) == [6, 7]


def test_exercise_check_reads_the_run_and_its_log(runs):
    from helpers.course.exercises import NotAnswered, c12_4_1

    asked = dict(tokens=32, experts=16, top_k=4, capacity_factor=1.25, world_size=4, quiet=True)
    c12_4_1.ex5(launch(epl.ep_worker, **asked))
    with pytest.raises(NotAnswered):
        c12_4_1.ex5(None)
    with pytest.raises(AssertionError, match="a Run from launch"):
        c12_4_1.ex5(runs[1.0].results)
    with pytest.raises(AssertionError, match="the layout asked for"):
        c12_4_1.ex5(runs[1.0])
    with pytest.raises(AssertionError, match="all-to-all dispatch and combine"):  # right answers, but no log of the ranks
        c12_4_1.ex5(launch(epl.ep_worker, record=False, **asked))
