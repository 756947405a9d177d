"""What a fake-world trace is doing while it runs: :func:`helpers.fake_world.simulate`'s ``progress``.

A 70B layout takes seconds to trace here and Llama 3 405B's tens of seconds; a reader who changed a
control should see the work move, not a frozen figure. :func:`reporting` watches one trace through
PyTorch's global module hooks and tensor hooks, which record nothing and change nothing the trace
measures (the fake world's figures are the same with and without it: tests/test_fake_world_progress.py),
and hands ``report`` a line such as
``trace 2 of 3 (3 of the stage's 80 layers): micro-batch 2 of the 3 traced, forward, layer 1``.

``report`` is called at every change of micro-batch or of direction (forward, backward), at the
first layer of each, and for the layers after it at most every ``every_s`` seconds (a 70B trace
passes a layer in about 50 ms).
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from .. import validate


def check_progress(progress):
    """``progress`` is None or a callable taking one string; anything else is refused by name."""
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be None or a callable taking one str, got {type(progress).__name__}")
    return progress


@contextmanager
def reporting(report, prefix: str, micro_batches: int, every_s: float = 0.2):
    """Call ``report(prefix + ": micro-batch i of n, forward|backward, layer k")`` while the body
    traces one step (module docstring). ``report`` None: nothing is hooked."""
    if report is None:
        yield
        return
    every_s = validate.positive_number(every_s, "every_s")
    import torch
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    from .llama_model import Stage

    state = {"layers": {}, "fwd": 0, "bwd": 0, "last": 0.0, "key": None, "named": None}

    def say(direction, i, layer, force=False):
        now = time.perf_counter()
        key = (direction, i)
        first_layer = layer is not None and state["named"] != key  # the first layer of a pass: at once
        if not force and not first_layer and key == state["key"] and now - state["last"] < every_s:
            return
        state["key"], state["last"] = key, now
        if layer is not None:
            state["named"] = key
        where = f", layer {layer}" if layer is not None else ""
        report(f"{prefix}: micro-batch {i} of the {micro_batches} traced, {direction}{where}")

    def backward_at(i, layer):
        def hook(grad):
            say("backward", i, layer, force=layer is None)
        return hook

    def pre(module, args):
        if isinstance(module, Stage):
            state["fwd"] += 1
            state["layers"] = {id(m): k for k, m in module.layers.items()}
            say("forward", state["fwd"], None, force=True)
        elif id(module) in state["layers"] and torch.is_grad_enabled():
            say("forward", state["fwd"], state["layers"][id(module)])

    def post(module, args, out):
        if isinstance(out, torch.Tensor) and out.requires_grad and torch.is_grad_enabled():
            if isinstance(module, Stage):
                out.register_hook(backward_at(state["fwd"], None))
            elif id(module) in state["layers"]:
                out.register_hook(backward_at(state["fwd"], state["layers"][id(module)]))

    report(f"{prefix}: building the stage")
    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
