"""helpers.intensity (P.3): counted FLOPs/bytes/tasks/span, intensity, roofline, measurements."""
import math

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from helpers import intensity as I


def test_the_sections_matmul_example():
    c = I.matmul(1000, 4096, 4096, dtype_bytes=2)
    assert c.tasks == 4_096_000 and c.span == 4096
    assert c.flops == 2 * 4096 * 4096 * 1000 == 33_554_432_000
    assert c.bytes == (1000 * 4096 + 4096 * 4096 + 1000 * 4096) * 2
    assert I.matmul(1000, 4096, 4096, reduction="tree").span == 13


def test_elementwise():
    c = I.elementwise(10**6)
    assert (c.flops, c.bytes, c.tasks, c.span) == (10**6, 8 * 10**6, 10**6, 1)
    assert c.intensity == 1 / 8
    assert I.elementwise(10, flops_per_element=3, dtype_bytes=2, inputs=2).bytes == 10 * 2 * 3


def test_prefill_and_decode_of_the_7b_model():
    p = I.prefill(7e9, 1000)
    d = I.autoregressive(7e9, 1)
    assert p.bytes == d.bytes == 14e9
    assert p.flops == 1.4e13 and d.flops == 1.4e10
    assert p.intensity == 1000 and d.intensity == 1
    assert (p.span, p.tasks) == (1, 1000)
    chain = I.autoregressive(7e9, 50, batch=8)
    assert (chain.span, chain.tasks) == (50, 8) and chain.intensity == 8
    assert I.autoregressive(7e9, 1, bytes_per_param=4).intensity == 0.5


def test_roofline():
    assert I.ridge(100e9, 50e9) == 2
    assert I.attainable(1, 100e9, 50e9) == 50e9
    assert I.attainable(10, 100e9, 50e9) == 100e9
    assert I.bound_by(1, 100e9, 50e9) == "memory" and I.bound_by(2, 100e9, 50e9) == "compute"


@pytest.mark.parametrize("call, match", [
    (lambda: I.matmul(0, 2, 2), "m must be an integer >= 1"),
    (lambda: I.matmul(2, 2, 2, reduction="fft"), "reduction must be"),
    (lambda: I.elementwise(-5), "n must be an integer >= 1"),
    (lambda: I.prefill(-7e9, 10), "params must be a finite number > 0"),
    (lambda: I.autoregressive(7e9, 0), "passes must be an integer >= 1"),
    (lambda: I.autoregressive(7e9, 3, batch=0), "tokens_per_pass must be an integer >= 1"),
    (lambda: I.ridge(0, 1), "peak_flops must be"),
    (lambda: I.attainable(-1, 1, 1), "intensity must be"),
    (lambda: I.measure_matmul(n=0), "n must be"),
    (lambda: I.measure_matmul(n=8, dtype="int8"), "dtype must be"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_measurements_are_positive_and_the_chain_is_right():
    mm = I.measure_matmul(n=64, repeats=2)
    bw = I.measure_bandwidth(mib=4, repeats=2)
    assert mm["flops_per_s"] > 0 and bw["bytes_per_s"] > 0
    k = I.measure_kernels(d=64, tokens=8, elements=1024, chain_steps=5, repeats=1)
    W, v = k["chain_inputs"]
    for _ in range(5):
        v = np.tanh(W @ v)
    assert np.allclose(k["chain_result"], v, rtol=1e-4, atol=1e-5)
    assert k["matmul"]["cost"].flops == 2 * 8 * 64 * 64
    assert k["token loop"]["cost"].span == 5 and k["token loop"]["cost"].tasks == 1
    assert math.isclose(k["token loop"]["cost"].intensity, 5 * (2 * 64 * 64 + 64) / (5 * (64 * 64 + 128) * 4))


def test_roofline_plot_draws():
    ax = I.roofline_plot(1e11, 4e10, points={"mm": (100, 8e10)}, marks={"decode": 1})
    assert ax.get_xscale() == "log" and len(ax.lines) >= 3


def test_matmul_rows_and_chain_on_ranks():
    from helpers.launcher import launch

    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(6, 5)), rng.normal(size=(5, 3))
    run = launch(I.matmul_rows_worker, A, B, world_size=2, quiet=True)
    for C in run.results:
        assert np.allclose(C, A @ B, rtol=1e-12)
    assert run.count("all_gather") == 1 and run.comm_summary(0)["all_gather"]["bytes"] == 6 * 3 * 8

    W, x = rng.normal(size=(8, 8)) / 3, rng.normal(size=8)
    chain = launch(I.chain_worker, W, x, 3, world_size=2, quiet=True)
    v = x
    for _ in range(6):
        v = np.tanh(W @ v)
    assert chain.results[0] is None and np.allclose(chain.results[1], v, rtol=1e-12)
    assert chain.count("send", 0) == 1 and chain.count("recv", 1) == 1
