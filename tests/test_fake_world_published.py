"""The fake world matched to memory measured on real clusters (helpers.fake_world.published; issue 26)."""
import dataclasses

import pytest

from helpers import published
from helpers.fake_world import published as fp


@pytest.fixture(scope="module")
def matches():
    return {m.point.id: m for m in fp.match()}


def test_llama31_dims_give_the_published_parameter_counts():
    # Meta's model cards: 8.03B and 70.6B parameters (embeddings and output head untied)
    assert fp.llama31("llama3.1_8b", 8192).total_params == pytest.approx(8.03e9, rel=2e-3)
    assert fp.llama31("llama3.1_70b", 8192).total_params == pytest.approx(70.55e9, rel=2e-3)
    with pytest.raises(ValueError, match="llama3.1_8b"):
        fp.llama31("llama3.1_13b", 8192)


def test_every_point_is_matched_or_refused_with_its_reason(matches):
    assert len(matches) == len(published.memory_points()) >= 10
    for m in matches.values():
        assert m.kind in ("exact", "nearest", "refused")
        assert (m.case is None) == (m.kind == "refused")
        assert (m.reason != "") == (m.kind == "refused"), m
        assert (len(m.differences) > 0) == (m.kind == "nearest"), m


def test_a_matched_point_carries_the_runs_configuration(matches):
    # tt24-t2-02: Llama 3.1 8B on 8 GPUs, FSDP 4 x CP 2, local batch 1 of 65,536 tokens, full AC,
    # torch.compile and Float8 (read in its row of data/published/memory.csv)
    m = matches["tt24-t2-02"]
    lay = m.case.layout
    assert (lay.dp, lay.tp, lay.pp, lay.cp, lay.zero, lay.micro_batch, lay.recompute) == (4, 1, 1, 2, 3, 1, "full")
    assert m.case.model.seq_len == 65536 and m.case.model.layers == 32 and lay.devices == 8
    assert m.kind == "nearest" and any("compile" in d for d in m.differences) and any("Float8" in d for d in m.differences)
    # FSDP2's float8 all-gather (torch 2.13 alone cannot trace it: no float8 weight type) is named with its effect
    assert any("float8 all-gather" in d and "1 byte instead of 2" in d for d in m.differences)


def test_refusals_name_what_is_missing(matches):
    assert "no sequence length" in matches["ttp-t1-01"].reason
    assert "micro-batch count unstated" in matches["tt24-t5-01"].reason
    # a recomputation the fake world cannot trace: its own refusal, by name
    point = next(p for p in published.memory_points() if p.id == "tt24-t1-01")
    odd = dataclasses.replace(point, layout=dataclasses.replace(point.layout, recompute="selective-layer-3"))
    (m,) = fp.match([odd])  # 32 layers: checkpoint_every=3 is traced, not refused
    assert m.kind == "exact" and m.case.sim["checkpoint_every"] == 3
    point = next(p for p in published.memory_points() if p.id == "tt24-t2-01")
    hsdp = dataclasses.replace(point, layout=dataclasses.replace(point.layout, dp_replicate=2))
    (m,) = fp.match([hsdp])
    assert m.kind == "refused" and "HSDP" in m.reason


def test_each_point_is_compared_with_the_figure_it_measures():
    # a point that measures reserved memory is set beside the fake reserve, one that measures allocated
    # memory beside the fake allocated peak; a source that does not say is read by measures_inferred
    from helpers.fake_world.cases import Case
    from helpers.planner import Layout, Model, Rules, h100_cluster

    tiny = Model("tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)
    lay = Layout(dp=2, zero=3)
    case = Case("published", "tiny", tiny, lay, h100_cluster(2), 2, Rules(dropout=False), {"micro_batches": 1})
    base = next(p for p in published.memory_points() if p.id == "tt24-t2-01")
    assert (base.measures, base.measures_inferred) == ("unstated", "reserved")
    points = {what: dataclasses.replace(base, id=what, measures=what) for what in ("allocated", "reserved")}
    points["inferred"] = dataclasses.replace(base, id="inferred")
    rows = {r["id"]: r for r in fp.compare([fp.Match(p, "exact", case) for p in points.values()])}
    step = case.simulate()
    gib = base.value_gib * 2**30
    assert rows["allocated"]["compared"] == "allocated"
    assert rows["allocated"]["ratio"] == pytest.approx(step.memory["total"] / gib, rel=1e-12)
    for key in ("reserved", "inferred"):
        assert rows[key]["compared"] == "reserved"
        assert rows[key]["ratio"] == pytest.approx(step.peak_reserved / gib, rel=1e-12)
    assert step.peak_reserved > step.memory["total"]  # the two figures differ: the test tells them apart


def test_each_point_is_traced_with_its_publications_recipe(matches):
    """The CSV's recompute, optimizer and precision columns become simulate's options (issue 26,
    "Real recipes"): torchtitan's 2024 runs (per-op selective checkpointing, AdamW foreach, FP32
    reduction, the loss on FP32 logits) are traced as they ran; Trainy's 2025 runs with fused AdamW."""
    t1 = matches["tt24-t1-01"]  # Llama 3.1 8B, FSDP 8, selective AC 'op', eager
    assert t1.kind == "exact" and t1.case.layout.recompute == "selective"
    assert "checkpoint_every" not in t1.case.sim  # per op, not per layer
    assert {k: t1.case.sim[k] for k in ("optimizer", "reduce_dtype", "loss_dtype")} == \
        {"optimizer": "foreach", "reduce_dtype": "float32", "loss_dtype": "float32"}
    assert matches["trainy-01"].case.sim["optimizer"] == "fused"
    assert matches["tt24-t2-01"].case.sim["optimizer"] == "foreach"
    point = next(p for p in published.memory_points() if p.id == "tt24-t1-01")
    vague = dataclasses.replace(point, layout=dataclasses.replace(point.layout, recompute="selective",
                                                                  optimizer="unstated"))
    opts, guessed = fp.recipe(vague.layout)
    assert opts["optimizer"] == "foreach" and guessed == (fp.SELECTIVE_KIND_UNSTATED, fp.OPTIMIZER_UNSTATED)
    (m,) = fp.match([vague])
    assert m.kind == "nearest" and m.differences == guessed  # what is guessed is listed, not hidden
