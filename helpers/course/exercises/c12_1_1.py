"""Exercise checks for 12.1.1 (naive DDP memory)."""
from ...memory import bytes_per_param, max_params_that_fit, per_device_bytes
from . import check_number, check_run, check_true, exercise, reject


@exercise
def ex1(answer):
    """Bytes per parameter of mixed-precision (bf16) SGD with momentum under naive DDP."""
    check_number(answer, bytes_per_param("bf16-mixed", "sgd-momentum").total, what="bytes per parameter",
                 hint="List what each parameter carries: bf16 weight and gradient, fp32 master copy, and one fp32 momentum.")


@exercise
def ex2(answer_params):
    """Largest model (parameters) for naive DDP on 80 GB devices with 20 GB kept for activations."""
    check_number(answer_params, max_params_that_fit(80e9, reserve_bytes=20e9), what="the largest parameter count",
                 rel=1e-2, hint="Divide the memory left for model state by the bytes each parameter costs.")


@exercise
def ex3(run):
    """An FP32 AdamW model trained one step under DDP on 2 ranks holds what the calculator predicts (rank 0)."""
    check_run(run, 2, ops={"all_reduce": 1}, hint="Wrap the model in DDP, whose backward all-reduces the gradients.")
    result = run.results[0]
    if not (isinstance(result, dict) and {"n_params", "held"} <= set(result)):
        reject("rank 0 must return {'n_params': ..., 'held': memory.measure_model_state(params, optimizer)}")
    n, held = result["n_params"], result["held"]
    model = per_device_bytes(n, 1, 0, precision="fp32", optimizer="adamw")
    check_true(all(held[k] == model[k] for k in ("weights", "gradients", "master", "moments")),
               what="the bytes measured on rank 0 equal the calculator's fp32 AdamW prediction",
               hint="Train an fp32 model with AdamW for one step (so the moments exist) and measure with measure_model_state.")
