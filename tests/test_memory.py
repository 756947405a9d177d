"""12.1.1 memory accounting (and the ZeRO stages of 12.1.2) against the book and the ZeRO paper."""
import pytest

from helpers import memory as M


def test_sixteen_bytes_per_parameter_and_the_breakdown():
    b = M.bytes_per_param("bf16-mixed", "adamw")
    assert (b.weights, b.gradients, b.master, b.moments, b.total) == (2, 2, 4, 8, 16)
    assert b.optimizer_state == 12  # the ZeRO paper's K


def test_the_75b_on_64_gpus_example_and_the_zero_paper_row():
    per = M.per_device_bytes(7.5e9, 64, zero_stage=0)
    assert {k: v / M.GB for k, v in per.items()} == {"weights": 15, "gradients": 15, "master": 30, "moments": 60}
    row = [round(M.per_device_total(7.5e9, 64, s) / M.GB, 2) for s in range(4)]
    assert row == [120.0, 31.41, 16.64, 1.88]  # ZeRO paper Table 1: 120, 31.4, 16.6, 1.88 GB


def test_13b_on_8_gpus_is_208_gb():
    assert M.per_device_total(13e9, 8) / M.GB == 208


def test_sgd_and_fp32_recipes():
    assert M.bytes_per_param("bf16", "sgd").total == 4
    assert M.bytes_per_param("bf16-mixed", "sgd").total == 8
    assert M.bytes_per_param("fp32", "adamw").total == 16


def test_max_params_that_fit_inverts_the_total():
    n = M.max_params_that_fit(80e9, 1, 0)
    assert n == pytest.approx(5e9)
    assert M.per_device_total(n, 1, 0) == pytest.approx(80e9)


def test_allreduce_bytes_and_min_tokens():
    assert M.allreduce_bytes_per_rank(7.5e9, 64) == pytest.approx(2 * 63 / 64 * 15e9)
    assert M.min_tokens_per_gpu(1e9, 0.1, 6e14, ratio=2) == pytest.approx(2 * 0.1 * 6e14 / 6e9)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: M.bytes_per_param("int4"), "unknown precision"),
        (lambda: M.bytes_per_param(optimizer="lion"), "unknown optimizer"),
        (lambda: M.per_device_bytes(-1), "n_params must be a finite number > 0"),
        (lambda: M.per_device_bytes(1e9, 0), "world_size must be an integer >= 1"),
        (lambda: M.per_device_bytes(1e9, 8, zero_stage=4), "zero_stage must be 0, 1, 2 or 3"),
        (lambda: M.max_params_that_fit(80e9, reserve_bytes=90e9), "device_bytes > reserve_bytes"),
        (lambda: M.min_tokens_per_gpu(1e9, 0, 1e12), "must all be positive"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_measure_counts_shared_storage_once_and_separates_counters():
    import torch

    lin = torch.nn.Linear(10, 10)
    opt = torch.optim.AdamW(lin.parameters())
    lin(torch.ones(2, 10)).sum().backward()
    opt.step()
    held = M.measure_model_state(list(lin.parameters()), opt)
    n = 110
    assert held["weights"] == held["gradients"] == 4 * n
    assert held["moments"] == 8 * n and held["counters"] == 2 * 4
    view = lin.weight.detach()[0]
    assert M.tensor_bytes([lin.weight, view]) == 4 * 100
