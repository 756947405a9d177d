"""Exercise checks for 12.3.1 (sequence parallelism)."""
from ...costs import activation_bytes_per_layer
from . import CheckFailed, check_int, check_number, check_run, check_true, exercise, reject, require


@exercise
def ex1(answer):
    """Replicated ('stranded') activation bytes per layer under TP alone: s=2048, b=8, h=4096."""
    check_number(answer, 10 * 2048 * 8 * 4096, what="the replicated activation bytes per layer", rel=1e-3,
                 hint="Korthikanti et al.: the part of sbh(10 + 24/t) that does not shrink with t; it already counts bytes.")


@exercise
def ex2(answer):
    """Per-rank activation bytes per layer with TP + SP and no stored attention scores: s=4096, b=4, h=5120, t=4."""
    expected = activation_bytes_per_layer(4096, 4, 5120, 80, 4, sequence_parallel=True, attention_scores=False)
    check_number(answer, expected, what="the activation bytes per layer per rank under TP + SP", rel=1e-3,
                 hint="With sequence parallelism every one of the 34 sbh terms is divided by t.")


@exercise
def ex3(run, s, b, h, a):
    """Activation bytes measured on rank 0 of a TP + SP run on 2 ranks equal the TP+SP formula."""
    check_run(run, 2, ops={"all_gather": 1, "reduce_scatter": 1}, absent=("all_reduce",),
              hint="Sequence parallelism replaces TP's all-reduces by all-gathers and reduce-scatters: "
                   "pass sequence_parallel=True to sp.activation_memory_worker.")
    res = run.results[0]
    if not (isinstance(res, dict) and "activations" in res):
        reject("rank 0 must return sp.activation_memory_worker's dict (with 'activations')")
    check_int(int(res["activations"]), int(activation_bytes_per_layer(s, b, h, a, 2, sequence_parallel=True)),
              what="the measured activation bytes of rank 0 under TP + SP on 2 ranks",
              hint="Read results[0]['activations'] (LayerNorm statistics excluded).")


@exercise
def ex4(block_class):
    """A TorchBlock subclass that recomputes only the attention core (selective recomputation),
    checked from what it keeps for backward, what its backward recomputes and its gradients."""
    require(block_class, "your subclass of tp.TorchBlock (the class itself)")
    import torch

    from ... import costs, recompute
    from ...tensor_parallel.block import BlockConfig, TorchBlock, make_block_params

    if not (isinstance(block_class, type) and issubclass(block_class, TorchBlock)):
        raise CheckFailed(f"expected a subclass of tp.TorchBlock (the class, not an instance), "
                          f"got {block_class!r}")
    cfg, s, b = BlockConfig(h=32, heads=4, ffn=128, p_drop=0.1), 16, 2
    got = recompute.measure_block(block_class(make_block_params(cfg, 0, torch.bfloat16), cfg), s, b)
    ref = recompute.measure(cfg, s, b, "none")
    kept = {p: costs.recompute_kept_bytes(p, s, b, cfg.h, cfg.heads) for p in recompute.POLICIES}
    if got["activations"] == kept["none"]:
        raise CheckFailed("not yet: your block keeps the attention scores, so nothing is recomputed. "
                             "Run the parent's attention inside torch.utils.checkpoint.checkpoint.")
    if got["activations"] == kept["full"]:
        raise CheckFailed("not yet: your block keeps only its input, which is full recomputation. "
                             "Checkpoint only the attention core: override attention, not forward.")
    check_true(got["activations"] == kept["selective"],
               what="the block keeps Korthikanti et al.'s 34 sbh bytes: everything but the attention core's",
               hint="Wrap exactly the parent's attention(qkv) call, nothing before or after it.")
    extra = got["forward_flops"] + got["backward_flops"] - ref["forward_flops"] - ref["backward_flops"]
    core = costs.recompute_forward_flops("selective", s * b, cfg.h, cfg.ffn, s)
    check_true(extra in (core // 2, core), what="its backward recomputes the attention core's products and nothing else",
               hint="Only Q K^T (and x V) should run a second time; the projections must not.")
    check_true(recompute.max_grad_difference(got, ref) == 0, what="its gradients equal the block's without checkpoint",
               hint="Keep checkpoint's default preserve_rng_state=True and return the core's output unchanged.")
