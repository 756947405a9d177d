"""A tiny transformer trained on DP x PP x TP gloo ranks (P.11, 12.4.1) equals one process."""
import pytest

from helpers import three_d as td
from helpers.launcher import launch


@pytest.fixture(scope="module")
def reference():
    return td.reference_training()


def test_reference_learns(reference):
    assert len(reference["losses"]) == 3 and reference["losses"][-1] < reference["losses"][0]


def test_dp2_pp2_tp2_matches_one_process(reference):
    run = launch(td.three_d_worker, world_size=8, quiet=True)
    assert td.global_losses(run.results) == pytest.approx(reference["losses"], rel=1e-12)
    assert td.max_param_diff(run.results, reference, tp=2) < 1e-12
    want = td.expected_comm(2, 2, 2, 2, 4)
    for r in run.results:
        c = r["comm"]
        assert [op for op, _, _ in c["tp"]] == ["all_reduce"] * want["tp all_reduce"]
        assert len(c["pp"]) == want["pp calls, first/last stage"]
        assert [op for op, _, _ in c["dp"]] == ["all_reduce"]
        assert td.measured_bytes(r) == td.expected_bytes(2, 2, 2, 2, stage=r["coord"]["pp"])
        assert {g for g, _, size in c["tp"]} == {"all_reduce"} and {size for _, _, size in c["tp"]} == {2}


@pytest.mark.parametrize("dp,pp,tp,schedule", [(4, 1, 1, "1f1b"), (1, 4, 1, "gpipe"), (1, 1, 4, "1f1b")])
def test_one_dimension_at_a_time(dp, pp, tp, schedule, reference):
    run = launch(td.three_d_worker, dp=dp, pp=pp, tp=tp, schedule=schedule, world_size=4, quiet=True)
    assert td.global_losses(run.results) == pytest.approx(reference["losses"], rel=1e-12)
    assert td.max_param_diff(run.results, reference, tp=tp) < 1e-12
    for r in run.results:
        assert td.measured_bytes(r) == td.expected_bytes(dp, pp, tp, 2, stage=r["coord"]["pp"])


def test_bad_layouts():
    cfg = td.default_config()
    with pytest.raises(ValueError, match="PP=3 must divide the 4 blocks"):
        td.check_layout(1, 3, 1, 4, 8, 2, cfg)
    with pytest.raises(ValueError, match="DP x m = 4 x 4 must divide the global batch of 8"):
        td.check_layout(4, 1, 1, 4, 8, 4, cfg)
    with pytest.raises(ValueError, match="TP=8 must divide the 4 heads"):
        td.check_layout(1, 1, 8, 4, 8, 2, cfg)
    with pytest.raises(ValueError, match="integer >= 1"):
        td.check_layout(0, 1, 1, 4, 8, 2, cfg)
    with pytest.raises(ValueError, match="dropout"):
        td.check_layout(1, 1, 1, 4, 8, 2, td.BlockConfig(h=16, heads=4, ffn=32, p_drop=0.1))
