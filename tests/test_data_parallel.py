"""P.6 and 12.1.1: averaging is exact, DDP equals one process, memory held, no_sync."""
import numpy as np
import pytest

from helpers import data_parallel as dp
from helpers.launcher import launch


def test_equal_shards_average_exactly_unequal_only_when_weighted():
    rng = np.random.default_rng(0)
    X, y, w = rng.normal(size=(64, 5)), rng.normal(size=64), rng.normal(size=5)
    full = dp.mse_grad(X, y, w)
    assert np.allclose(dp.mean_of_shard_grads(X, y, w, dp.split_evenly(64, 8)), full)
    uneven = dp.split_at(64, [10, 10, 44])
    assert not np.allclose(dp.mean_of_shard_grads(X, y, w, uneven), full)
    assert np.allclose(dp.weighted_shard_grads(X, y, w, uneven), full)


def test_mse_grad_equals_autograd_and_finite_differences():
    # an independent reference: every other check of P.6 has mse_grad on both sides
    import torch

    rng = np.random.default_rng(3)
    X, y, w = rng.normal(size=(40, 6)), rng.normal(size=40), rng.normal(size=6)
    g = dp.mse_grad(X, y, w)
    w_t = torch.tensor(w, requires_grad=True)
    (0.5 * ((torch.from_numpy(X) @ w_t - torch.from_numpy(y)) ** 2).mean()).backward()
    assert np.allclose(g, w_t.grad.numpy(), rtol=1e-12, atol=1e-14)
    loss = lambda v: 0.5 * np.mean((X @ v - y) ** 2)
    finite = [(loss(w + 1e-6 * e) - loss(w - 1e-6 * e)) / 2e-6 for e in np.eye(6)]
    assert np.allclose(g, finite, rtol=0, atol=1e-7)


def test_effective_batch():
    assert dp.effective_batch(4, 8, 2) == 64


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: dp.split_evenly(10, 3), "3 workers do not divide a batch of 10"),
        (lambda: dp.split_at(10, [5, 4]), "sum to 9, not the batch size 10"),
        (lambda: dp.split_at(10, [10, 0]), "at least one example"),
        (lambda: dp.effective_batch(0, 8), "per_worker must be an integer >= 1"),
        (lambda: dp.shard_sizes_for(30, 4), "world size 4 does not divide the batch 30"),
        (lambda: dp.rank_rows(30, 0, 4), "world size 4 does not divide the batch 30"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_ddp_equals_single_process_for_equal_and_weighted_unequal_shards():
    ref, _ = dp.train_single(steps=3, batch=32)
    for kwargs in ({}, {"sizes": [4, 4, 4, 20]}):
        run = launch(dp.ddp_train_worker, steps=3, batch=32, world_size=4, quiet=True, **kwargs)
        for res in run.results:
            assert max((a - b).abs().max().item() for a, b in zip(res["params"], ref)) < 1e-12
    naive = launch(dp.ddp_train_worker, steps=3, batch=32, sizes=[4, 4, 4, 20], weighted=False, world_size=4, quiet=True)
    assert max((a - b).abs().max().item() for a, b in zip(naive.results[0]["params"], ref)) > 1e-4


def test_mixed_precision_rank_holds_16_bytes_per_parameter():
    run = launch(dp.mixed_precision_ddp_worker, world_size=2, quiet=True)
    for res in run.results:
        n, held = res["n_params"], res["held"]
        assert (held["weights"], held["gradients"], held["master"], held["moments"]) == (2 * n, 2 * n, 4 * n, 8 * n)


def test_no_sync_gives_the_same_gradient_with_one_all_reduce():
    ref = dp.accumulated_gradient_single(4, 4)
    with_ns = launch(dp.accumulation_worker, 4, True, world_size=4, quiet=True)
    without = launch(dp.accumulation_worker, 4, False, world_size=4, quiet=True)
    assert with_ns.count("all_reduce") == 1 and without.count("all_reduce") == 4
    for run in (with_ns, without):
        assert (run.results[0] - ref).abs().max().item() < 1e-12


def test_rank_rows_tile_the_batch_in_rank_order():
    rows = [dp.rank_rows(12, r, 3) for r in range(3)]
    assert rows == [slice(0, 4), slice(4, 8), slice(8, 12)]
