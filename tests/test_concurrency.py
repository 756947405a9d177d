"""helpers.concurrency (P.2): overlapped waits, threads vs processes, measurement helpers."""
import asyncio
import hashlib

import pytest

from helpers import concurrency as C


def test_gathered_calls_overlap_on_one_thread():
    out = C.run_coro(C.run_calls({"policy": 0.12, "order": 0.2}))
    (a0, a1), (b0, b1) = out["calls"]["policy"], out["calls"]["order"]
    assert a0 < b1 and b0 < a1  # both in flight at once
    assert out["total"] >= 0.199  # asyncio.sleep does not return early (to clock resolution)
    assert len(out["threads"]) == 1


def test_sequential_calls_do_not_overlap():
    out = C.run_coro(C.run_calls([0.03, 0.05], concurrent=False))
    (_, a1), (b0, _) = out["calls"]["call0"], out["calls"]["call1"]
    assert b0 >= a1
    assert out["total"] >= 0.079


def test_a_limit_caps_calls_in_flight():
    out = C.run_coro(C.run_calls([0.02] * 6, limit=2))
    events = sorted([(s, 1) for s, _ in out["calls"].values()] + [(e, -1) for _, e in out["calls"].values()],
                    key=lambda x: (x[0], x[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak == 2


def test_section_stand_ins_return_their_payloads():
    async def main():
        return await asyncio.gather(C.retrieve_policy(0.001), C.lookup_order(0.001))

    docs, order = C.run_coro(main())
    assert docs == ["POL-EU-009#c0002"] and order["status"] == "shipped"


def test_model_of_calls():
    assert C.model_calls([0.12, 0.2]) == 0.2
    assert C.model_calls([0.12, 0.2], concurrent=False) == pytest.approx(0.32)
    assert C.model_calls([0.1] * 6, limit=2) == pytest.approx(0.3)
    assert C.model_calls([0.1] * 5, limit=2) == pytest.approx(0.3)
    assert C.model_calls({"a": 0.12, "b": 0.2, "c": 0.05}, edges=[("a", "c"), ("b", "c")]) == pytest.approx(0.25)


def test_run_coro_inside_a_running_loop():
    async def outer():
        coro = asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="running event loop"):
            asyncio.run(coro)  # what the book's asyncio.run(main()) does inside Jupyter
        coro.close()
        return C.run_coro(C.run_calls([0.01]))["total"]

    assert asyncio.run(outer()) >= 0.009


@pytest.mark.parametrize("n", [0, 1, 6, 7, 8, 100, 12345])
def test_count_mod7_matches_its_closed_form(n):
    assert C.count_mod7(n) == C.count_mod7_exact(n)


def test_count_mod7_range_slices_add_up():
    assert C.count_mod7_range(0, 1000) == C.count_mod7_range(0, 333) + C.count_mod7_range(333, 1000)
    with pytest.raises(ValueError, match="need start <= stop"):
        C.count_mod7_range(5, 2)


def test_sha_rounds_is_the_hash_of_the_repeated_buffer():
    assert C.sha_rounds(3, mib=1) == hashlib.sha256(bytes(1 << 20) * 3).hexdigest()


def test_run_on_gives_the_same_results_on_every_executor():
    args = [2000, 3001, 4002]
    expect = [C.count_mod7_exact(a) for a in args]
    pool, startup = C.start_processes(2)
    try:
        for kind in C.KINDS:
            t, out = C.run_on(kind, C.count_mod7, args, 2, pool=pool)
            assert out == expect and t > 0
    finally:
        pool.shutdown()
    assert startup > 0


def test_measure_and_calibrate():
    t = C.measure(C.count_mod7, 1000, repeats=4, warmup=0)
    assert len(t.samples) == 4 and t.spread >= 0 and min(t.samples) <= t.median <= max(t.samples)
    assert "ms" in str(t)
    assert C.calibrate(C.count_mod7, 0.01) >= 1


def test_loop_and_batch_agree():
    out = C.loop_vs_batch(64, 32, repeats=3)
    assert out["max_abs_diff"] < 1e-10
    assert len(out["loop"].samples) == len(out["batch"].samples) == 3
    with pytest.raises(ValueError, match="repeats must be"):
        C.loop_vs_batch(4, 4, repeats=0)


@pytest.mark.parametrize("call, match", [
    (lambda: C.model_calls([]), "at least one call"),
    (lambda: C.model_calls([0.1, -0.2]), r"the delay \(seconds\) of call 'call1' must be a finite number >= 0"),
    (lambda: C.model_calls([0.1], limit=0), r"limit \(None for no limit\) must be an integer >= 1"),
    (lambda: C.run_on("fibers", C.count_mod7, [1]), "kind must be one of"),
    (lambda: C.run_on("threads", C.count_mod7, [1], workers=0), "workers must be an integer >= 1"),
    (lambda: C.count_mod7(-1), "n must be an integer >= 0"),
    (lambda: C.sha_rounds(-1), "rounds must be"),
    (lambda: C.measure(print, repeats=0), "repeats must be"),
    (lambda: C.calibrate(C.count_mod7, 0), "target_s must be a finite number > 0"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_bad_input_to_run_calls():
    with pytest.raises(ValueError, match=r"limit \(None for no limit\) must be an integer >= 1"):
        C.run_coro(C.run_calls([0.1], limit=1.5))
