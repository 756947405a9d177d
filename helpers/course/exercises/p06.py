"""Exercise checks for P.6 (data parallelism)."""
import numpy as np

from ...costs import bucket_assignment, step_time
from ...data_parallel import effective_batch
from ...overlap import max_diff, ready_order_bytes, reference_training
from . import CheckFailed, check_int, check_number, check_run, check_true, exercise, reject, require


@exercise
def ex1(answer):
    """Effective batch of 16 workers x 2 sequences x 4 accumulation steps."""
    check_int(answer, effective_batch(2, 16, 4), what="the effective batch in sequences",
              hint="Multiply everything that contributes examples to one optimiser update.")


@exercise
def ex2(answer):
    """Loss scale for the rank holding 20 of 32 examples on 4 ranks, under DDP's averaging."""
    check_number(answer, 4 * 20 / 32, what="the loss scale of the rank with 20 examples",
                 hint="DDP divides the summed gradients by the world size; the full gradient weights each shard by n_k/B.")


def _full_gradient(X, y, w, eps=1e-3):
    """The gradient of 0.5 * mean((X w - y)^2) by central differences (exact for a quadratic, up to rounding)."""
    def loss(v):
        return 0.5 * np.mean((X @ v - y) ** 2)
    E = np.eye(len(w)) * eps
    return np.array([(loss(w + e) - loss(w - e)) / (2 * eps) for e in E])


@exercise
def ex3(run, X, y, w):
    """The full-batch gradient on 3 ranks holding 10, 10 and 44 examples; each rank returns (gradient, examples)."""
    check_run(run, 3, ops={"all_reduce": 1}, hint="Combine the ranks' contributions with dist.all_reduce.")
    if not all(isinstance(r, (list, tuple)) and len(r) == 2 for r in run.results):
        reject("every rank must return a pair (its gradient, the number of examples it holds)")
    held = [int(r[1]) for r in run.results]
    if held != [10, 10, 44]:
        reject(f"the ranks held {held} examples; the exercise asks for 10, 10 and 44, in rank order")
    ref = _full_gradient(X, y, w)
    ok = all(np.shape(g) == w.shape and np.allclose(g, ref, rtol=1e-8, atol=1e-10) for g, _ in run.results)
    check_true(ok, what="every rank's gradient equals the full-batch gradient",
               hint="Weight each rank's mean gradient by its share n_k / B: all_reduce n_k * g_k, then divide by B.")


@exercise
def ex4(answer):
    """Step time with overlap: 300 ms of compute (200 ms of it backward) and a 250 ms all-reduce."""

    check_number(answer, step_time(300, 250, 200), what="the step time in ms with the all-reduce overlapping backward",
                 hint="Only the backward can run beside the all-reduce; what it cannot hide adds to the compute.")


@exercise
def ex5(run):
    """A launch of helpers.overlap.hand_ddp_worker on 2 ranks whose steps each issued 3 all-reduces."""

    require(run, "the Run that launch returned for ov.hand_ddp_worker on 2 ranks")
    if not (hasattr(run, "comm") and hasattr(run, "results") and run.results and isinstance(run.results[0], dict)
            and "bucket_bytes" in run.results[0]):
        raise CheckFailed("expected the Run of a launch of ov.hand_ddp_worker, "
                          "not its results or another worker's")
    if run.world_size != 2:
        raise CheckFailed(f"the exercise asks for 2 ranks; this run had {run.world_size}")
    res = run.results[0]
    ready = ready_order_bytes()
    model = [sum(ready[i] for i in b) for b in bucket_assignment(ready, res["bucket_bytes"])]
    steps = len(res["per_step"])
    for r in range(2):
        sent = [o.bytes for o in run.comm[r] if o.op == "all_reduce"]
        if sent != model * steps:
            raise CheckFailed(f"rank {r}'s all-reduces do not match the buckets of its bucket size; "
                              "run the worker unchanged")
    if len(model) != 3:
        raise CheckFailed(f"with bucket_bytes={res['bucket_bytes']} each step issued {len(model)} "
                          "all-reduces, not 3. "
                             "Walk the gradients in backward's order (ov.ready_order_bytes()) and close a bucket at the cap.")
    ref = reference_training(steps=steps)
    if max_diff(res["params"], ref["params"]) > 1e-12:
        raise CheckFailed("the parameters differ from one process's training: keep the worker's defaults")
    print(f"correct: 3 all-reduces per step on both ranks with {res['bucket_bytes']}-byte buckets, "
          "and the training equals one process's")
