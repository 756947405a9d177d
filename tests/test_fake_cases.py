"""The planner told PyTorch's recipe (``helpers.fake_cases.PYTORCH``: FSDP2's model state and peak,
the FP32-upcast loss) against PyTorch's own code on a fake world, on small models where each term
matters: FSDP2's accumulated FP32 gradients under ZeRO-1, ZeRO-3's one gathered block and its
reduction, DDP's gradients at the end of the backward, a pipeline stage's own layers."""
import pytest

from helpers import fake_cases
from helpers import fake_world as fw
from helpers.planner import Layout, Model, Rules, assess, h100_cluster
from helpers.planner.assess import fsdp2_memory, loss_bytes

# model state outweighs activations (wide layers, short sequences): the state model decides the peak
WIDE = Model("wide", layers=4, hidden=256, heads=4, kv_heads=2, ffn=768, mlp_matrices=3, seq_len=64, vocab=512)
TORCH = Rules(dropout=False, **fake_cases.PYTORCH)


def _planner(model, lay, m, rules=TORCH):
    a = assess(model, h100_cluster(lay.devices, reserve_bytes=0.0), lay.dp * lay.micro_batch * m, lay, rules)
    return a.memory["total"]


@pytest.mark.parametrize("lay, m", [(Layout(dp=4, zero=0), 1), (Layout(dp=4, zero=1), 1), (Layout(dp=4, zero=1), 4),
                                    (Layout(dp=4, zero=2), 4), (Layout(dp=4, zero=3), 2),
                                    (Layout(dp=2, tp=2, zero=1, micro_batch=2), 4)])
def test_fsdp2_memory_model_matches_the_fake_world(lay, m):
    measured = fw.simulate(WIDE, lay, micro_batches=m, timing=False).memory["total"]
    assert abs(_planner(WIDE, lay, m) / measured - 1) < 0.10


def test_the_book_model_misses_zero1s_accumulated_fp32_gradients():
    """ZeRO-1 with 4 micro-batches: FSDP2 accumulates the whole gradients in FP32 (4 bytes a
    parameter) where the book counts BF16 ones (2): the book reads low, the FSDP2 model does not."""
    lay, m = Layout(dp=4, zero=1), 4
    measured = fw.simulate(WIDE, lay, micro_batches=m, timing=False).memory["total"]
    book = _planner(WIDE, lay, m, Rules(dropout=False, activation_model="pytorch"))
    assert book / measured < 0.85 < _planner(WIDE, lay, m) / measured


def test_fsdp2_terms():
    """Each term of fsdp2_memory, by hand: P parameters on the device, P_l a block's, d = 4."""
    m70 = Model("m", layers=8, hidden=512, heads=8, ffn=2048, seq_len=128)  # no vocabulary: P = 8 P_l
    P = m70.total_params
    P_l = P / 8
    z1 = fsdp2_memory(m70, Layout(dp=4, zero=1), 4, TORCH, 1.0)
    assert z1 == {"weights": 4 * P / 4 + 2 * P, "gradients": 4 * P, "optimizer": 8 * P / 4, "activations": 1.0}
    z1_one = fsdp2_memory(m70, Layout(dp=4, zero=1), 1, TORCH, 1.0)  # one micro-batch: reduced as made
    assert z1_one["gradients"] == pytest.approx(6 * P_l)
    z3 = fsdp2_memory(m70, Layout(dp=4, zero=3), 2, TORCH, 1.0)
    assert z3["weights"] == pytest.approx(P + 2 * P_l) and z3["gradients"] == pytest.approx(6 * P_l + P)
    ddp = fsdp2_memory(m70, Layout(dp=4, zero=0), 1, TORCH, 1.0)  # tiny activations: the end of the backward
    assert ddp == {"weights": 4 * P, "gradients": 4 * P, "optimizer": 8 * P, "activations": 0.0}
    assert loss_bytes(m70, Layout(dp=1), TORCH) == 0.0  # no vocabulary
    v = Model("v", layers=2, hidden=64, heads=4, ffn=128, seq_len=32, vocab=1000)
    assert loss_bytes(v, Layout(dp=1, tp=2, micro_batch=2), TORCH) == 2 * 32 * 500 * 18
    assert loss_bytes(v, Layout(dp=1, micro_batch=2), TORCH) == 2 * 32 * 1000 * 14
    assert loss_bytes(v, Layout(dp=1, pp=2), TORCH) == 0.0  # stage 0 holds no head
    assert loss_bytes(v, Layout(dp=1), Rules()) == 0.0  # the book's model


def test_stage_layers_give_stage_0s_layers():
    m = Model("s", layers=10, hidden=256, heads=4, ffn=1024, seq_len=256)
    lay = Layout(dp=1, pp=4, micro_batch=1)
    rules = lambda st: Rules(allow_uneven_stages=True, stage_layers=st, **fake_cases.PYTORCH)
    a3 = assess(m, h100_cluster(4), 8, lay, rules((2, 3, 3, 2)))
    a_ceil = assess(m, h100_cluster(4), 8, lay, rules(()))  # ceil(10 / 4) = 3 layers
    assert a3.memory["activations"] == pytest.approx(a_ceil.memory["activations"] * 2 / 3)
    with pytest.raises(ValueError, match="stage_layers"):
        assess(m, h100_cluster(4), 8, lay, rules((3, 3, 3, 3)))
    with pytest.raises(ValueError, match="stage_layers"):
        Rules(stage_layers=[2, 3])
    with pytest.raises(ValueError, match="memory_model"):
        Rules(memory_model="guess")
    with pytest.raises(ValueError, match="precision"):  # FSDP2's model is BF16 mixed precision only
        Rules(memory_model="fsdp2", precision="fp32")
    # the stages also set the state (stage 0's share of the weights) and the pace (the largest stage)
    assert a3.memory["weights"] == pytest.approx(a_ceil.memory["weights"] * 2 / 3)
    assert a3.time["compute"] == pytest.approx(a_ceil.time["compute"])


def test_defaults_keep_the_chapters_formulas():
    """Rules() is the book's model: the sum of helpers.memory's state and the activations."""
    from helpers.memory import per_device_bytes

    m = Model("b", layers=8, hidden=512, heads=8, ffn=2048, seq_len=128)
    a = assess(m, h100_cluster(4, reserve_bytes=0.0), 8, Layout(dp=4, zero=1), Rules())
    st = per_device_bytes(m.total_params, 4, 1)
    assert a.memory["weights"] == st["weights"] and a.memory["gradients"] == st["gradients"]
    assert a.memory["optimizer"] == st["master"] + st["moments"]


def test_optimizer_step_is_adamws_traffic_as_the_trace_counts_it():
    """The planner's optimizer step told FSDP2's recipe: ADAMW_BYTES_PER_PARAM bytes per parameter of
    this device's shard at the HBM bandwidth; the fake world's trace of the step (PyTorch's
    single-tensor AdamW, op by op) moves the same bytes."""
    from helpers.fake_world.timing import get_device
    from helpers.planner.assess import ADAMW_BYTES_PER_PARAM, optimizer_step_s

    hbm = get_device("h100_sxm").hbm
    cluster = h100_cluster(4)
    assert cluster.hbm_bytes_per_s == hbm
    for lay in (Layout(dp=4, zero=0), Layout(dp=4, zero=1)):
        step = fw.simulate(WIDE, lay, micro_batches=1)
        traced = sum(ph["mem"] for ph in step.timing if ph["kind"] == "opt") / hbm
        assert abs(optimizer_step_s(WIDE, cluster, lay, TORCH) / traced - 1) < 0.05, lay
    shard = WIDE.total_params / 4
    assert optimizer_step_s(WIDE, cluster, Layout(dp=4, zero=2), TORCH) == pytest.approx(ADAMW_BYTES_PER_PARAM * shard / hbm)
    assert optimizer_step_s(WIDE, cluster, Layout(dp=4, zero=2), Rules()) == 0.0  # the chapters' model leaves it out


def test_memory_rows_end_with_the_caching_allocators_reserve_beside_the_planners_total():
    case = fake_cases.Case("t", "wide", WIDE, Layout(dp=4, zero=1), h100_cluster(4), 16, Rules(dropout=False),
                           {"micro_batches": 4, "timing": False})
    step = case.simulate()
    rows = {q: (a, b, f) for q, a, b, f in fake_cases.memory_rows(case, step)}
    q, book, torch_, fake = fake_cases.memory_rows(case, step)[-1]
    assert q.startswith("reserved") and fake == step.peak_reserved
    assert step.peak_reserved >= rows["peak per device"][2] > 0  # the allocator holds at least what is allocated
    assert torch_ == case.planner(**fake_cases.PYTORCH)["total"] and book == case.planner()["total"]
    assert torch_ - rows["peak per device"][1] == case.cluster.reserve_bytes
