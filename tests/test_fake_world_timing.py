"""Step time and MFU from the fake world's trace (helpers.fake_world.timing): hand-derived cases."""
import json
import math
from types import SimpleNamespace

import pytest
import torch

from helpers import fake_world as fw
from helpers.fake_world import timing
from helpers.planner import Layout, Model

TINY = Model("tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)
H100 = dict(peak=989e12, hbm=3.35e12, nvlink=450e9, ib=50e9, a_nv=3.4e-6, a_ib=14.0e-6, base=8.4e-6)


def test_single_matmul_roofline_by_hand():
    dev = timing.get_device("h100_sxm")
    # the published best shape 6144 x 17920 (x 2816): 128x256 tiles 48 x 70 = 3360, 26 waves on 132 SMs;
    # 256x128 tiles 24 x 140 = 3360 too; 128x128 tiles 48 x 140 = 6720, 51 waves
    q_best = max(3360 / (26 * 132 * 1.0), 6144 * 17920 / (51 * 132 * 128 * 128))
    e_max = 792.1 / 989 / q_best
    # 8192^3: 128x256 tiles 64 x 32 = 2048, 16 waves; 128x128: 4096 tiles, 32 waves: both 2048/2112
    q = 2048 / (16 * 132)
    flops = 2 * 8192 ** 3
    moved = 3 * 8192 * 8192 * 2
    expect = flops / (H100["peak"] * e_max * q)
    assert timing.op_time(dev, ("mm", 1, 8192, 8192, 8192, 2, moved)) == pytest.approx(expect, rel=1e-12)
    assert expect > moved / H100["hbm"]  # compute-bound
    # K = 16: the bytes decide (memory-bound)
    moved = (8192 * 16 * 2 + 8192 * 8192) * 2
    assert timing.op_time(dev, ("mm", 1, 8192, 8192, 16, 2, moved)) == pytest.approx(moved / H100["hbm"], rel=1e-12)
    # attention at FlashAttention-3's 75%
    assert timing.op_time(dev, ("flops", 1e12, 0)) == pytest.approx(1e12 / (H100["peak"] * 0.75))


def test_op_log_records_shapes_flops_and_bytes():
    from helpers.fake_world.step import flop_counter
    from helpers.torch_private import FakeTensorMode

    counter = flop_counter()
    counter.op_log = log = timing.OpLog()
    with FakeTensorMode():
        a = torch.empty(32, 64, dtype=torch.bfloat16)
        b = torch.empty(64, 16, dtype=torch.bfloat16)
        x = torch.empty(8, 10)
        with counter:
            log.start("F", 0, 0)
            torch.mm(a, b)
            x + x
            x.view(80)
    ops, mem = log.phases[-1][3], log.phases[-1][4]
    assert ops == {("mm", 1, 32, 16, 64, 2, (32 * 64 + 64 * 16 + 32 * 16) * 2): 1}
    assert mem == 3 * 80 * 4  # the add reads two, writes one; the view moves nothing
    assert counter.get_total_flops() == 2 * 32 * 16 * 64


def test_all_reduce_inside_and_across_servers():
    dev = timing.get_device("h100_sxm")
    lay = Layout(dp=2, tp=8)
    assert timing.group_members(0, lay, "tp") == list(range(8))
    assert timing.group_members(3, lay, "dp") == [3, 11]
    inside, across = timing.axis_link(dev, 3, lay, "tp"), timing.axis_link(dev, 3, lay, "dp")
    assert (inside.name, across.name) == ("nvlink_h100", "infiniband_ndr_400")
    S = 1e9
    nv = H100["base"] + 2 * 7 * H100["a_nv"] + 2 * 7 / 8 * S / H100["nvlink"]
    ib = H100["base"] + 2 * 1 * H100["a_ib"] + 2 * 1 / 2 * S / H100["ib"]
    assert timing.collective_time("all_reduce", S, 8, inside) == pytest.approx(nv)
    assert timing.collective_time("all_reduce", S, 2, across) == pytest.approx(ib)
    assert timing.collective_time("all_gather", S, 8, inside) == pytest.approx(
        H100["base"] + 7 * H100["a_nv"] + 7 / 8 * S / H100["nvlink"])
    assert timing.collective_time("send", S, 2, across) == pytest.approx(H100["a_ib"] + S / H100["ib"])
    # servers of 16: the DP pair is inside one
    assert timing.axis_link(timing.get_device("h100_sxm", devices_per_node=16), 3, lay, "dp").name == "nvlink_h100"


def test_overlap_of_fsdp_collectives_by_hand():
    # 4 all-gathers of 1 s behind 2 s of compute in 4 units of 0.5 s: 1 + 3 x 0.5
    assert timing.exposed_overlapped(4, 1.0, 2.0) == pytest.approx(2.5)
    assert timing.exposed_overlapped(4, 1.0, 8.0) == pytest.approx(1.0)  # only the first is exposed
    assert timing.exposed_overlapped(0, 1.0, 8.0) == 0.0


def test_1f1b_timeline_and_bubble_by_hand():
    # 2 stages, forward 1, backward 2: (m + p - 1)(F + B), bubble (p - 1)/m of the busy time
    for m in (2, 4, 8):
        total = timing.one_f_one_b_time(2, [1.0] * m, [2.0] * m)
        assert total == (m + 1) * 3
        assert (total - 3 * m) / (3 * m) == pytest.approx(1 / m)
    # 4 stages, m = 4: (4 + 3) x 3
    assert timing.one_f_one_b_time(4, [1.0] * 4, [2.0] * 4) == 21
    # hand-offs of 0.5 (traced by hand in the docstring's rule): 2 stages, 2 micro-batches: 10, not 9
    assert timing.one_f_one_b_time(2, [1.0] * 2, [2.0] * 2, 0.5) == pytest.approx(10.0)
    # m = 3: stage 0 F0 [0,1] F1 [1,2]; stage 1 F0 [1.5,2.5] B0 [2.5,4.5]; stage 0 B0 [5,7]; stage 1
    # F1 [4.5,5.5] B1 [5.5,7.5]; stage 0 F2 [7,8] B1 [8,10]; stage 1 F2 [8.5,9.5] B2 [9.5,11.5];
    # stage 0 B2 [12,14]: 14, two hand-offs more than 12 + 2 x 0.5
    assert timing.one_f_one_b_time(2, [1.0] * 3, [2.0] * 3, 0.5) == pytest.approx(14.0)
    assert timing.one_f_one_b_time(1, [1.0, 1.0], [2.0, 2.0]) == 6


def test_a_backwards_gradient_reduction_holds_its_own_stage_not_the_previous_one():
    """The last 1.5 s of the last backward (its gradient sync) come after its input gradient has left.
    2 stages, m = 2, F 1, B 2: stage 0 F0 [0,1] F1 [1,2]; stage 1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7],
    its gradient leaving at 5.5; stage 0 B0 [4,6], B1 [6,8]: 8. Counted whole on the hand-off path,
    stage 0's B1 would wait for 7: 9, the sync once more for every stage the pipeline drains through."""
    assert timing.one_f_one_b_time(2, [1.0] * 2, [2.0] * 2, 0.0, [0.0, 1.5]) == 8
    assert timing.one_f_one_b_time(2, [1.0] * 2, [2.0] * 2, 0.0) == 9
    assert timing.one_f_one_b_time(2, [1.0] * 2, [2.0] * 2, 0.0, [0.0, 0.0]) == 9
    assert timing.one_f_one_b_time(1, [1.0] * 2, [2.0] * 2, 0.0, [0.0, 1.5]) == 6  # one stage: all of it


def test_the_bubble_does_not_grow_with_the_gradient_sync():
    """ZeRO-0 on 2 stages reduces its gradients in the last backward only: a slower network makes the
    exposed sync longer, and the bubble stays as it is (the sync is no longer replayed down the pipeline)."""
    step = fw.simulate(TINY, Layout(dp=2, pp=2, zero=0), micro_batches=4)
    fast, slow = (fw.step_time(step, devices_per_node=1, network=n) for n in ("infiniband_ndr_400", "infiniband_hdr_200"))
    assert slow.breakdown["exposed DP"] > fast.breakdown["exposed DP"] > 0
    assert slow.breakdown["bubble"] == pytest.approx(fast.breakdown["bubble"], rel=1e-12)


def test_interleaved_timeline_and_bubble_by_hand():
    # equal times, chunk forward 1 and backward 2, free hand-offs: Narayanan et al.'s bubble, (p - 1)/(v m)
    # of the busy time 3 v m (12.2.2): 2 ranks x 2 chunks, m = 4: 24 + 3; 4 x 2, m = 8: 48 + 9; m = p
    # (every forward first): 2 x 2, m = 2: 12 + 3; 2 x 3, m = 6: 54 + 3
    for p, v, m, total in ((2, 2, 4, 27), (4, 2, 8, 57), (2, 2, 2, 15), (2, 3, 6, 54 + 3)):
        f = {(c, i): 1.0 for c in range(v) for i in range(m)}
        b = {k: 2.0 for k in f}
        assert timing.interleaved_time(p, v, f, b) == pytest.approx(total)
        assert (total - 3 * v * m) / (3 * v * m) == pytest.approx((p - 1) / (v * m))
    # hand-offs of 0.5, 2 x 2, m = 2, traced by hand: rank 0 F(0,0) [0,1] F(0,1) [1,2]; rank 1 F(0,0) [1.5,2.5]
    # F(0,1) [2.5,3.5]; rank 0 F(1,0) [3,4] F(1,1) [4,5]; rank 1 F(1,0) [4.5,5.5] F(1,1) [5.5,6.5] B(1,0) [6.5,8.5]
    # B(1,1) [8.5,10.5]; rank 0 B(1,0) [9,11] B(1,1) [11,13]; rank 1 B(0,0) [11.5,13.5] B(0,1) [13.5,15.5];
    # rank 0 B(0,0) [14,16] B(0,1) [16,18]: 18, six hand-offs more than 15
    f = {(c, i): 1.0 for c in range(2) for i in range(2)}
    b = {k: 2.0 for k in f}
    assert timing.interleaved_time(2, 2, f, b, 0.5) == pytest.approx(18.0)
    # and against the schedule simulator of P.9 (helpers.pipeline_schedule.simulate: a device's forward f,
    # backward b, 1/v of them per chunk; comm between devices), with hand-offs that bind at other points
    from helpers import pipeline_schedule as ps

    for p, v, m, h in ((2, 2, 4, 0.3), (3, 2, 6, 1.7), (4, 3, 8, 0.6), (2, 2, 2, 2.5)):
        f = {(c, i): 1.0 for c in range(v) for i in range(m)}
        b = {k: 2.0 for k in f}
        sim = ps.simulate("interleaved", p, m, v=v, f=v * 1.0, b=v * 2.0, w=0, comm=h)
        assert timing.interleaved_time(p, v, f, b, h) == pytest.approx(float(sim.makespan), rel=1e-12)
    with pytest.raises(ValueError, match="one forward and one backward time per chunk"):
        timing.interleaved_time(2, 2, f, {(0, 0): 2.0})


def test_tiny_interleaved_model_end_to_end():
    """The same 4 layers on 2 ranks, plain 1F1B and 2 chunks per rank: the same FLOPs on rank 0 (an
    embedding and two layers; each chunk computes its own rotary tables, a few memory-bound ops more), a
    smaller bubble, more hand-offs, and the breakdown sums to the step."""
    four = Model("four", layers=4, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)
    m = 4
    one = fw.simulate(four, Layout(dp=1, pp=2), micro_batches=m)
    plain = fw.step_time(one)
    step = fw.simulate(four, Layout(dp=1, pp=2, v=2), micro_batches=m)
    st = fw.step_time(step)
    assert sum(st.breakdown.values()) == pytest.approx(st.step_s, rel=1e-12)
    assert step.flops == one.flops
    assert st.breakdown["compute"] == pytest.approx(plain.breakdown["compute"], rel=1e-2)
    assert 0 < st.breakdown["bubble"] < plain.breakdown["bubble"]
    assert st.breakdown["PP hand-off"] > plain.breakdown["PP hand-off"] > 0
    assert [(p["kind"], p["c"], p["i"]) for p in step.timing if p["kind"] in "FB"][:5] == \
        [("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1), ("F", 0, 2)]  # rank 0's warm-up: (p - 1) 2 + (v - 1) p
    assert any("chunks' times" in n for n in st.notes)
    with pytest.raises(ValueError, match="no steady round"):  # 2 PP micro-batches: no round to repeat
        timing.with_micro_batches(step, 8)


def test_tiny_two_stage_model_end_to_end():
    m = 4
    step = fw.simulate(TINY, Layout(dp=1, pp=2), micro_batches=m)
    st = fw.step_time(step)
    parts = st.breakdown
    assert sum(parts.values()) == pytest.approx(st.step_s, rel=1e-12)
    assert parts["exposed TP"] == parts["exposed DP"] == parts["exposed CP"] == 0.0
    # the hand-off: one 4,096-byte activation (1 x 32 x 64 BF16) over NVLink; on 2 stages with m >= 3 four
    # of them are on the critical path (fill, drain, and one round trip of the steady state: see below)
    h = H100["a_nv"] + 4096 / H100["nvlink"]
    assert parts["PP hand-off"] == pytest.approx(4 * h, rel=1e-9)
    # the bubble: (p - 1) forward + backward pairs of this stage, between its lightest and heaviest
    fb = [sum(timing.op_time(timing.get_device("h100_sxm"), k) * c for k, c in ph["ops"].items())
          + ph["mem"] / H100["hbm"] for ph in step.timing if ph["kind"] in ("F", "B")]
    assert min(fb) * 2 <= parts["bubble"] <= max(fb) * 2
    assert 0 < st.mfu < 1 and st.tokens_per_s_per_gpu == pytest.approx(m * 32 / 2 / st.step_s)
    assert st.planner is not None and st.planner["step_s"] > 0


def test_extrapolated_trace_times_like_the_full_trace():
    five = Model("five", layers=5, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)
    lay = Layout(dp=2, pp=1, zero=3)
    part = fw.simulate(five, lay, micro_batches=6, trace_layers=2, extrapolate="always")
    full = fw.simulate(five, lay, micro_batches=6, extrapolate=False)
    assert [p["kind"] for p in part.timing] == [p["kind"] for p in full.timing]
    for a, b in zip(part.timing, full.timing):
        assert (a["ops"], a["mem"], a["comm"]) == (b["ops"], b["mem"], b["comm"])
    assert fw.step_time(part).step_s == pytest.approx(fw.step_time(full).step_s, rel=1e-12)


def test_options_change_the_result():
    step = fw.simulate(TINY, Layout(dp=2, tp=2, zero=2), micro_batches=2)
    base = fw.step_time(step, devices_per_node=2)  # DP crosses servers
    assert base.links["dp"] == "infiniband_ndr_400" and base.links["tp"] == "nvlink_h100"
    slow = fw.step_time(step, devices_per_node=2, network="infiniband_hdr_200")
    assert slow.dp_total_s > base.dp_total_s
    inside = fw.step_time(step)  # servers of 8: everything on NVLink
    assert inside.links["dp"] == "nvlink_h100" and inside.dp_total_s < base.dp_total_s
    a100 = fw.step_time(step, "a100_sxm")
    assert a100.step_s > inside.step_s
    assert fw.step_time(step, planner=False).planner is None
    assert fw.simulate(TINY, Layout(dp=1), micro_batches=1, timing=False).timing is None


def test_bad_input():
    step = fw.simulate(TINY, Layout(dp=1), micro_batches=1)
    with pytest.raises(ValueError, match=r"unknown device 'b200'.*a100_sxm.*h100_sxm"):
        fw.step_time(step, "b200")
    with pytest.raises(ValueError, match="tpu_v5p.*has no hbm_bytes_per_s"):
        fw.step_time(step, "tpu_v5p")
    with pytest.raises(ValueError, match="link class 'h800' has no bytes_per_s"):
        fw.step_time(step, network="h800")
    with pytest.raises(ValueError, match="no link class 'roce'"):
        fw.step_time(step, network="roce")
    from helpers.planner.specs import hardware

    hw = json.loads(json.dumps(hardware()))
    del hw["nvlink_h100"]["bytes_per_s"]
    with pytest.raises(ValueError, match="link class 'nvlink_h100' has no bytes_per_s"):
        fw.step_time(step, hardware=hw)
    with pytest.raises(ValueError, match="no op trace"):
        fw.step_time(fw.simulate(TINY, Layout(dp=1), micro_batches=1, timing=False))
    with pytest.raises(ValueError, match="timing must be True or False"):
        fw.simulate(TINY, Layout(dp=1), micro_batches=1, timing="yes")
    with pytest.raises(ValueError, match="devices_per_node"):
        fw.step_time(step, devices_per_node=0)


def _run(**over):
    layout = dict(model="tiny_gpt", params_b=None, hardware="A100 80GB SXM (DGX A100)", world_size=2, dp_shard=1,
                  dp_replicate=2, tp=1, pp=1, cp=1, pp_schedule="none", micro_batches=None, local_batch=2, seq_len=32,
                  precision="mixed precision, 16-bit", recompute="none", optimizer=None,
                  other="vocabulary 256; hidden 64, 2 layers, 4 heads")
    layout.update(over.pop("layout", {}))
    row = dict(id="hand-1", layout=SimpleNamespace(**layout), mfu=0.5, tflops_per_gpu=None, peak_tflops=None,
               mfu_counts="Model FLOPs Utilization", notes="")
    row.update(over)
    return SimpleNamespace(**row)


def test_published_comparison_on_hand_made_runs():
    runs = [_run(), _run(id="fp8", layout={"precision": "Float8 linears"}), _run(id="h200", layout={"hardware": "H200"}),
            _run(id="sel", layout={"recompute": "selective-op"}), _run(id="noshape", layout={"other": "", "model": "other_gpt"}),
            _run(id="il", layout={"pp_schedule": "interleaved 1F1B"}),
            _run(id="il1", layout={"pp_schedule": "interleaved 1F1B, 1 stages per rank"})]
    out = timing.compare_published(runs)
    assert out["n"] == 1 and [c[0] for c in out["cannot"]] == ["fp8", "h200", "sel", "noshape", "il", "il1"]
    why = dict(out["cannot"])
    assert "stages per rank (v) unstated" in why["il"] and "plain 1F1B" in why["il1"]
    assert "1 byte instead of 2" not in why["fp8"]  # FSDP2's float8 all-gather named, with its effect, where used
    assert "1 byte instead of 2" in timing.express(_run(layout={"precision": "Float8 linears; FSDP float8 all-gather"}))
    # a row without the model's shapes takes them from another row of the same model (none here: refused above)
    borrowed = timing.express(_run(layout={"other": ""}), timing.model_shapes([_run()]))
    assert (borrowed[0].hidden, borrowed[0].layers, borrowed[0].heads) == (64, 2, 4)
    row = out["rows"][0]
    # the same run by hand: GPT of h 64, 2 layers, 4 heads, 4h MLP on 2 A100s (DDP), 2 micro-batches of 1
    model = Model("g", layers=2, hidden=64, heads=4, ffn=256, seq_len=32, vocab=256)
    st = fw.step_time(fw.simulate(model, Layout(dp=2), micro_batches=2), "a100_sxm")
    assert row["ours"] == pytest.approx(st.mfu, rel=1e-9)
    assert row["rel_err"] == pytest.approx(st.mfu / 0.5 - 1, rel=1e-9)
    assert out["max_rel_err"] == pytest.approx(abs(row["rel_err"]))
    assert out["within_15pct"] == (abs(row["rel_err"]) <= 0.15)
    assert not math.isnan(out["max_rel_err"])


def test_published_interleaved_run_is_traced_with_its_stages_per_rank():
    run = _run(id="il2", layout={"pp": 2, "dp_replicate": 1, "world_size": 2, "local_batch": 4,
                                 "pp_schedule": "interleaved 1F1B, 2 stages per rank",
                                 "other": "vocabulary 256; hidden 64, 4 layers, 4 heads"})
    model, layout, sim, dev, published, ours = timing.express(run)
    assert (layout.pp, layout.v, sim["micro_batches"], model.layers) == (2, 2, 4, 4)
    (row,) = timing.compare_published([run])["rows"]
    # by hand: the 4-layer GPT on 2 ranks of 2 chunks, 4 micro-batches of 1
    by_hand = Model("g", layers=4, hidden=64, heads=4, ffn=256, seq_len=32, vocab=256)
    st = fw.step_time(fw.simulate(by_hand, Layout(dp=1, pp=2, v=2), micro_batches=4), "a100_sxm")
    assert row["ours"] == pytest.approx(st.mfu, rel=1e-9) and row["layout"] == "DP1 TP1 PP2x2 ZeRO-0 mb1"
    odd = _run(id="il3", layout={**run.layout.__dict__, "local_batch": 3})
    assert "multiple of PP = 2" in timing.express(odd)


def test_check_layouts_keeps_the_steps_it_traced():
    from helpers import planner as pl
    from helpers.fake_world import cases
    from helpers.memory import GB

    p = pl.plan(TINY, pl.h100_cluster(2), 4)
    lays = [a.layout for a in p.ranked if a.layout.pp == 1][:2]
    kept = {}
    rows = cases.check_layouts(p, lays, keep=kept, micro_batches=2)
    assert list(kept) == lays
    for lay, row in zip(lays, rows):
        step = kept[lay]
        assert step.layout_spec == lay and step.micro_batches == 2
        assert row["PyTorch GB"] * GB == pytest.approx(step.memory["total"] + p.cluster.reserve_bytes)
        assert fw.step_time(step, planner=False).step_s > 0
    with pytest.raises(ValueError, match="keep must be a dict"):
        cases.check_layouts(p, lays, keep=[])
