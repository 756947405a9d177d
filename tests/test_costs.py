"""helpers.costs: the chapters' closed forms, with exact values computed by hand, and their checks."""
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import costs

ROOT = Path(__file__).resolve().parent.parent


def test_ring_bytes_and_steps():
    # P.7: 2(N-1)/N x S for all-reduce, (N-1)/N x S for the half rings, S for a send
    assert costs.allreduce_bytes(4, 100) == 150
    assert costs.allreduce_bytes(1, 100) == 0
    assert costs.ring_bytes_sent("all_gather", 100, 4) == 75
    assert costs.ring_bytes_sent("reduce_scatter", 100, 4) == 75
    assert costs.ring_bytes_sent("all_to_all", 80, 8) == 70
    assert costs.ring_bytes_sent("send", 100, 2) == 100
    assert costs.ring_bytes_sent("recv", 100, 2) == costs.ring_bytes_sent("barrier", 0, 4) == 0
    assert costs.ring_bytes_sent("broadcast", 100, 4) == 100 and costs.ring_bytes_sent("broadcast", 100, 1) == 0
    assert [costs.ring_steps(op, 8) for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send")] == [14, 7, 7, 7, 1]


def test_alpha_beta_time():
    # T = 2(N-1) alpha + 2(N-1)/N S / beta: 14 x 10 us + 3.5 GB / 50 GB/s
    assert costs.alpha_beta_time(8, 2e9, 10e-6, 50e9) == pytest.approx(14 * 10e-6 + 3.5e9 / 50e9, rel=1e-15)
    assert costs.alpha_beta_time(4, 400, 1.0, 100.0, op="all_gather") == 3 * 1.0 + 300 / 100
    assert costs.alpha_beta_time(2, 500, 2.0, 100.0, op="send") == 2.0 + 5.0
    assert costs.alpha_beta_time(1, 1e9, 1.0, 1.0) == 0


def test_hierarchical_all_reduce_time():
    # one server: reduce-scatter + all-gather on the fast links = a ring all-reduce there
    assert costs.hierarchical_all_reduce_time(8, 1, 800, 1.0, 100.0, 50.0, 1.0) == costs.alpha_beta_time(8, 800, 1.0, 100.0)
    # one rank per server: a ring all-reduce over the servers' links
    assert costs.hierarchical_all_reduce_time(1, 4, 800, 50.0, 1.0, 1.0, 100.0) == costs.alpha_beta_time(4, 800, 1.0, 100.0)
    # 2 servers of 8, S = 1600 B: inside 2 x (7 alpha_i + 7/8 S / beta_i); across 2 alpha_o + 2 x 1/2 x S/8 / beta_o
    want = 2 * (7 * 1.0 + 1400 / 100.0) + (2 * 3.0 + 200 / 10.0)
    assert costs.hierarchical_all_reduce_time(8, 2, 1600, 1.0, 100.0, 3.0, 10.0) == pytest.approx(want, rel=1e-15)


def test_ring_overlap_tokens():
    # n = bytes F / (2 c g B): 2 x 1000 / (2 x 200) = 5 tokens; causal doubles it, 4 query heads per K/V head quarter it
    assert costs.ring_overlap_tokens(1000.0, 200.0) == 5.0
    assert costs.ring_overlap_tokens(1000.0, 200.0, causal=True) == 10.0
    assert costs.ring_overlap_tokens(1000.0, 200.0, q_per_kv=4) == 1.25
    assert costs.ring_overlap_tokens(1000.0, 200.0, bytes_per_value=4) == 10.0
    # 12.3.2's example (989 TF/s, 600 GB/s): 1,648 tokens per rank; its 16,384 give compute/transfer ~ 9.9 per step
    assert round(costs.ring_overlap_tokens(989e12, 600e9)) == 1648


def test_activation_bytes_per_layer():
    # Korthikanti et al.: s b h (34 + 5 a s / h); TP s b h (10 + 24/t + 5 a s/(h t)); TP+SP s b h / t (34 + 5 a s / h)
    s, b, h, a = 16, 2, 32, 4
    sbh = s * b * h
    assert costs.activation_bytes_per_layer(s, b, h, a) == sbh * (34 + 5 * a * s / h) == 45056
    assert costs.activation_bytes_per_layer(s, b, h, a, 4) == sbh * (10 + 6 + 2.5)
    assert costs.activation_bytes_per_layer(s, b, h, a, 4, sequence_parallel=True) == sbh / 4 * 44
    assert costs.activation_bytes_per_layer(s, b, h, a, 4, attention_scores=False) == sbh * 16
    # without the two 1-byte dropout masks: 2 s b h less, replicated under TP, split under SP
    assert costs.activation_bytes_per_layer(s, b, h, a, 4, attention_scores=False, dropout=False) == sbh * 14
    assert costs.activation_bytes_per_layer(s, b, h, a, 4, True, False, dropout=False) == sbh * 32 / 4
    assert costs.layer_input_bytes(s, b, h) == 2 * sbh and costs.layer_input_bytes(s, b, h, 4, True) == 2 * sbh / 4
    assert costs.layer_input_bytes(s, b, h, 4) == 2 * sbh  # plain TP: the input is replicated


def test_layer_params_and_flops():
    assert costs.layer_params(8, 32) == 4 * 64 + 2 * 8 * 32 == 768
    assert costs.layer_params(8, 32, mlp_matrices=3) == 4 * 64 + 3 * 8 * 32
    # grouped-query attention: Q and O 16 x (4 x 4) each, K and V 16 x (2 x 4) each
    assert costs.attention_params(16, heads=4, kv_heads=2) == 2 * 256 + 2 * 128
    assert costs.attention_params(16, heads=4, kv_heads=2, head_dim=8) == 2 * 512 + 2 * 256
    assert costs.mlp_params(16, 64, 3) == 3072
    # 6 tokens of sequences of 3: 2 x 6 x 768 weight FLOPs + 4 x 6 x 3 x 8 attention FLOPs
    assert costs.layer_forward_flops(6, 8, 32, 3) == 9216 + 576
    assert costs.mlp_forward_flops(6, 8, 32) == 2 * 6 * 512
    assert costs.attention_flops(4, 8, 16) == 2048 and costs.attention_flops(4, 8, 16, causal=True) == 1024
    assert costs.training_flops_per_token(70e9) == 420e9
    assert costs.training_flops_per_token(70e9, 80, 4096, 8192) == 6 * 70e9 + 12 * 80 * 4096 * 8192


def test_bytes_per_param():
    b = costs.bytes_per_param("bf16-mixed", "adamw")
    assert (b.weights, b.gradients, b.master, b.moments, b.optimizer_state, b.total) == (2, 2, 4, 8, 12, 16)
    assert costs.bytes_per_param("bf16", "sgd").total == 4 and costs.bytes_per_param("fp32", "sgd-momentum").total == 12


@pytest.mark.parametrize("call, match", [
    (lambda: costs.allreduce_bytes(0, 10), "the group size N must be an integer >= 1"),
    (lambda: costs.ring_bytes_sent("all_reduce", -1, 4), "payload_bytes must be a finite number >= 0"),
    (lambda: costs.ring_bytes_sent("all_reduce", 10, 2.5), "the group size N must be an integer >= 1"),
    (lambda: costs.ring_steps("all_reduce", 0), "the group size N must be an integer >= 1"),
    (lambda: costs.ring_steps("broadcast", 4), "no ring model of the steps of 'broadcast'"),
    (lambda: costs.alpha_beta_time(4, 1.0, 1e-6, 0), r"beta \(bytes/s per link\) must be a finite number > 0"),
    (lambda: costs.alpha_beta_time(4, 1.0, -1e-6, 1e9), r"alpha \(seconds per step\) must be a finite number >= 0"),
    (lambda: costs.activation_bytes_per_layer(0, 1, 8, 2), "s must be an integer >= 1"),
    (lambda: costs.activation_bytes_per_layer(8, 1, 8, 2, 0), "tensor-parallel degree t must be an integer >= 1"),
    (lambda: costs.layer_input_bytes(8, 1.5, 8), "b must be an integer >= 1"),
    (lambda: costs.mlp_params(8, 32, 4), "mlp_matrices must be 2"),
    (lambda: costs.attention_params(8, 0), "heads must be an integer >= 1"),
    (lambda: costs.layer_forward_flops(0, 8, 32, 4), "tokens must be an integer >= 1"),
    (lambda: costs.training_flops_per_token(0), "params must be a finite number > 0"),
    (lambda: costs.bytes_per_param("int4"), "unknown precision"),
    (lambda: costs.ring_overlap_tokens(1e12, 1e9, q_per_kv=0), r"q_per_kv \(query heads per K/V head\) must be an integer >= 1"),
    (lambda: costs.ring_overlap_tokens(1e12, 0), "link_bytes_per_s must be a finite number > 0"),
    (lambda: costs.hierarchical_all_reduce_time(0, 2, 1.0, 0, 1, 0, 1), r"per_node \(ranks per server\) must be an integer >= 1"),
    (lambda: costs.bytes_per_param(optimizer="lion"), "unknown optimizer"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_calculators_do_not_import_torch():
    """The cost module, the memory calculator and the planner (a whole assessment included) run
    without torch: a pure calculation must not drag in the rank code."""
    code = (
        "import sys\n"
        "from helpers import costs, memory, planner\n"
        "a = planner.assess(planner.book_70b(), planner.h100_cluster(64), 512, planner.Layout(dp=4, tp=8, pp=2, zero=1))\n"
        "assert a.ok and a.memory['activations'] > 0, a.reasons\n"
        "memory.per_device_bytes(70e9, 8, 3); costs.activation_bytes_per_layer(4096, 1, 8192, 64, 8, True)\n"
        "print(sorted(m for m in ('torch', 'helpers.sequence_parallel', 'helpers.tensor_parallel') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
