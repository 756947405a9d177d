"""P.12 inference: the TP-serving latency model, a real TP decode step with a KV cache on ranks,
and the static vs continuous batching simulation (hand-checked event times)."""
import numpy as np
import pytest
import torch

from helpers import inference as I
from helpers.launcher import launch
from helpers.tensor_parallel import BlockConfig, make_block_params, reference_block, shard_block_params

# ---- 1. the latency model ------------------------------------------------------------------------

def test_the_sections_tp_serving_example():
    b = I.book_tp_serving()
    assert b["one_device_s"] == pytest.approx(14e-3)
    assert b["memory_s"] == pytest.approx(3.5e-3)
    assert b["message_bytes"] == 8192 and b["allreduces"] == 64
    assert b["comm_s"] == pytest.approx(0.96e-3)
    assert b["total_s"] == pytest.approx(4.46e-3)
    assert round(b["speedup"], 2) == 3.14 and round(b["efficiency"], 2) == 0.78


def test_latency_model_limits_and_bandwidth_term():
    one = I.decode_time_per_token(14e9, 1000e9, tp=1)
    assert one["comm_s"] == 0 and one["speedup"] == 1 and one["efficiency"] == 1
    # efficiency = W/B / (W/B + t n alpha): 14 / (14 + 0.96 t) in ms
    for t in (2, 8, 16):
        assert I.decode_time_per_token(14e9, 1000e9, tp=t)["efficiency"] == pytest.approx(14 / (14 + 0.96 * t))
    # an 8 KB ring all-reduce over 4 devices at 300 GB/s: 2*3/4*8192/300e9 = 41 ns, far below alpha
    bw = I.decode_time_per_token(14e9, 1000e9, tp=4, message_bytes=8192, link_bw=300e9)
    assert bw["per_allreduce_s"] - 15e-6 == pytest.approx(2 * 3 / 4 * 8192 / 300e9)
    assert I.largest_tp_for_efficiency(0.5, 14e9, 1000e9) == 8
    assert I.largest_tp_for_efficiency(0.75, 14e9, 1000e9) == 4


@pytest.mark.parametrize("kwargs, match", [
    ({"weight_bytes": 0, "mem_bw": 1e12}, "weight_bytes must be a finite number > 0"),
    ({"weight_bytes": 1e9, "mem_bw": 1e12, "tp": 0}, "tp .* must be an integer >= 1"),
    ({"weight_bytes": 1e9, "mem_bw": 1e12, "alpha": -1e-6}, "alpha must be a finite number >= 0"),
])
def test_latency_model_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        I.decode_time_per_token(**kwargs)


def test_step_cost_from_the_model():
    assert I.kv_bytes_per_token(32, 4096, 2) == 524_288
    c = I.step_cost_from_model(prefill_s=0.05)
    assert c.fixed == pytest.approx(0.014) and c.per_seq == pytest.approx(524_288_000 / 1e12)
    assert c(16, 2) == pytest.approx(0.014 + 16 * 0.000524288 + 0.1)
    c4 = I.step_cost_from_model(tp=4)
    assert c4.fixed == pytest.approx(0.00446) and c4.per_seq == pytest.approx(c.per_seq / 4)
    with pytest.raises(ValueError, match="fixed must be a finite number > 0"):
        I.StepCost(0.0)


# ---- 2. the decode step -----------------------------------------------------------------------------

CFG = BlockConfig(h=32, heads=4, ffn=64)


def test_one_decode_layer_with_a_kv_cache_equals_the_full_block_at_the_last_position():
    # the last position attends to every earlier one, causal or not: reference_block's last row
    xs = I.decode_inputs(CFG, 7, batch=3)
    out = I.run_decoder(I.build_decoder(CFG, 1, seed=0), xs)["out"]
    ref = reference_block(xs[:, 0], make_block_params(CFG, 0), CFG)
    assert torch.allclose(out[-1, 0], ref[-1], rtol=0, atol=1e-13)
    assert not torch.allclose(out[2, 0], ref[2], atol=1e-6)  # earlier positions: causal differs


def test_decode_rejects_more_than_one_token_and_dropout():
    blk = I.build_decoder(CFG, 1)[0]
    with pytest.raises(ValueError, match="one token per sequence"):
        I.decode_block(blk, torch.zeros(2, 1, 32, dtype=torch.float64), {})
    with pytest.raises(ValueError, match="without dropout"):
        I.build_decoder(BlockConfig(h=32, heads=4, ffn=64, p_drop=0.1), 1)


def test_tensor_parallel_decode_on_ranks_matches_one_process_and_counts_allreduces():
    layers, steps, warm, batch = 3, 6, 2, 2
    ref = I.run_decoder(I.build_decoder(CFG, layers), I.decode_inputs(CFG, steps, batch))["out"]
    run = launch(I.tp_decode_worker, CFG, layers, steps, warm, batch, 0, "float64", world_size=4, quiet=True)
    for r in run.results:
        assert torch.allclose(r["out"], ref, rtol=1e-12, atol=1e-12)
        assert r["allreduces"] == [2 * layers] * (steps - warm)
    assert run.count("all_reduce") == 2 * layers * steps
    assert {o.bytes for o in run.comm[0] if o.op == "all_reduce"} == {I.hidden_message_bytes(32, 8, batch)}
    split = I.split_token_time(run.results)
    assert split["allreduces_per_token"] == 2 * layers
    assert split["token_s"] >= split["allreduce_s"] >= 0 and split["compute_s"] >= 0
    for rank, r in enumerate(run.results):  # each rank holds its shards; LayerNorms and row biases whole
        mine = [shard_block_params(make_block_params(CFG, l), rank, 4) for l in range(layers)]
        assert r["weight_bytes"] == sum(v.numel() * 8 for P in mine for v in P.values())


# ---- 3. the batching simulation ---------------------------------------------------------------------

def _three_requests():
    return I.Workload(np.array([0.0, 0.0, 0.5]), np.array([1, 3, 1]))


def test_static_batching_event_times_by_hand():
    r = I.simulate_serving(_three_requests(), "static", 2, I.StepCost(1.0))
    # A and B start at 0; A's only token at 1, B's tokens at 1, 2, 3; C waits for the batch to end
    assert r.admitted.tolist() == [0, 0, 3] and r.finish.tolist() == [1, 3, 4]
    assert r.latency.tolist() == [1, 3, 3.5] and r.first_token.tolist() == [1, 1, 4]
    assert (r.steps, r.slot_steps) == (4, 7) and r.useful_fraction == pytest.approx(5 / 7)


def test_continuous_batching_event_times_by_hand():
    r = I.simulate_serving(_three_requests(), "continuous", 2, I.StepCost(1.0))
    # C takes A's slot at t=1, the first step boundary after it arrives
    assert r.admitted.tolist() == [0, 0, 1] and r.finish.tolist() == [1, 3, 2]
    assert r.latency.tolist() == [1, 3, 1.5]
    assert (r.steps, r.slot_steps, r.useful_fraction) == (3, 5, 1.0)
    assert r.tpot.tolist() == [1.0]  # B: tokens at 1, 2, 3


def test_costs_per_sequence_and_prefill_and_two_replicas():
    cost = I.StepCost(1.0, per_seq=0.5, prefill=2.0)
    r = I.simulate_serving(_three_requests(), "continuous", 2, cost)
    # step 1: batch 2, 2 admitted: 1 + 1 + 4 = 6; then C joins (1 + 1 + 2 = 4); then B alone: 1.5
    assert r.finish.tolist() == [6, 11.5, 10]
    r2 = I.simulate_serving(_three_requests(), "static", 2, I.StepCost(1.0), replicas=2)
    assert r2.admitted.tolist() == [0, 0, 0.5] and r2.finish.tolist() == [1, 3, 1.5]


def test_continuous_capacity_is_batch_over_step_time_and_beats_static():
    cost = I.StepCost(0.01)
    cont = I.capacity("continuous", 8, cost, mean_tokens=64, n=2000)
    assert cont == pytest.approx(8 / 0.01, rel=0.02)
    assert I.capacity("static", 8, cost, mean_tokens=64, n=2000) < 0.6 * cont
    w = I.poisson_workload(20_000, 2.0, 64, seed=1)
    assert abs(w.lengths.mean() / 64 - 1) < 0.03 and abs(np.diff(w.arrivals).mean() * 2 - 1) < 0.03


def test_replicas_cut_waiting_not_time_per_token_and_tp_cuts_time_per_token():
    w = I.poisson_workload(400, 3.0, 64, seed=0)
    c1 = I.step_cost_from_model()
    one = I.simulate_serving(w, "static", 16, c1)
    four = I.simulate_serving(w, "static", 16, c1, replicas=4)
    tp4 = I.simulate_serving(w, "static", 16, I.step_cost_from_model(tp=4))
    assert np.median(four.queue_wait) < 0.1 * np.median(one.queue_wait)
    assert np.median(four.tpot) == pytest.approx(c1(1), rel=0.05)  # alone in its batch most of the time
    assert np.median(tp4.tpot) < 0.4 * np.median(four.tpot)


def test_simulation_rejects_bad_input():
    with pytest.raises(ValueError, match="policy must be"):
        I.simulate_serving(_three_requests(), "greedy", 2, I.StepCost(1.0))
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1"):
        I.simulate_serving(_three_requests(), "static", 0, I.StepCost(1.0))
    with pytest.raises(ValueError, match="sorted"):
        I.Workload(np.array([1.0, 0.5]), np.array([1, 1]))
    with pytest.raises(ValueError, match="integer >= 1 token"):
        I.Workload(np.array([0.0]), np.array([0]))
