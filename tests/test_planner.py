"""The layout planner (12.4.1, P.11, P.15) and the case studies (12.4.2): worked numbers,
constraints with their reasons, the time model's parts, and the published configurations."""
from fractions import Fraction

import pytest

from helpers import case_studies as cs
from helpers import planner as pl
from helpers.memory import GB


@pytest.fixture(scope="module")
def h256():
    return pl.h100_cluster(256)


@pytest.fixture(scope="module")
def plan70(h256):
    return pl.plan(pl.book_70b(), h256, 2048)


def test_book_p11_rows_match():
    rows = {k: (book, got) for k, book, got in pl.book_p11()}
    for key in ("devices DP x TP x PP", "layers per stage 32/PP", "heads per device 32/TP", "training state, 16 B/param (GB)",
                "per device without sharding (GB)", "weights + gradients, 4 x 40e9 / 8 (GB)",
                "optimizer state over DP=2, 12 x 40e9 / 16 (GB)", "total per device with ZeRO-1 (GB)",
                "left for activations of 80 GB (GB)", "global batch 2 x 8 x 4 (sequences)"):
        book, got = rows[key]
        assert got == pytest.approx(book), key
    assert rows["share of the weights per device"][1] == "1/8"
    assert rows["bubble (p-1)/(m+p-1), p=2, m=8"][1].startswith("1/9")


def test_book_12_4_1_recomputed():
    r = {k: v[1] for k, v in pl.book_12_4_1().items()}
    assert r["70B weights per GPU at TP=8 (GB)"] == pytest.approx(17.5)
    assert r["moments per GPU, sharded over DP=32 (GB)"] == pytest.approx(2.1875)  # book: 17.5
    assert r["per-GPU model state, ZeRO-1 (GB)"] == pytest.approx(17.5 + 17.5 + 3.28125)  # book: 52.5
    assert r["gradient bytes each GPU sends per step (GB)"] == pytest.approx(2 * 31 / 32 * 17.5)  # book: 4.4
    assert r["forward+backward per step at 100% of 989 TFLOP/s (s)"] == pytest.approx(6 * 70e9 * 2048 * 4096 / 256 / 989e12)
    assert r["405B weights per GPU at TP=8, PP=8 (GB)"] == pytest.approx(12.65625)
    assert r["bubble (p-1)/m at m = 4p, p = 8"] == pytest.approx(7 / 32)
    assert r["bubble (p-1)/(m+p-1) at m = 4p, p = 8"] == pytest.approx(7 / 39)


def test_model_counts():
    llama = cs.llama3_model()
    assert llama.total_params == pytest.approx(405.85e9, rel=1e-3)
    assert llama.active_params == llama.total_params and llama.expert_params == 0
    m70 = pl.book_70b()
    assert m70.total_params == 70e9 and m70.flops_per_token() == 6 * 70e9 + 12 * 80 * 4096 * 8192
    ds = cs.deepseek_model()
    assert ds.total_params == pytest.approx(671e9, rel=2e-3)
    assert ds.active_params == pytest.approx(37e9, rel=0.03)
    assert 0.97 < ds.expert_params / ds.total_params < 0.98
    for size in ("2B", "9B", "27B"):
        c = cs.gemma2_param_check(size)
        assert c["non-embedding, counted"] == c["non-embedding, Table 2"]
        assert c["embedding, counted"] == c["embedding, Table 2"]


def test_the_12_2_2_example_on_its_a100_cluster():
    m = pl.book_175b()
    assert sum(m.counted().values()) == 96 * 12 * 12288 ** 2 and m.total_params == 175e9 and m.seq_len == 2048
    c = pl.a100_cluster(64)
    assert (c.peak_flops, c.memory_bytes, c.intra_bw, c.inter_bw, c.devices_per_node) == (312e12, 80e9, 300e9, 25e9, 8)
    # the section's layout (PP8 x DP8, no TP) cannot hold 12 layers' weights + gradients + Adam state (erratum 12.2.2-6)
    book = pl.assess(m, c, 1024, pl.Layout(dp=8, pp=8, zero=1, micro_batch=4))
    assert not book.ok and book.m == 32 and "GB per device" in book.reasons[0]
    assert book.time["bubble"] == pytest.approx(7 / 32 * book.time["compute"])
    # FSDP over all 64 GPUs fits only with full recomputation, which costs 4/3 of the compute
    assert not pl.assess(m, c, 1024, pl.Layout(dp=64, zero=3, micro_batch=4)).ok
    fsdp = pl.assess(m, c, 1024, pl.Layout(dp=64, zero=3, micro_batch=4, recompute="full"))
    assert fsdp.ok and fsdp.time["compute"] == pytest.approx(4 / 3 * book.time["compute"])


def test_rejections_name_the_constraint(h256):
    m = pl.book_70b()

    def why(**kw):
        a = pl.assess(m, h256, 2048, pl.Layout(**kw))
        assert not a.ok
        return " | ".join(a.reasons)

    assert "= 128, not the 256 devices" in why(dp=16, tp=8)
    assert "TP=16 spans 2 servers" in why(dp=16, tp=16)
    assert "TP=3 does not divide the 64 attention heads" in why(dp=1, tp=3, pp=1)
    assert "PP=32 does not divide the 80 layers" in why(dp=1, tp=8, pp=32)
    assert "does not divide the global batch of 2048" in why(dp=32, tp=8, micro_batch=3)
    assert "more than 80 GB" in why(dp=64, tp=4, zero=1)
    assert "needs a mixture-of-experts model" in why(dp=32, tp=8, ep=2)
    assert "needs m = 1 micro-batches to be a multiple of PP = 2" in why(dp=16, tp=8, pp=2, v=2, micro_batch=128)
    odd = pl.Model("x", 8, 64, 4, 128, 4094)
    assert "2 x CP = 6 equal chunks" in pl.assess(odd, pl.h100_cluster(24), 24, pl.Layout(dp=8, cp=3)).reasons[0]


def test_rules_switches(h256):
    m = pl.book_70b()
    a = pl.assess(m, h256, 2048, pl.Layout(dp=16, tp=16), pl.Rules(tp_within_node=False))
    assert not any("servers" in r for r in a.reasons) and any("servers" in n for n in a.notes)
    assert any("replicated" in n for n in a.notes)  # 16 > 8 KV heads
    llama = cs.llama3_model()
    c = pl.h100_cluster(16384)
    strict = pl.assess(llama, c, 2048, pl.Layout(dp=128, tp=8, pp=16, zero=2))
    loose = pl.assess(llama, c, 2048, pl.Layout(dp=128, tp=8, pp=16, zero=2), cs.LLAMA_RULES)
    assert any("does not divide the 126 layers" in r for r in strict.reasons)
    assert loose.ok and any("uneven" in n for n in loose.notes)
    drop = pl.assess(llama, c, 2048, pl.Layout(dp=128, tp=8, pp=16, zero=2), pl.Rules(allow_uneven_stages=True))
    assert drop.memory["activations"] > loose.memory["activations"]


def test_time_model_parts(plan70, h256):
    m = pl.book_70b()
    for a in plan70.ranked:
        t = a.time
        busy = t["compute"] + t["tp"] + t["cp"] + t["ep"]
        assert t["bubble"] == pytest.approx(float(Fraction(a.layout.pp - 1, a.layout.v * a.m)) * busy)
        assert t["total"] == pytest.approx(busy + t["bubble"] + t["pp hand-off"] + t["dp exposed"])
        assert (t["tp"] == 0) == (a.layout.tp == 1)
        assert 0 < a.mfu < h256.efficiency
        assert a.memory["total"] <= h256.memory_bytes
    assert [a.step_s for a in plan70.ranked] == sorted(a.step_s for a in plan70.ranked)
    assert all(a.reasons for a in plan70.rejected)
    # activation memory: no pipeline = one micro-batch through every layer; 1F1B stage 0 the same
    lay1 = pl.Layout(dp=32, tp=8)
    lay4 = pl.Layout(dp=8, tp=8, pp=4)
    a1, a4 = pl.stage_activation_bytes(m, lay1, 64), pl.stage_activation_bytes(m, lay4, 256)
    assert a1["layers in flight"] == 80 and a4["layers in flight"] == 4 * 20
    assert pl.stage_activation_bytes(m, pl.Layout(dp=32, tp=8, recompute="full"), 64)["total"] < a1["total"] / 5
    # recomputation costs a third more compute
    base = pl.step_time_breakdown(m, h256, 2048, lay1, 64)["compute"]
    assert pl.step_time_breakdown(m, h256, 2048, pl.Layout(dp=32, tp=8, recompute="full"), 64)["compute"] == pytest.approx(base * 4 / 3)


def test_recipes_and_ranking(plan70, h256):
    m = pl.book_70b()
    book = pl.Layout(dp=32, tp=8, zero=1)
    seq, steps = pl.decision_sequence(m, h256, 2048)
    assert seq == book and steps[0]["answer"] is False
    thumb, _ = pl.rule_of_thumb(m, h256, 2048)
    assert thumb == book
    assert plan70.find(book).ok and plan70.rank_of(book) > 1  # valid, but the time model prefers less TP
    assert plan70.best.layout.tp < 8
    lines = pl.explain(plan70.find(book), m, h256)
    assert lines[0].startswith("TP=8") and "inside one server" in lines[0]
    kinds = {w for w, _ in pl.neighbours(plan70, book)}
    assert {"TP x2 (DP /2)", "TP /2 (DP x2)", "ZeRO-0", "ZeRO-2", "recompute toggled"} <= kinds
    small = pl.Model("1B", layers=16, hidden=2048, heads=16, ffn=8192, seq_len=2048)
    lay, st = pl.decision_sequence(small, h256, 2048)
    assert lay == pl.Layout(dp=256) and st[0]["answer"] is True
    # a 405B at 128K tokens: context parallelism first, then the pipeline; the batch of 16 cannot fill it
    lay, st = pl.decision_sequence(cs.llama3_model(131072), h256, 16, cs.LLAMA_RULES)
    assert (lay.cp, lay.tp, lay.pp) == (2, 8, 16) and st[1]["answer"] is True and st[-1]["answer"] is False
    text = pl.format_steps(st)
    starts = [line for line in text.splitlines() if not line.startswith("      ")]  # one line opens each step
    assert len(starts) == len(st) and all(line.startswith("  " + s["question"]) for line, s in zip(starts, st))
    assert all(len(line) <= pl.WIDTH for line in text.splitlines())
    flat = " ".join(text.split())
    assert all(" ".join(s["detail"].split()) in flat for s in st)  # wrapped, never cut
    rep = pl.report(plan70, 3)
    assert rep.splitlines()[0].startswith("layout") and "rejected: {" in rep and "Step " in rep


def test_wrap_breaks_at_spaces_within_the_width():
    text = "  " + " ".join(f"all-reduce{i} of {i}.5 GB" for i in range(30))
    out = pl.wrap(text, 4, width=60)
    lines = out.splitlines()
    assert len(lines) > 1 and all(len(line) <= 60 for line in lines)
    assert lines[0].startswith("  all-reduce0") and all(line.startswith("      ") for line in lines[1:])
    assert out.split() == text.split()  # every word kept whole, hyphenated ones too
    assert pl.wrap("short") == "short"
    assert pl.wrap("x" * 130) == "x" * 130  # a word longer than a line stays whole
    for sentence in pl.explain(pl.plan(pl.book_70b(), pl.h100_cluster(256), 2048).best, pl.book_70b(),
                               pl.h100_cluster(256)):
        assert all(len(line) <= pl.WIDTH for line in sentence.splitlines())


def test_rule_of_thumb_turns_to_zero_3_when_the_batch_cannot_fill_the_pipeline(h256):
    m405 = pl.Model("405B", layers=80, hidden=20480, heads=160, kv_heads=8, ffn=81920, seq_len=4096, n_params=405e9)
    assert pl.rule_of_thumb(m405, h256, 128)[0] == pl.Layout(dp=4, tp=8, pp=8, zero=1)  # m = 32 = 4p: keep PP
    lay, steps = pl.rule_of_thumb(m405, h256, 64)  # m = 16 < 4p = 32
    assert lay == pl.Layout(dp=32, tp=8, zero=3) and "m = 16 < 4p = 32" in steps[-1]["question"]


def test_llama_readback_picks_the_published_degrees():
    ph = cs.llama3_phases()[1]
    c = pl.h100_cluster(ph["gpus"])
    p = pl.plan(ph["model"], c, ph["global_batch"], cs.LLAMA_RULES, micro_batches=(1, 2), vs=(1, 2, 4), zero_stages=(1, 2, 3))
    best = p.best.layout
    assert (best.dp, best.tp, best.pp) == (128, 8, 16)
    for row in cs.llama3_phases():
        lay = row["layout"]
        assert lay.devices == row["gpus"] and row["tokens"] == pytest.approx(16.8e6, rel=0.01)


def test_case_studies_numbers():
    rows = {r[0]: r for r in cs.book_12_4_2()}
    assert rows["BF16 weights per GPU at TP=8, PP=16 (GB)"][2] == "6.33"
    assert rows["CP degree for 128K"][2] == "16"
    rule = cs.pp32_rule()
    assert rule["(p-1)/m at p=32, m=128"] == pytest.approx(31 / 128) and rule["m for (p-1)/m <= 20%"] == 155
    r = cs.deepseek_ratio()
    assert 0.5 < r["ratio, 8 copies"] < r["ratio, 4 copies"] < 2.5  # the report: "approximately 1:1"
    ds = {k: pl.assess(cs.deepseek_model(), cs.deepseek_cluster(), 15360, lay, cs.DEEPSEEK_RULES)
          for k, lay in cs.deepseek_layouts().items()}
    pub, dense = ds["published: PP16 EP64 DP128, no TP"], ds["dense recipe: TP8 PP16 EP8 DP16"]
    assert pub.ok and dense.ok and pub.step_s < dense.step_s and pub.memory["total"] < 40 * GB
    g = cs.gemma2_model()
    p = pl.plan(g, cs.gemma2_cluster(), 768, micro_batches=(1,), max_tp=32)
    assert p.best.layout.tp == 8 and p.best.layout.dp == 768  # one sequence per replica forces 8-way model sharding
    assert cs.sources("gemma2")["paper"].startswith("Gemma Team")


def test_bad_input():
    with pytest.raises(ValueError, match="dp must be an integer >= 1"):
        pl.Layout(dp=0)
    with pytest.raises(ValueError, match="ZeRO stage"):
        pl.Layout(dp=1, zero=4)
    with pytest.raises(ValueError, match="recompute must be one of"):
        pl.Layout(dp=1, recompute="some")
    with pytest.raises(ValueError, match="interleaving"):
        pl.Layout(dp=1, v=2)
    with pytest.raises(ValueError, match="kv_heads=3 must divide heads=8"):
        pl.Model("x", 2, 64, 8, 128, 16, kv_heads=3)
    with pytest.raises(ValueError, match="mixture-of-experts"):
        pl.Model("x", 2, 64, 8, 128, 16, experts=4)
    with pytest.raises(ValueError, match="efficiency"):
        pl.h100_cluster(8, efficiency=1.5)
    with pytest.raises(ValueError, match="do not fill servers"):
        pl.h100_cluster(12)
    with pytest.raises(ValueError, match="global_batch"):
        pl.assess(pl.book_70b(), pl.h100_cluster(8), 0, pl.Layout(dp=8))
    with pytest.raises(ValueError, match="n must be an integer"):
        pl.divisors(0)
    with pytest.raises(ValueError, match="unknown configuration"):
        cs.load("gpt4")
    with pytest.raises(ValueError, match="size must be"):
        cs.gemma2_model("7B")
    with pytest.raises(ValueError, match="no layout satisfies"):
        pl.plan(pl.book_70b(), pl.h100_cluster(8), 64).best


# A small model on a made-up cluster with round figures, so that the time model's parts can be
# worked out by hand from the module docstring's formulas (alpha-beta ring: 2(N-1) alpha +
# 2(N-1)/N S / beta for an all-reduce).
def _toy():
    model = pl.Model("toy", layers=4, hidden=1024, heads=8, ffn=4096, seq_len=1024, n_params=1e9)
    cluster = pl.Cluster("toy", n_devices=16, devices_per_node=8, memory_bytes=80e9, peak_flops=1e15,
                         intra_bw=1e11, inter_bw=1e10, alpha_intra=1e-5, alpha_inter=2e-5, efficiency=0.5)
    return model, cluster


def test_full_recomputation_repeats_the_forwards_tp_all_reduces():
    model, cluster = _toy()
    # TP=8 inside a server, DP=2: m = 16 / (2 x 1) = 8 micro-batches, 4 layers on the one stage;
    # one all-reduce of s b h x 2 bytes = 1024 x 1 x 1024 x 2 on 8 ranks at the server's links
    per = 2 * 7 * 1e-5 + 2 * 7 / 8 * (1024 * 1024 * 2) / 1e11
    for recompute, calls in (("none", 4), ("selective", 4), ("full", 6)):  # the forward's 2 all-reduces again
        t = pl.step_time_breakdown(model, cluster, 16, pl.Layout(dp=2, tp=8, recompute=recompute), 8)
        assert t["tp"] == pytest.approx(calls * 4 * 8 * per, rel=1e-12), recompute


def test_dp_ring_hides_behind_the_last_micro_batchs_backward_only():
    model, cluster = _toy()
    # DP=16 over 2 servers, ZeRO-1, global batch 64: m = 4 micro-batches per replica
    compute = (6 * 1e9 + 12 * 4 * 1024 * 1024) * 64 * 1024 / 16 / (1e15 * 0.5)
    ring = 2 * 15 * 2e-5 + 2 * 15 / 16 * (1e9 * 2) / 1e10  # the BF16 gradients, inter-server links
    t = pl.step_time_breakdown(model, cluster, 64, pl.Layout(dp=16, zero=1), 4)
    assert t["compute"] == pytest.approx(compute, rel=1e-12)
    assert t["dp (total)"] == pytest.approx(ring, rel=1e-12)
    # the backward (2/3 of the compute) of one micro-batch of the 4 is the window
    assert t["dp exposed"] == pytest.approx(ring - compute * 2 / 3 / 4, rel=1e-12)
    assert t["total"] == pytest.approx(compute + ring - compute * 2 / 3 / 4, rel=1e-12)


def test_decision_sequence_judges_the_bubble_as_idle_over_total(h256):
    # the 405B at 128K on 256 GPUs ends at TP8 x PP16 x CP2, so DP = 256 / 256 = 1 and the batch of 16
    # gives m = 16: P.9's (p-1)/(m+p-1) = 15/31 = 48.4%; 12.2.2's (p-1)/m would be 15/16 = 93.8%
    for target, passes in ((0.1, False), (0.5, True), (0.9, True)):
        lay, st = pl.decision_sequence(cs.llama3_model(131072), h256, 16, cs.LLAMA_RULES, bubble_target=target)
        assert (lay.dp, lay.cp, lay.tp, lay.pp) == (1, 2, 8, 16)
        assert st[-1]["question"].startswith("4b.") and st[-1]["answer"] is passes, target
        assert st[-1]["detail"].startswith(f"p = 16, m = 16: {15 / 31:.1%}")


def test_zero2_reduce_scatters_every_micro_batch_behind_its_own_backward():
    """ZeRO-2 shards the gradients, so each of the m micro-batches' gradients is reduce-scattered
    (in its own backward); ZeRO-1 reduces the accumulated ones once. Under FSDP2's recipe the
    gradients travel in FP32 (reduce_dtype), the weights' all-gather in BF16."""
    model, cluster = _toy()
    compute = (6 * 1e9 + 12 * 4 * 1024 * 1024) * 64 * 1024 / 16 / (1e15 * 0.5)
    half = lambda nbytes: 15 * 2e-5 + 15 / 16 * nbytes / 1e10  # one half-ring over DP=16, inter-server
    w = compute * 2 / 3 / 4
    t = pl.step_time_breakdown(model, cluster, 64, pl.Layout(dp=16, zero=2), 4)
    assert t["dp (total)"] == pytest.approx(4 * half(2e9) + half(2e9), rel=1e-12)
    assert t["dp exposed"] == pytest.approx(3 * max(0.0, half(2e9) - w) + max(0.0, 2 * half(2e9) - w), rel=1e-12)
    assert t["dp exposed"] > pl.step_time_breakdown(model, cluster, 64, pl.Layout(dp=16, zero=1), 4)["dp exposed"]
    fsdp2 = pl.Rules(memory_model="fsdp2")
    t1 = pl.step_time_breakdown(model, cluster, 64, pl.Layout(dp=16, zero=1), 4, fsdp2)
    assert t1["dp (total)"] == pytest.approx(half(4e9) + half(2e9), rel=1e-12)
    t0 = pl.step_time_breakdown(model, cluster, 64, pl.Layout(dp=16, zero=0), 4, fsdp2)
    assert t0["dp (total)"] == pytest.approx(2 * half(4e9), rel=1e-12)  # replicate's FP32 all-reduce
