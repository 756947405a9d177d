"""A real pipeline on 4 gloo ranks (P.9, 12.2.2): gradients, measured timelines, in-flight counts,
and torch.distributed.pipelining on the same model."""
import pytest
import torch

from helpers import pipeline_parallel as ppl
from helpers import pipeline_schedule as ps
from helpers.launcher import launch

P = 4


@pytest.fixture(scope="module")
def reference():
    return ppl.reference_grads()


def test_split_backward_equals_autograd():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3, dtype=torch.float64)
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    g = torch.randn(7, 3, dtype=torch.float64)
    lin(x).backward(g)
    dx, dW, db = ppl.split_backward_linear(x.detach(), lin.weight.detach(), lin.bias.detach(), g)
    assert torch.allclose(dx, x.grad) and torch.allclose(dW, lin.weight.grad) and torch.allclose(db, lin.bias.grad)
    with pytest.raises(ValueError, match="shapes do not fit"):
        ppl.split_backward_linear(x.detach(), lin.weight.detach().T, lin.bias.detach(), g)


def test_model_pieces():
    assert [list(r) for r in ppl.layer_ranges(8, 4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert len(ppl.layer_ranges(8, 2, 2)) == 4
    with pytest.raises(ValueError, match="must divide the 8 layers"):
        ppl.layer_ranges(8, 3)
    with pytest.raises(ValueError, match="n_layers must be an integer >= 1"):
        ppl.make_layers(0)
    grads, loss = ppl.reference_grads()
    assert sorted(grads) == list(range(8)) and grads[7][0].shape == (1, 16) and loss > 0


@pytest.mark.parametrize("schedule,m,v", [("gpipe", 8, 1), ("1f1b", 8, 1), ("zb-h1", 8, 1), ("interleaved", 8, 2)])
def test_pipeline_on_ranks(schedule, m, v, reference):
    ref, ref_loss = reference
    run = launch(ppl.pipeline_step_worker, schedule, m, v, world_size=P, quiet=True, f_s=0.002, b_s=0.002, w_s=0.002)
    grads = ppl.gather_grads(run.results)
    assert sorted(grads) == list(range(8))
    assert ppl.max_grad_diff(grads, ref) < 1e-12
    last = (P * v - 1) % P
    assert run.results[last]["loss"] == pytest.approx(ref_loss, rel=1e-12)
    # the measured timeline respects every dependency: the sends and receives really happened
    tl = ppl.timeline_from_run(run, schedule, m, v)
    end = {(o.kind, o.device, o.chunk, o.mb): o.end for o in tl.ops}
    for o in tl.ops:
        for n in ps.dependencies(o.kind, o.device, o.chunk, o.mb, P, v):
            assert o.start >= end[n] - 1e-6
    # live activations counted on the ranks: the closed form, and the simulator's peaks (which
    # come from the same per-device orders, so they alone would not catch a wrong warm-up)
    closed_form = {"gpipe": [m] * P, "1f1b": [P - d for d in range(P)], "zb-h1": [P] * P,
                   "interleaved": [2 * (P - d - 1) + (v - 1) * P + 1 for d in range(P)]}[schedule]  # chunk-micro-batches
    sim = ps.simulate(schedule, P, m, v=v)
    assert [r["peak_live"] for r in run.results] == closed_form == [sim.peak_in_flight(d) * v for d in range(P)]
    assert all(r["peak_bytes"] > 0 for r in run.results)
    st = ppl.stage_times(tl)
    assert all(x > 0 for x in st["f"] + st["b"]) and (any(st["w"]) == (schedule == "zb-h1"))


def test_gpipe_holds_more_than_1f1b():
    a = launch(ppl.pipeline_step_worker, "gpipe", 16, world_size=P, quiet=True)
    b = launch(ppl.pipeline_step_worker, "1f1b", 16, world_size=P, quiet=True)
    assert [r["peak_live"] for r in a.results] == [16] * P
    assert [r["peak_live"] for r in b.results] == [4, 3, 2, 1]
    assert a.results[0]["peak_bytes"] == 4 * b.results[0]["peak_bytes"]


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
def test_torch_pipelining_equals_reference(schedule, reference):
    ref, ref_loss = reference
    run = launch(ppl.torch_pipelining_worker, schedule, 8, world_size=P, quiet=True)
    grads = ppl.gather_grads(run.results)
    assert sorted(grads) == list(range(8))
    assert ppl.max_grad_diff(grads, ref) < 1e-12
    losses = [r["loss"] for r in run.results if r["loss"] is not None]
    assert losses == [pytest.approx(ref_loss, rel=1e-12)]


def test_torch_pipelining_rejects_unknown_schedule():
    with pytest.raises(ValueError, match="schedule must be one of"):
        ppl.torch_pipelining_worker("DualPipe")
