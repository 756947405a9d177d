"""Exercise checks for 12.2.2 (pipeline parallelism and bubble reduction)."""
import numpy as np

from ...pipeline_parallel import gather_grads, max_grad_diff, reference_grads
from ...pipeline_schedule import bubble_formula, simulate
from . import check_int, check_number, check_pipeline_order, check_run, check_true, exercise, reject, require


@exercise
def ex1(answer):
    """Utilisation of a 16-stage pipeline with 48 micro-batches (equal stages)."""
    check_number(answer, 1 - float(bubble_formula(16, 48, definition="total")),
                 what="the utilisation (busy time over total time) for p = 16, m = 48",
                 hint="12.2.2's (p-1)/m is idle over useful time; utilisation is useful over useful + idle.")


@exercise
def ex2(answer):
    """Idle time per device of ZB-H1 with p = 6, m = 12, F = 2, B = 2, W = 1, read off the simulator."""
    tl = simulate("zb-h1", 6, 12, f=2, b=2, w=1)
    check_int(answer, int(tl.idle(0)), what="the idle time per device (in the same time units) of ZB-H1",
              hint="Simulate it and read idle(d) off the timeline, or count what the W passes cannot fill.")


@exercise
def ex3(weight_grad_fn):
    """A function W(x, dy) returning the weight gradient of y = x @ W.T (no bias), checked on random data."""
    require(weight_grad_fn, "a function taking (x, dy) numpy arrays and returning dW")
    rng = np.random.default_rng(7)
    ok = True
    for n, i, o in [(5, 3, 2), (8, 4, 6), (1, 7, 3)]:
        x, W, dy = rng.normal(size=(n, i)), rng.normal(size=(o, i)), rng.normal(size=(n, o))
        # reference: derivative of sum(dy * (x @ W.T)) with respect to W, by finite differences
        eps, ref = 1e-6, np.zeros_like(W)
        for a in range(o):
            for b in range(i):
                E = np.zeros_like(W)
                E[a, b] = eps
                ref[a, b] = (np.sum(dy * (x @ (W + E).T)) - np.sum(dy * (x @ (W - E).T))) / (2 * eps)
        got = np.asarray(weight_grad_fn(x, dy))
        ok = ok and got.shape == W.shape and np.allclose(got, ref, atol=1e-6)
    check_true(ok, what="your W step gives the weight gradient from the saved input and the output gradient",
               hint="The result has the weight's shape (out, in); it is a product of dy and x, one of them transposed.")


@exercise
def ex4(run):
    """The hand ZB-H1 schedule (pipeline_step_worker) on 4 ranks with m = 16: every rank's F/B/W order is the
    schedule simulator's, and the gradients of all ranks together equal the single-process ones."""
    check_run(run, 4, ops={"send": 1, "recv": 1},
              hint="Launch ppl.pipeline_step_worker, the hand pipeline, on one rank per stage; its arguments "
                   "name the schedule (the zero-bubble one) and the number of micro-batches (m).")
    check_pipeline_order(run, "zb-h1", 16)
    if not all(isinstance(r, dict) and "grads" in r for r in run.results):
        reject("every rank must return its {'grads': {layer: (dW, db)}} as pipeline_step_worker does")
    grads = gather_grads(run.results)
    ref, _ = reference_grads()
    check_true(sorted(grads) == sorted(ref) and max_grad_diff(grads, ref) < 1e-12,
               what="a zero-bubble run on 4 ranks whose gradients equal the single-process gradients",
               hint="Use the default model and batch.")
