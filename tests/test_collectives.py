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


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: C.ring_allreduce_steps(np.ones((4, 6))), "4 devices do not divide a message of 6"),
        (lambda: C.ring_allreduce_steps(np.ones((1, 4))), "at least 2 devices"),
        (lambda: C.ring_allreduce_bytes(0, 10), "group size N must be an integer >= 1"),
        (lambda: C.ring_allreduce_bytes(4, -1), "payload_bytes must be a finite number >= 0"),
        (lambda: C.alpha_beta_time(4, 1.0, alpha=1e-6, beta=0), r"beta \(bytes/s per link\) must be a finite number > 0"),
        (lambda: C.fit_alpha_beta(4, [1.0], [1.0]), "at least two"),
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
