"""12.1.2: ZeRO stages by hand equal DDP, hold what the calculator says, send what the model says."""
import numpy as np
import pytest
import torch

from helpers import memory as M
from helpers import zero as Z
from helpers.collectives import all_gather, reduce_scatter, ring_allreduce
from helpers.launcher import launch

N = Z.n_params()  # 1476, every layer divisible by 4


# ---- numpy ------------------------------------------------------------------------------------

def test_adamw_numpy_is_torchs_adamw():
    rng = np.random.default_rng(0)
    p0, grads = rng.normal(size=20), rng.normal(size=(3, 20))
    t = torch.tensor(p0, requires_grad=True)
    opt = torch.optim.AdamW([t], **Z.ADAMW)
    p, m, v = p0.copy(), np.zeros(20), np.zeros(20)
    for k, g in enumerate(grads, start=1):
        t.grad = torch.tensor(g)
        opt.step()
        p, m, v = Z.adamw_numpy(p, g, m, v, k, **Z.ADAMW)
    assert np.allclose(p, t.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_adamw_on_a_chunk_is_the_full_update_there_bit_for_bit():
    rng = np.random.default_rng(1)
    p, g, m, v = rng.normal(size=(4, 12))
    v = v * v
    full = Z.adamw_numpy(p, g, m, v, 3)
    part = Z.adamw_numpy(p[4:8], g[4:8], m[4:8], v[4:8], 3)
    assert all(np.array_equal(f[4:8], c) for f, c in zip(full, part))


def test_identity_in_numpy_and_zero1_equals_ddp():
    B = np.arange(32, dtype=float).reshape(4, 8) ** 2
    assert np.array_equal(all_gather(reduce_scatter(B)), ring_allreduce(B))
    rng = np.random.default_rng(2)
    Xs, ys, w0 = [rng.normal(size=(6, 8)) for _ in range(4)], [rng.normal(size=6) for _ in range(4)], rng.normal(size=8)
    w, moments = Z.zero1_numpy(w0, Xs, ys, steps=4)
    assert np.allclose(w, Z.ddp_numpy(w0, Xs, ys, steps=4), rtol=1e-12, atol=1e-14)
    assert moments == [4, 4, 4, 4]  # 2 moments x 8 parameters / 4 devices
    with pytest.raises(ValueError, match="do not divide 8 parameters"):
        Z.zero1_numpy(w0, Xs[:3], ys[:3], steps=1)


# ---- models of communication and the sharding units ---------------------------------------------

def test_comm_model_two_and_three_theta():
    units = [Z.comm_bytes_per_rank(7.5e9, 64, s)["units"] for s in range(4)]
    assert units == [2, 2, 2, 3]
    s3 = Z.comm_bytes_per_rank(7.5e9, 64, 3)
    assert s3["all_gather"] == pytest.approx(2 * 63 / 64 * 15e9) and s3["reduce_scatter"] == pytest.approx(63 / 64 * 15e9)
    assert Z.comm_bytes_per_rank(10, 1, 3)["total"] == 0
    assert Z.collectives_per_step(2, 3, micro_batches=4) == {"all_reduce": 0, "reduce_scatter": 12, "all_gather": 1}
    assert Z.collectives_per_step(2, 3, micro_batches=4, defer=True)["reduce_scatter"] == 3
    assert Z.collectives_per_step(3, 3, micro_batches=2) == {"all_reduce": 0, "reduce_scatter": 6, "all_gather": 12}


def test_unit_pads_and_assemble_rebuilds():
    shapes = [(3, 3), (3,)]  # 12 elements -> padded to 15 on 5 ranks
    units = [Z.Unit(shapes, 5, r) for r in range(5)]
    assert (units[0].padded, units[0].chunk, units[4].lo) == (15, 3, 12)
    W, b = torch.arange(9.0).view(3, 3), torch.tensor([9.0, 10, 11])
    flat = units[0].flatten([W, b])
    assert flat.tolist() == list(range(12)) + [0, 0, 0]
    results = [{"shapes": [shapes], "shards": [flat[u.lo : u.hi]]} for u in units]
    W2, b2 = Z.assemble(results)
    assert torch.equal(W2, W) and torch.equal(b2, b)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: Z.comm_bytes_per_rank(1e9, 0, 1), "world_size must be an integer >= 1"),
        (lambda: Z.comm_bytes_per_rank(1e9, 8, 4), "zero_stage must be 0, 1, 2 or 3"),
        (lambda: Z.collectives_per_step(2, 0), "n_layers must be an integer >= 1"),
        (lambda: Z.Unit([(2, 2)], 4, 4), r"rank must be an integer in \[0, 4\)"),
        (lambda: Z.HandZero(4), "zero_stage must be 0, 1, 2 or 3"),
        (lambda: Z.HandZero(1, precision="fp16"), "precision must be one of"),
        (lambda: Z.ddp_reference_worker(precision="bf16-mixed"), r"precision must be one of \('fp32', 'fp64'\)"),
        (lambda: Z.zero_train_worker(1, micro_batches=0), "micro_batches must be an integer >= 1"),
        (lambda: Z.zero_train_worker(3, micro_batches=2, defer_reduce=True), "defer_reduce applies to stage 2 only"),
        (lambda: Z.comm_bytes_per_rank(-1, 4, 1), "n_params must be a finite number > 0"),
        (lambda: Z.make_mlp((8,)), "at least two positive layer widths"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---- on the ranks -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ddp():
    return launch(Z.ddp_reference_worker, world_size=4, quiet=True)


@pytest.fixture(scope="module")
def ddp64():
    return launch(Z.ddp_reference_worker, precision="fp64", world_size=4, quiet=True)


def assert_equals_ddp_in_fp64(run, ref):
    """The averaged gradients of the last step, and the parameters after it, equal DDP's to 1e-12.

    The gradients are what pins the reduction down: AdamW divides by the root of the second
    moment, so parameters after AdamW hardly move under a gradient off by a constant factor."""
    grads = Z.assemble(run.results, "grad_shards")
    assert [g.dtype for g in grads] == [torch.float64] * len(grads)
    assert Z.max_abs_diff(grads, ref.results[0]["grads"]) < 1e-12
    assert Z.max_abs_diff(Z.assemble(run.results), ref.results[0]["params"]) < 1e-12


def test_identity_on_the_ranks_and_its_bytes():
    run = launch(Z.identity_worker, 1024, world_size=4, quiet=True)
    assert all(res["equal"] for res in run.results)
    s = run.comm_summary(0)
    assert s["all_reduce"]["model_sent"] == s["reduce_scatter"]["model_sent"] + s["all_gather"]["model_sent"] == 2 * 3 / 4 * 4096


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_stage_equals_ddp_holds_and_sends_what_the_models_say(ddp, ddp64, stage):
    assert_equals_ddp_in_fp64(launch(Z.zero_train_worker, stage, precision="fp64", world_size=4, quiet=True), ddp64)
    run = launch(Z.zero_train_worker, stage, world_size=4, quiet=True)
    assert Z.max_abs_diff(Z.assemble(run.results), ddp.results[0]["params"]) < 1e-6
    model = M.per_device_bytes(N, 4, stage, precision="fp32")
    for res in run.results:
        assert {k: res["held"][k] for k in model} == model
    want = Z.comm_bytes_per_rank(N, 4, stage, bytes_per_element=4)
    calls = Z.collectives_per_step(stage, n_layers=3)
    for r in range(4):
        got = Z.per_step_comm(run, r)
        assert {op: row["calls"] for op, row in got.items()} == {op: c for op, c in calls.items() if c}
        # both sides use helpers.costs: pin them to the chapter's 2 or 3 units of (M-1)/M x 4N bytes too
        assert sum(row["model_sent"] for row in got.values()) == pytest.approx(want["total"]) == (3 if stage == 3 else 2) * 3 / 4 * 4 * N


def test_bf16_mixed_ranks_hold_the_chapters_bytes_and_stage_2_peaks_above_theta_over_m():
    for stage in (1, 3):
        run = launch(Z.zero_train_worker, stage, precision="bf16-mixed", world_size=4, quiet=True)
        model = M.per_device_bytes(N, 4, stage, precision="bf16-mixed")
        assert all({k: res["held"][k] for k in model} == model for res in run.results)
    peak = launch(Z.zero_train_worker, 2, world_size=4, quiet=True).results[0]["peak_grad_bytes"]
    assert peak == 4 * (N // 4 + 32 * 32 + 32)  # the chunk of all layers + the largest layer, full size


def test_padding_and_three_ranks_still_equal_ddp():
    sizes = (5, 7, 3)  # layers of 42 and 24 parameters: padded on 4 ranks
    ref = launch(Z.ddp_reference_worker, batch=12, sizes=sizes, precision="fp64", world_size=4, quiet=True)
    for stage in (2, 3):
        run = launch(Z.zero_train_worker, stage, batch=12, sizes=sizes, precision="fp64", world_size=4, quiet=True)
        assert run.results[0]["padded"] == 44 + 24
        assert_equals_ddp_in_fp64(run, ref)
    ref3 = launch(Z.ddp_reference_worker, batch=12, precision="fp64", world_size=3, quiet=True)
    for stage in (1, 3):
        assert_equals_ddp_in_fp64(launch(Z.zero_train_worker, stage, batch=12, precision="fp64", world_size=3, quiet=True), ref3)


def test_accumulation_deferred_reduction_same_result_fewer_collectives():
    ref = launch(Z.ddp_reference_worker, micro_batches=3, precision="fp64", world_size=4, quiet=True)
    runs = {d: launch(Z.zero_train_worker, 2, micro_batches=3, defer_reduce=d, precision="fp64", world_size=4, quiet=True)
            for d in (False, True)}
    for d, run in runs.items():
        assert_equals_ddp_in_fp64(run, ref)
        assert Z.per_step_comm(run)["reduce_scatter"]["calls"] == Z.collectives_per_step(2, 3, 3, defer=d)["reduce_scatter"]
    assert runs[True].results[0]["peak_grad_bytes"] > 8 * N > runs[False].results[0]["peak_grad_bytes"]


def test_pytorch_zero_redundancy_optimizer_and_fsdp2_equal_the_hand_stages(ddp):
    zro = launch(Z.zero_redundancy_worker, world_size=4, quiet=True)
    assert Z.max_abs_diff(zro.results[0]["params"], ddp.results[0]["params"]) < 1e-6
    assert sum(res["owned_params"] for res in zro.results) == N
    fsdp = launch(Z.fsdp2_worker, world_size=4, quiet=True)
    hand = launch(Z.zero_train_worker, 3, world_size=4, quiet=True)
    assert Z.max_abs_diff(Z.assemble_dim0(fsdp.results), Z.assemble(hand.results)) < 1e-6
    assert fsdp.results[0]["held"] == {"weights": 4 * N // 4, "gradients": 4 * N // 4, "moments": 8 * N // 4}
    assert Z.per_step_comm(fsdp) == Z.per_step_comm(hand)
