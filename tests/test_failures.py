"""P.14 failure lab: straggler arithmetic, uneven micro-batches, crashes and hangs end in bounded
time naming the rank, DCP checkpoints resume bitwise, Young's interval, reduction order."""
import math
import time

import numpy as np
import pytest

from helpers import failures as F
from helpers import launcher
from helpers.launcher import LaunchTimeout, RankError, launch

# ---- 1. stragglers -------------------------------------------------------------------------------

def test_the_sections_straggler_arithmetic():
    s = F.straggler_arithmetic([100, 100, 100, 150], 20)
    assert (s["step"], s["nominal_step"], s["idle"], s["worker_time"]) == (170, 120, 150, 680)
    assert s["efficiency"] == pytest.approx(120 / 170) and round(s["efficiency"], 2) == 0.71
    assert s["idle_fraction"] == pytest.approx(150 / 680) and round(100 * s["idle_fraction"]) == 22
    assert (s["mean_compute"], s["slowest"]) == (112.5, 150)
    # the 29 % efficiency loss = 22 % waiting + the slow rank's extra 50 ms of (slow) work
    assert s["lost_fraction"] == pytest.approx(1 - s["efficiency"])


def test_no_straggler_means_full_efficiency_and_no_idle():
    s = F.straggler_arithmetic([50, 50, 50], 5)
    assert s["efficiency"] == 1.0 and s["idle"] == 0


@pytest.mark.parametrize("args, match", [
    (([], 20), "at least one worker"),
    (([100, -1], 20), "finite and >= 0"),
    (([100, 100], -5), "allreduce must be a finite number >= 0"),
    (([0, 0], 0), "must take some time"),
])
def test_straggler_arithmetic_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        F.straggler_arithmetic(*args)


def test_measured_straggler_reproduces_the_arithmetic():
    run = launch(F.straggler_worker, steps=3, base_s=0.1, slow_rank=3, slow_factor=1.5, jitter=0.0,
                 allreduce_elems=1024, world_size=4, quiet=True)
    m = F.straggler_from_measurement(run.results)
    comp = m["mean_compute_per_rank"]
    assert max(comp) == comp[3] and comp[3] >= 0.15  # sleep never returns early
    # no rank leaves the all-reduce before the slowest rank has entered it (one host, one clock);
    # per-rank step durations carry no such bound: ranks leave a collective a few ms apart
    assert len(m["release_after_last_arrival"]) == 3 and min(m["release_after_last_arrival"]) >= 0
    # idle from the waits inside the all-reduce matches idle from the model fed the same numbers
    assert m["measured_idle_fraction"] == pytest.approx(m["model"]["idle_fraction"], abs=0.05)


def test_release_after_last_arrival_is_computed_from_the_shared_clock():
    def rank(compute, arrive, leave):
        return {"compute": compute, "allreduce": [l - a for a, l in zip(arrive, leave)],
                "step": [c + l - a for c, a, l in zip(compute, arrive, leave)], "arrive": compute,
                "arrive_clock": arrive, "leave_clock": leave}
    results = [rank([0.1, 0.1], [10.1, 20.1], [10.3, 20.25]), rank([0.15, 0.1], [10.15, 20.2], [10.2, 20.3])]
    m = F.straggler_from_measurement(results)
    assert m["release_after_last_arrival"] == pytest.approx([10.2 - 10.15, 20.25 - 20.2])
    no_clock = [{k: v for k, v in r.items() if not k.endswith("_clock")} for r in results]
    assert F.straggler_from_measurement(no_clock)["release_after_last_arrival"] is None


# ---- 2. uneven micro-batches ------------------------------------------------------------------------

LENGTHS = [5, 40, 7, 120, 33, 9, 64, 16]


def test_plain_average_is_wrong_and_token_weighting_is_exact_in_numpy():
    X, y, seq, w = F.make_token_batch(LENGTHS)
    full = F.token_grad_numpy(X, y, w)
    plain, weighted = F.plain_and_weighted(X, y, seq, w, F.sequences_per_rank(8, 4))
    assert np.allclose(weighted, full, rtol=1e-12, atol=1e-14)
    assert np.linalg.norm(plain - full) / np.linalg.norm(full) > 0.01
    # equal token counts per rank: the plain average is exact again
    X2, y2, seq2, w2 = F.make_token_batch([10] * 8)
    p2, _ = F.plain_and_weighted(X2, y2, seq2, w2, F.sequences_per_rank(8, 4))
    assert np.allclose(p2, F.token_grad_numpy(X2, y2, w2), rtol=1e-12)


def test_uneven_tokens_on_ranks_match_numpy():
    X, y, seq, w = F.make_token_batch(LENGTHS)
    asg = F.sequences_per_rank(8, 4)
    plain, weighted = F.plain_and_weighted(X, y, seq, w, asg)
    a = launch(F.uneven_tokens_worker, X, y, seq, w, asg, False, world_size=4, quiet=True)
    b = launch(F.uneven_tokens_worker, X, y, seq, w, asg, True, world_size=4, quiet=True)
    assert [r["tokens"] for r in a.results] == [45, 127, 42, 80]
    for r in range(4):
        assert np.allclose(a.results[r]["grad"], plain, rtol=1e-12, atol=1e-14)
        assert np.allclose(b.results[r]["grad"], F.token_grad_numpy(X, y, w), rtol=1e-12, atol=1e-14)


def test_balancing_by_tokens():
    lengths = [64, 8, 8, 8, 32, 32, 16, 16]
    asg = F.balance_by_tokens(lengths, 4)
    assert sorted(i for s in asg for i in s) == list(range(8))
    assert F.token_imbalance(lengths, asg)["tokens"] == [64, 40, 40, 40]  # the 64 sets the floor
    assert F.token_imbalance(lengths, F.sequences_per_rank(8, 4))["tokens"] == [72, 16, 64, 32]
    assert F.token_imbalance(lengths, asg)["efficiency"] > F.token_imbalance(lengths, F.sequences_per_rank(8, 4))["efficiency"]
    with pytest.raises(ValueError, match="at least as many sequences"):
        F.balance_by_tokens([3], 2)
    with pytest.raises(ValueError, match="must divide the 7 sequences"):
        F.sequences_per_rank(7, 2)


# ---- 3. crashes and hangs: bounded, named, nothing left running ----------------------------------

def test_a_raising_rank_is_named_with_its_traceback():
    with pytest.raises(RankError) as info:
        launch(F.crash_worker, fail_rank=2, fail_step=1, world_size=4, timeout=10, quiet=True)
    assert info.value.rank == 2 and "simulated device failure at step 1" in str(info.value)
    assert F.root_causes(info.value) == [2]
    assert launcher.live_worker_pids() == []


def test_a_dead_process_is_found_among_the_failures():
    with pytest.raises(RankError) as info:
        launch(F.crash_worker, fail_rank=1, fail_step=1, hard=True, world_size=4, timeout=10, quiet=True)
    kinds = F.classify_failure(info.value)
    assert kinds[1] == "died" and F.root_causes(info.value) == [1]
    assert launcher.live_worker_pids() == []


def test_mismatched_collectives_hang_until_the_timeout(warm_workers):
    warm_workers(4)  # the bound is on the hang, not on a pool start after the previous failure
    t0 = time.monotonic()
    with pytest.raises((RankError, LaunchTimeout)) as info:
        launch(F.mismatched_collectives_worker, 3, world_size=4, timeout=1.5, quiet=True)
    elapsed = time.monotonic() - t0
    assert 1.4 < elapsed < 1.5 + launcher._GRACE + 5, elapsed
    assert "timed out" in str(info.value).lower() or isinstance(info.value, LaunchTimeout) or \
        "timed out" in " ".join(info.value.others.values()).lower()
    assert launcher.live_worker_pids() == []


def test_monitored_barrier_names_the_rank_that_did_not_arrive():
    with pytest.raises(RankError) as info:
        launch(F.monitored_barrier_worker, 1, 1.0, world_size=4, timeout=5, quiet=True)
    assert "Rank 1 failed to pass monitoredBarrier" in str(info.value)
    assert F.classify_failure(info.value)[0] == "names a culprit"
    assert launcher.live_worker_pids() == []


def test_classify_failure_rejects_other_exceptions():
    with pytest.raises(ValueError, match="takes a RankError"):
        F.classify_failure(RuntimeError("x"))


# ---- 4. checkpoint and resume ---------------------------------------------------------------------

def test_dcp_resume_is_bitwise_on_the_same_world_size_and_close_on_another(tmp_path):
    d = str(tmp_path / "ckpt")
    ref = launch(F.checkpoint_train_worker, None, 6, world_size=4, quiet=True).results[0]
    first = launch(F.checkpoint_train_worker, d, 6, save_at=3, world_size=4, quiet=True).results[0]
    assert first["stopped_after"] == 3 and first["losses"] == ref["losses"][:3]
    same = launch(F.checkpoint_train_worker, d, 6, resume=True, world_size=4, quiet=True).results[0]
    assert same["losses"] == ref["losses"][3:]
    assert F.bitwise_equal(same["params"], ref["params"])
    two = launch(F.checkpoint_train_worker, d, 6, resume=True, world_size=2, quiet=True).results
    assert sum(r["local_params"] for r in two) == sum(p.numel() for p in ref["params"].values())  # resharded
    assert F.max_param_diff(two[0]["params"], ref["params"]) < 1e-12
    assert np.allclose(two[0]["losses"], ref["losses"][3:], rtol=1e-12)


def test_a_model_only_checkpoint_does_not_resume_the_same_run(tmp_path):
    d = str(tmp_path / "model_only")
    ref = launch(F.checkpoint_train_worker, None, 5, world_size=2, quiet=True).results[0]
    launch(F.checkpoint_train_worker, d, 5, save_at=2, with_optimizer=False, world_size=2, quiet=True)
    res = launch(F.checkpoint_train_worker, d, 5, resume=True, with_optimizer=False, world_size=2, quiet=True).results[0]
    assert F.max_param_diff(res["params"], ref["params"]) > 1e-4  # Adam's moments restarted from zero


# ---- 5. MTBF and the checkpoint interval ------------------------------------------------------------

def test_the_sections_mtbf_and_young_numbers():
    M = F.cluster_mtbf(50_000 * 3600, 1024)
    assert M / 3600 == pytest.approx(48.828125) and round(M) == 175_781
    tau = F.young_interval(300, M)
    assert round(tau) == 10_270 and tau / 3600 == pytest.approx(2.8527, abs=1e-4)
    with pytest.raises(ValueError, match="devices must be an integer >= 1"):
        F.cluster_mtbf(50_000, 0)
    with pytest.raises(ValueError, match="ckpt_cost must be a finite number > 0"):
        F.young_interval(-1, M)


def test_young_minimises_the_first_order_overhead():
    C, M = 300.0, 175_781.25
    y = F.young_interval(C, M)
    assert F.first_order_overhead(y, C, M) < min(F.first_order_overhead(y * f, C, M) for f in (0.8, 1.25))
    assert F.first_order_overhead(y, C, M) == pytest.approx(math.sqrt(2 * C / M))
    # the exact optimum is close to Young's value when C << M
    assert abs(F.optimal_interval(1e6, C, M) / y - 1) < 0.03


def test_simulation_agrees_with_the_exact_expectation_and_finds_the_optimum_near_young():
    C, M, R, W = 300.0, 175_781.25, 600.0, 14 * 86400.0
    taus = np.geomspace(2000, 50_000, 15)
    sims = [F.simulate_checkpointing(W, t, C, M, R, runs=600, seed=1) for t in taus]
    for t, s in zip(taus, sims):
        exact = F.expected_wall_time(W, t, C, M, R)
        assert abs(s["wall"].mean() - exact) < 5 * s["wall"].std() / math.sqrt(600) + 1e-9
        assert np.allclose(s["wall"], s["work"] + s["checkpointing"] + s["lost"] + s["restarts"])
    best = taus[int(np.argmin([s["wall"].mean() for s in sims]))]
    assert 0.6 < best / F.young_interval(C, M) < 1.6


def test_no_failures_means_no_lost_work():
    s = F.simulate_checkpointing(1000, 100, 10, 1e15, runs=10)
    assert np.all(s["failures"] == 0) and np.allclose(s["wall"], 1000 + 10 * 10)
    assert F.expected_wall_time(1000, 100, 10, 1e15) == pytest.approx(1100, rel=1e-9)


# ---- 6. reproducibility -------------------------------------------------------------------------------

def test_order_changes_last_bits_and_bits_differ_counts_ulps():
    P = F.micro_shard_partials()
    a, b = F.sum_in_order(P), F.sum_in_order(P, order=list(range(7, -1, -1)))
    d = F.bits_differ(a, b)
    assert d["differ"] > 0 and 0 < d["max_ulps"] < 10_000
    assert np.allclose(a, b, rtol=1e-4, atol=1e-3)
    one = np.float32(1.0)
    assert F.bits_differ([one], [np.nextafter(one, np.float32(2))])["max_ulps"] == 1
    assert F.bits_differ([-one], [np.nextafter(-one, np.float32(0))])["max_ulps"] == 1
    with pytest.raises(ValueError, match="permutation"):
        F.sum_in_order(P, order=[0, 0, 1, 2, 3, 4, 5, 6])


def test_fixed_order_reduction_is_bitwise_identical_across_world_sizes():
    P = F.micro_shard_partials()
    ref = F.sum_in_order(P)
    for ws in (2, 4):
        run = launch(F.fixed_order_worker, P, world_size=ws, quiet=True)
        assert all(np.array_equal(r, ref) for r in run.results)
    usual2 = launch(F.allreduce_worker, P, world_size=2, quiet=True).results[0]
    usual4 = launch(F.allreduce_worker, P, world_size=4, quiet=True).results[0]
    assert F.bits_differ(usual2, usual4)["differ"] > 0
    with pytest.raises(RankError, match="must divide the 8 micro-shards"):
        launch(F.fixed_order_worker, P, world_size=3, quiet=True)
