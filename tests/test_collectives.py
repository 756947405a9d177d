"""P.7 collectives: the numpy ring, the α-β model and its fit, the hand ring on real ranks."""
import numpy as np
import pytest

from helpers import collectives as C
from helpers.launcher import launch


def test_ring_allreduce_sums_on_every_device_in_2_n_minus_1_steps():
    rng = np.random.default_rng(0)
    for n in (2, 3, 4, 5):
        buffers = rng.integers(-9, 9, size=(n, 3 * n)).astype(float)
        states = C.ring_allreduce_steps(buffers)
        assert len(states) == 1 + 2 * (n - 1)
        assert np.array_equal(C.ring_allreduce(buffers), np.tile(buffers.sum(0), (n, 1)))


def test_after_reduce_scatter_device_d_owns_the_sum_of_chunk_d_plus_1():
    buffers = np.arange(16.0).reshape(4, 4)
    after_rs = C.ring_allreduce_steps(buffers)[3].chunks  # start + 3 reduce-scatter steps
    total = buffers.sum(0)
    for d in range(4):
        c = (d + 1) % 4
        assert after_rs[d, c, 0] == total[c]


def test_allreduce_equals_reduce_scatter_then_all_gather():
    buffers = np.random.default_rng(1).normal(size=(4, 8))
    rs = C.reduce_scatter(buffers)
    assert np.allclose(C.all_gather(rs), C.ring_allreduce(buffers))


def test_bytes_sent_counted_from_the_steps_equal_2_n_minus_1_over_n_s():
    for n in (2, 4, 8):
        states = C.ring_allreduce_steps(np.ones((n, 4 * n)))
        sent = C.bytes_sent_per_device(states, bytes_per_element=8)
        assert np.all(sent == C.ring_allreduce_bytes(n, 4 * n * 8))


def test_the_chapters_70_14_ms_example():
    t = C.alpha_beta_time(8, 2e9, alpha=10e-6, beta=50e9)
    assert C.ring_allreduce_bytes(8, 2e9) == pytest.approx(3.5e9)
    assert float(t) == pytest.approx(0.07014)


def test_fit_recovers_alpha_and_beta_from_model_data():
    sizes = np.logspace(3, 8, 12)
    times = C.alpha_beta_time(4, sizes, alpha=25e-6, beta=3e9)
    alpha, beta = C.fit_alpha_beta(4, sizes, times)
    assert alpha == pytest.approx(25e-6, rel=1e-6) and beta == pytest.approx(3e9, rel=1e-6)


def test_fit_takes_alpha_from_the_small_messages_and_beta_from_the_large_ones():
    # the largest message 10 % off (noise scales with the time): alpha barely moves, as it would
    # with an unweighted fit (there the 16 MB point's 5 ms error moves alpha by 14 %)
    sizes = np.array([2.0 ** k for k in range(10, 25, 2)])
    for factor in (1.1, 0.9):
        times = C.alpha_beta_time(4, sizes, alpha=250e-6, beta=0.5e9)
        times[-1] *= factor
        alpha, beta = C.fit_alpha_beta(4, sizes, times)
        assert alpha == pytest.approx(250e-6, rel=0.02) and beta == pytest.approx(0.5e9, rel=0.06)


def test_fit_keeps_alpha_at_zero_with_the_constrained_optimum_for_beta():
    sizes = np.array([1e6, 4e6, 1.6e7, 6.4e7])
    times = 1.5 * sizes / 1e9 - 6 * 50e-6  # a model with alpha = -50 us: the free fit's optimum
    alpha, beta = C.fit_alpha_beta(4, sizes, times)
    x = 1.5 * sizes / times  # relative residual with alpha = 0: x / beta - 1
    assert alpha == 0.0 and abs(np.sum(x * (x / beta - 1))) < 1e-9 * np.sum(x * x / beta)  # zero slope there


def test_fit_refuses_times_that_do_not_grow_with_size_and_shows_them():
    with pytest.raises(ValueError, match=r"do not grow with message size \(1024 B: 20 ms, 4194304 B: 9 ms\)"):
        C.fit_alpha_beta(4, [1024, 65536, 1 << 20, 1 << 22], [20e-3, 15e-3, 12e-3, 9e-3])


def test_time_allreduce_worker_synchronizes_around_each_timed_call(monkeypatch):
    import torch.distributed as dist

    seen = []
    monkeypatch.setattr(C, "_synchronize", lambda dev: seen.append(("sync", dev.type)))
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda x, *a, **k: (seen.append(("op", x.numel())), real(x, *a, **k)))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        out = C.time_allreduce_worker([64, 4096], repeats=2)
    finally:
        dist.destroy_process_group()

    def per_size(n):  # warm-up, then for each repeat: clock starts after a sync, stops after one
        return [("op", n), ("sync", "cpu")] + [("sync", "cpu"), ("op", n), ("sync", "cpu")] * 2

    assert seen == per_size(16) + per_size(1024)
    assert sorted(out) == [64, 4096] and all(t > 0 for t in out.values())


@pytest.mark.parametrize("statistic, expected", [("min", 1.0), ("median", 3.0)])
def test_time_allreduce_worker_reports_the_fastest_repeat_or_the_median(monkeypatch, statistic, expected):
    import time

    import torch.distributed as dist

    clock = iter([0.0, 3.0, 10.0, 11.0, 20.0, 25.0])  # three timed calls: 3 s, 1 s and 5 s
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert C.time_allreduce_worker([64], repeats=3, statistic=statistic) == {64: expected}
    finally:
        dist.destroy_process_group()


def test_synchronize_waits_for_a_gpu_only(monkeypatch):
    import torch

    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: waited.append(dev))
    C._synchronize(torch.device("cpu"))
    assert waited == []
    C._synchronize(torch.device("cuda", 1))
    assert waited == [torch.device("cuda", 1)]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: C.ring_allreduce_steps(np.ones((4, 6))), "4 devices do not divide a message of 6"),
        (lambda: C.ring_allreduce_steps(np.ones((1, 4))), "at least 2 devices"),
        (lambda: C.ring_allreduce_bytes(0, 10), "group size N must be an integer >= 1"),
        (lambda: C.ring_allreduce_bytes(4, -1), "payload_bytes must be a finite number >= 0"),
        (lambda: C.alpha_beta_time(4, 1.0, alpha=1e-6, beta=0), r"beta \(bytes/s per link\) must be a finite number > 0"),
        (lambda: C.fit_alpha_beta(4, [1.0], [1.0]), "at least two"),
        (lambda: C.fit_alpha_beta(4, [1e3, 1e6], [1e-3, 0.0]), "times must be finite and > 0"),
        (lambda: C.fit_alpha_beta(4, [1e6, 1e6], [1e-3, 2e-3]), "not all equal"),
        (lambda: C.time_allreduce_worker([1024], statistic="mean"), "statistic must be one of"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_hand_ring_matches_dist_all_reduce_and_sends_2_n_minus_1_over_n_s():
    numel = 4 * 1000
    run = launch(C.ring_check_worker, numel, world_size=4, quiet=True)
    for r in range(4):
        assert run.results[r]["max_abs_diff"] < 1e-12
        assert run.bytes_sent(r) == C.ring_allreduce_bytes(4, numel * 8)
        assert run.count("send", r) == run.count("recv", r) == 2 * 3


def test_hand_ring_with_uneven_chunks_and_two_ranks():
    run = launch(C.ring_check_worker, 1001, world_size=3, quiet=True)
    assert max(r["max_abs_diff"] for r in run.results) < 1e-12
