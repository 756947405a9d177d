"""Benchmark: torchtitan's own Llama 3 and its own ``parallelize_llama`` on the fake world, beside ours
(issue 26: "a second implementation that nobody here wrote").

torchtitan is not a requirement of the workbook: install it outside .venv, with only the packages its
model and parallelize code import, and put that folder on PYTHONPATH for this benchmark alone:

    pip install --no-deps --target /tmp/tt-site torchtitan==0.3.0 spmd_types==0.2.3 tyro docstring-parser triton
    PYTHONPATH=/tmp/tt-site .venv/bin/python benchmarks/torchtitan_compare.py      [--quick] [--no-70b]

(triton: ``torchtitan.models.common`` imports the MoE token dispatcher, whose kernels import triton at
module level; nothing here runs it.) Without torchtitan it prints how to install it and exits 0.

Each case builds torchtitan's Llama 3.1 config (``llama3_configs``: 8B, and 70B unless --no-70b) cut to
a few layers, applies ``parallelize_llama`` (TP with sequence parallelism and its loss parallel;
activation checkpointing none / full / selective-op; FSDP2 ``fully_shard`` with bf16 parameters and
FP32 reduction) on a fake world of DP x TP ranks (:func:`helpers.fake_world.fake_world`, the mesh from
torchtitan's ``ParallelDims.build_mesh``), and runs its training step under ``FakeTensorMode`` as its
``Trainer.train_step`` does (the token count all-reduced, forward, its cross-entropy, backward,
``clip_grad_norm_``, its default optimizer: fused AdamW), measured with our tracker
(:func:`helpers.fake_world.step.memtracker_class`, its categories, every collective in a
:class:`helpers.launcher.commlog.CommLog`, :func:`helpers.fake_world.step.flop_counter`), the optimizer
state made first as ours (a steady-state step). Then ours, :func:`helpers.fake_world.simulate` on the
same dims, layers, sequence, micro-batch, layout and recipe (``extrapolate=False``, ``optimizer="fused"``,
FP32 loss and reduction), and both side by side.

Prints one ``name: value`` line per figure:
  torchtitan_version                 the installed torchtitan and torch
  torchtitan_not_run <what>          each part of torchtitan that cannot run on the fake CPU world: the exact
                                     error, and what this benchmark runs instead
  case <case>                        the configuration: model dims, layers, sequence, layout, recompute
  memory <case> <category>           bytes at the step's peak, by category (parameters, gradients, optimizer,
                                     activations, temporaries, other, total): ours, torchtitan's (GiB) and
                                     torchtitan / ours
  reserved <case>                    the peak reserved by our model of the CUDA caching allocator fed each
                                     side's allocations (helpers.fake_world.allocator), and the ratio
  held <case>                        bytes held after the optimizer step (the state between steps)
  comm <case> <kind> g<size>         collectives of one step by kind and group size: calls and payload
                                     bytes, ours and torchtitan's
  flops <case>                       FLOPs of the step on this rank (FlopCounterMode), ours and torchtitan's
  wall <case>                        seconds each side's trace took here (rough: a shared 2-core machine)
  memory_cuda_norm <case> <cat>      activations and total again, torchtitan's RMSNorm keeping what the fused
                                     CUDA kernel keeps (on the fake world's CPU tensors it is decomposed)
  explained <case> <what>            each gap of the case (parameters, activations, FLOPs) measured and
                                     predicted from the dims by the mechanism named (bytes, FLOPs)
  saved_per_block <impl> <part> <module>: <op> <shape> <dtype>: MiB
                                     one block of Llama 3.1 8B, and the final norm, head and loss, each
                                     implementation's (BF16 weights, no parallelism, b = 1, s = 8192): every
                                     tensor autograd keeps for backward, by the module whose forward kept it and
                                     the op that made it; saved_per_block_total <impl> <part>: their sum
  case / memory / explained ... reshard-<policy>
                                     torchtitan's other FSDP policies beside ours: "always" (ours
                                     reshard_after_forward="always") and "never" (ours ZeRO-2), 8B, DP 8, full AC
  memory_refiled <case> <cat>        under "never", torchtitan's run with FSDP2's unsharded parameters filed as
                                     parameters at each phase boundary (the defect_ours line)
  difference <n>                     each difference between the two implementations, explained
  defect_ours <where>                what the comparison shows to be wrong on our side, with the evidence
Run: PYTHONPATH=/tmp/tt-site python benchmarks/torchtitan_compare.py  (not a test; --quick: the 8B
FSDP-only cases only; --no-70b: without the 70B cases)
"""
from __future__ import annotations

import dataclasses
import sys
import time
import types
from collections import defaultdict
from contextlib import contextmanager

GIB = 2**30
INSTALL = ("pip install --no-deps --target /tmp/tt-site torchtitan==0.3.0 spmd_types==0.2.3 tyro docstring-parser "
           "triton; then PYTHONPATH=/tmp/tt-site .venv/bin/python benchmarks/torchtitan_compare.py")
# what torchtitan's own Llama cannot run here, found on torchtitan 0.3.0 with torch 2.13.0 (CPU build):
# printed as torchtitan_not_run lines, with what runs instead
NOT_RUN = {
    "spmd_backend=spmd_types (its default)":
        "fully_shard (torch 2.13.0) refuses the spmd_types-annotated plain parameters: \"ValueError: When "
        "dp_mesh_dims is provided, all parameters must be DTensors on the full SPMD mesh (e.g. via "
        "distribute_module). Got plain tensor for parameter 'weight'.\" (torchtitan 0.3.0 asks for a nightly "
        "torch); run instead: spmd_backend='partial_dtensor' (DTensor TP, FSDP2 on its 'fsdp' mesh: the path "
        "of torchtitan's releases before spmd_types)",
    "attn_backend=flex (the Llama 3 default; 'sdpa' is refused for language models)":
        "its BlockMask is made by a torch.compile'd create_block_mask and attention runs a torch.compile'd "
        "flex_attention: inductor's compiled CPU kernel dereferences the FakeTensors' data pointers "
        "(\"Accessing the data pointer of FakeTensor is deprecated\", then a segmentation fault in "
        "create_block_mask). attn_backend=varlen: its document metadata (create_varlen_metadata_for_document) "
        "calls nonzero, whose output shape depends on the values: \"DynamicOutputShapeException: "
        "aten.nonzero.default\" under FakeTensorMode. Run instead: torchtitan's own "
        "ScaledDotProductAttention module as every layer's inner_attention (is_causal=True: one document per "
        "sequence, the same attention as block-causal masks of one document; F.scaled_dot_product_attention "
        "under sdpa_kernel([CUDNN, FLASH, MATH]) -> the CPU flash kernel, as ours)",
    "Trainer (torchtitan.trainer)":
        "imports torchdata, tokenizers and datasets (the data pipeline), which are not installed: the step is "
        "Trainer.train_step's, written here with torchtitan's own pieces (ParallelDims, parallelize_llama, "
        "CrossEntropyLoss, dist_sum_tensor, clip_grad_norm_, OptimizersContainer); update_from_config imports "
        "torchtitan.trainer only to test isinstance(config, Trainer.Config), so a stand-in module is "
        "registered and the one thing that branch does for training (RoPE cache length = training.seq_len) "
        "is done here the same way",
    "init_weights":
        "trunc_normal_ asks for a value (mask.any()) under FakeTensorMode (DataDependentOutputException): "
        "parameter init is skipped (values mean nothing on fake tensors; ours does not init either) and the "
        "buffers (the RoPE cache) are made by its init_states",
    "selective AC's save list on CPU":
        "torchtitan's per-op policy saves the CUDA attention kernels' outputs, not the CPU flash kernel's "
        "(aten._scaled_dot_product_flash_attention_for_cpu), which fake CPU tensors run: through its own "
        "extension point (SelectiveAC.get_save_ops) the CPU kernel is added, standing for the CUDA one, as "
        "ours does",
}


# every difference between torchtitan 0.3.0's Llama 3 step and ours (printed as difference lines); the
# explained lines of each case put the measured gaps against them in bytes and FLOPs
DIFFERENCES = (
    "FSDP units (parameters, all-gathers): torchtitan wraps tok_embeddings, every block, [norm, lm_head] and the "
    "model (which holds nothing then); with its 'default' policy and no pipeline the embedding and every block, "
    "the last one too, are resharded after forward and [norm, lm_head] is kept. Ours wraps every block and the "
    "stage (embedding, norm and head in one root unit) and keeps the root and the last block unsharded from "
    "forward to backward (torchtitan's layout until mid-2025, RESHARD_POLICIES 'default'). So ours holds the "
    "embedding's and the last block's BF16 weights at the peak (explained ... parameters) and torchtitan "
    "all-gathers them again for backward: 2L + 3 all-gathers against ours' 2L (the embedding and [norm, lm_head] "
    "gathered apart in forward; the embedding, whose backward does not read its weight, and the last block "
    "gathered again for backward: V x h x 2 / TP + the last block's BF16 bytes more), and one reduce-scatter "
    "more (L + 2 units against L + 1; the same bytes). Neither is wrong; ours cannot express torchtitan's "
    "current split (embedding resharded, head kept)",
    "QKV: torchtitan's Llama 3 configs use one fused wqkv Linear (fuse_qkv=True; rows grouped per KV head, "
    "(n_kv, heads/n_kv + 2, hd)), split by reshapes and .contiguous() copies of q, k and v; ours has wq, wk, wv. "
    "Same parameters, FLOPs and saved bytes without recomputation (v's contiguous copy is kept as ours keeps wv's "
    "output); under per-op selective AC the 5 matmuls of a block instead of 7 change what is saved (explained "
    "... activations with the CUDA norm)",
    "RoPE: torchtitan's ComplexRoPE holds a complex64 freqs_cis buffer of seq x hd/2 in every layer (its own "
    "RoPE module per attention; 4 MiB per layer at 8K, counted as parameters: buffers), upcasts q and k to FP32, "
    "multiplies by the complex freqs (adjacent-pair convention, Llama 3.1 frequency scaling) and casts back; "
    "ours computes BF16 cos/sin tables once per forward (rotate-half). Both keep the rotated BF16 q and k for "
    "backward; the FP32 copies are not kept. Values differ, bytes do not (but the 4 MiB of tables)",
    "RMSNorm: torchtitan uses nn.RMSNorm (F.rms_norm). On a GPU that is the fused kernel (_fused_rms_norm: the "
    "input and the FP32 reciprocal RMS kept), which is what ours models (llama_model._RMSNormFunction); on the "
    "CPU, which the fake world's tensors are on, rms_norm is decomposed and keeps two FP32 copies instead: a "
    "fake-world artefact, 6 bytes per element of every norm kept (the memory_cuda_norm lines run torchtitan "
    "with the kernel's saved set, and its activations equal ours but for the RoPE tables)",
    "Attention: torchtitan 0.3.0's Llama 3 runs FlexAttention (block-causal masks; 'sdpa' is refused for "
    "language models), which cannot run on fake tensors (torchtitan_not_run); its ScaledDotProductAttention "
    "module (is_causal, enable_gqa) runs instead: the same kernel as ours (the CPU flash kernel standing for "
    "the CUDA one: output and log-sum-exp kept)",
    "Loss: torchtitan sums the FP32 cross-entropy and divides by the global token count (all-reduced before "
    "the step); ours takes the mean over its tokens. Under TP torchtitan has its own loss-parallel cross-entropy "
    "(_LossParallelCrossEntropy: all-reduces of the max, the sum of exponentials and the picked log-probability; "
    "FP32 log-probabilities of the local vocabulary shard kept), ours PyTorch's loss_parallel: the same bytes at "
    "the peak (temporaries equal) and the same all-reduces",
    "Weight tying: off in both (Llama 3.1 8B, 70B, 405B; torchtitan ties only its 1B and 3B, into one FSDP unit)",
    "The step around the model: torchtitan all-reduces the token count over the batch mesh and clips the "
    "gradient norm (clip_grad_norm_, foreach: per-parameter norms, an all-reduce over FSDP, and over TP with TP): "
    "the all_reduce calls only it has; its MixedPrecisionPolicy has cast_forward_inputs=False and its FSDP "
    "gradient division is off (the loss is normalised by the token count): no memory effect",
    "Optimizer: torchtitan's default AdamW implementation 'fused' (lr 8e-4, betas 0.9/0.95, weight decay 0.1); "
    "ours runs with optimizer='fused' here: the same moments and no temporaries; both measured at a steady "
    "state (the moments made first)",
    "Activation checkpointing: torchtitan's checkpoint_wrapper has preserve_rng_state=True and early_stop=False "
    "(its full recompute runs the w2 matmul, and under TP its reduce-scatter, that backward does not need: "
    "explained ... flops, and one reduce-scatter per layer more); ours preserve_rng_state=False, early_stop "
    "default. Its per-op policy saves functorch's compute-intensive ops (mm, addmm, bmm, the CUDA attention "
    "kernels...), aten.linear, max, topk, flex, reduce_scatter and all_to_all, every second mm or linear "
    "recomputed; ours the 2024 list (mm, the attention kernels, reduce_scatter, max)",
    "Parallelism backend: torchtitan 0.3.0's default spmd_types backend cannot run on torch 2.13.0 "
    "(torchtitan_not_run); its DTensor path (partial_dtensor) is the same machinery as ours "
    "(DTensor TP with sequence parallelism, FSDP2 over the DP ranks of the same TP rank)",
)


# a gap of our tracker (helpers.fake_world.step.memtracker_class) that torchtitan's FSDP units show
LEAF_UNIT = (
    "our tracker files FSDP2's unsharded parameters (the all-gathers' outputs) under parameters only when "
    "MemTracker's pre-forward hook of a module holding them runs after FSDP2 has unsharded them: a submodule of "
    "the fully_shard unit. The hook of the unit's own module runs before FSDP2's (a global module hook before a "
    "local one) and sees the sharded parameters; where the unit's module holds the parameters itself (torchtitan's "
    "tok_embeddings, an nn.Embedding; the norm of its [norm, lm_head] unit, whose pre-forward gathers both) "
    "nothing re-files the all-gather's output, made in forward: it stays under activations (file_gradients "
    "moves gradients only). Measured: under reshard 'never' the embedding's 1002 MiB, under 'default' the "
    "norm's 8192 bytes. Totals are right; ours' own figures are unaffected (its units, a Stage and its Blocks, "
    "hold their parameters in submodules)"
)


def torchtitan_available():
    try:
        import torchtitan  # noqa: F401
        from torchtitan.models.llama3 import parallelize_llama  # noqa: F401
    except Exception as e:  # not installed, a package it imports missing, or made for another torch
        return e
    return None


# ---- torchtitan's side ----------------------------------------------------------------------------

def _trainer_stand_in():
    """``Decoder.Config.update_from_config`` imports ``torchtitan.trainer`` (for an isinstance test);
    that module imports the data pipeline (torchdata, tokenizers, datasets). Where it is not
    importable, a stand-in whose ``Trainer.Config`` nothing is an instance of."""
    try:
        import torchtitan.trainer  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("torchtitan.trainer")

        class Trainer:
            class Config:
                pass

        stand_in.Trainer = Trainer
        sys.modules["torchtitan.trainer"] = stand_in


def tt_config(flavor: str, layers: int):
    """torchtitan's Llama 3 config of ``flavor`` with its first ``layers`` layers, every layer's inner
    attention torchtitan's ScaledDotProductAttention (NOT_RUN: flex)."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import llama3_configs

    mc = llama3_configs[flavor](attn_backend="flex")
    mc.layers = mc.layers[:layers]
    for lc in mc.layers:
        lc.attention.inner_attention = ScaledDotProductAttention.Config()
    return mc


def our_model(mc, name: str, seq: int):
    """The planner's Model with torchtitan's config's dims (our fake world builds from it)."""
    from helpers.planner import Model

    att = mc.layers[0].attention
    return Model(name=name, layers=len(mc.layers), hidden=mc.dim, heads=att.n_heads, kv_heads=att.n_kv_heads,
                 ffn=mc.layers[0].feed_forward.w1.out_features, seq_len=seq, mlp_matrices=3, vocab=mc.vocab_size,
                 tied_embeddings=mc.enable_weight_tying)


def _ac_config(ac: str):
    """torchtitan's activation checkpointing config: None, FullAC, or its per-op SelectiveAC with the
    CPU flash kernel in its save list (NOT_RUN: selective AC's save list on CPU)."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    if ac == "none":
        return None
    if ac == "full":
        return FullAC.Config()

    class SelectiveACCPU(SelectiveAC):
        """torchtitan's per-op policy, the CPU flash kernel saved as the CUDA ones are."""

        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(SelectiveAC.Config):
            pass

        def get_save_ops(self):
            from helpers.torch_private import sdpa_flash_cpu

            return super().get_save_ops() | {sdpa_flash_cpu.default}

    return SelectiveACCPU.Config()


@contextmanager
def _cuda_norm(on: bool):
    """With ``on``: torchtitan's RMSNorm (``nn.RMSNorm``) keeps for backward what it keeps on a GPU. On
    CUDA ``rms_norm`` runs the fused kernel (``_fused_rms_norm``: the input and the FP32 reciprocal RMS
    kept); on the CPU, which fake tensors run on, it is decomposed and keeps two FP32 copies of the input
    instead of the input (6 bytes per element more). Ours models the CUDA kernel (``llama_model._RMSNormFunction``): the same
    function stands in for it here (patched on the class before the model is built and parallelised)."""
    if not on:
        yield
        return
    from torchtitan.models.common.nn_modules import RMSNorm

    from helpers.fake_world.llama_model import _RMSNormFunction

    RMSNorm.forward = lambda self, x: _RMSNormFunction.apply(x, self.weight, self.eps)
    try:
        yield
    finally:
        del RMSNorm.forward  # nn.RMSNorm's again


@contextmanager
def _no_param_init():
    """torchtitan's ``init_states`` without parameter init (NOT_RUN: init_weights): buffers only."""
    from torchtitan.protocols.module import Module

    saved = Module._init_self_parameters
    Module._init_self_parameters = lambda self: None
    try:
        yield
    finally:
        Module._init_self_parameters = saved


def run_torchtitan(flavor: str, layers: int, seq: int, dp: int, tp: int, ac: str, batch: int = 1,
                   cuda_norm: bool = False, reshard: str = "default", refile: bool = False) -> dict:
    """Rank 0 of a DP x TP fake world running torchtitan's training step of its Llama 3 ``flavor``
    (``layers`` layers), measured as our fake world measures its own (module docstring);
    ``cuda_norm``: its RMSNorm keeping what the CUDA kernel keeps (:func:`_cuda_norm`); ``reshard``:
    its ``fsdp_reshard_after_forward`` policy (default, always, never)."""
    import torch

    _trainer_stand_in()
    import torchtitan.distributed.parallel_dims as parallel_dims_mod
    from torchtitan.config.configs import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.llama3 import parallelize_llama

    from helpers.fake_world import fake_world
    from helpers.fake_world.step import _PropagationMarker
    from helpers.torch_private import FakeTensorMode, swap_propagation_lock

    # torchtitan picks its device type at import: "cuda" where none is available; the fake world is CPU
    parallel_dims_mod.device_type = "cpu"
    t0 = time.perf_counter()
    world = dp * tp
    par = ParallelismConfig(data_parallel_shard_degree=dp, tensor_parallel_degree=tp, fsdp_reshard_after_forward=reshard,
                            spmd_backend="partial_dtensor")  # NOT_RUN: spmd_types
    training = TrainingConfig(seq_len=seq, local_batch_size=batch)
    mc = tt_config(flavor, layers)
    with fake_world(world, 0), _cuda_norm(cuda_norm):
        dims = ParallelDims.from_config(par, world)
        dims.build_mesh()
        dist_utils.set_spmd_backend(par.spmd_backend)
        mc.update_from_config(config=types.SimpleNamespace(parallelism=par))  # non-trainer callers' path
        for lc in mc.layers:  # what its Trainer.Config branch does: the RoPE cache as long as the sequence
            lc.attention.rope = dataclasses.replace(lc.attention.rope, max_seq_len=seq)
        saved_lock = swap_propagation_lock(_PropagationMarker())  # as measured_step: DTensor's propagation untracked
        try:
            with torch.device("meta"):  # the Trainer: meta device, default dtype training.dtype (FP32)
                model = mc.build()
            model = parallelize_llama(model, parallel_dims=dims, training=training, parallelism=par,
                                      compile_config=CompileConfig(), ac_config=_ac_config(ac), dump_folder="")
            with FakeTensorMode(allow_non_fake_inputs=True):
                out = _measure_torchtitan(model, mc, dims, training, batch, seq, refile)
        finally:
            swap_propagation_lock(saved_lock)
    out["wall_s"] = time.perf_counter() - t0
    out["fsdp_units"] = _fsdp_units(model)
    return out


def _fsdp_units(model) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [name or "(root)" for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def _unsharded_params(model) -> list:
    """FSDP2's unsharded parameters (the all-gathers' outputs, kept between steps as storages resized to
    0 when resharded) of every ``fully_shard`` unit in ``model``."""
    from torch.distributed.fsdp import FSDPModule

    out = []
    for mod in model.modules():
        if isinstance(mod, FSDPModule):
            for group in mod._get_fsdp_state()._fsdp_param_groups:
                out += [fp._unsharded_param for fp in group.fsdp_params if hasattr(fp, "_unsharded_param")]
    return out


def _measure_torchtitan(model, mc, dims, training, batch, seq, refile: bool = False) -> dict:
    import torch
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.components.optimizer.optimizer import default_adamw
    from torchtitan.config.configs import CompileConfig
    from torchtitan.distributed import utils as dist_utils

    from helpers.fake_world.step import _categories, _replay_allocations, flop_counter, memtracker_class
    from helpers.launcher.commlog import CommLog
    from helpers.torch_private import MemRefType, adam_init_state

    model.to_empty(device="cpu")
    with _no_param_init(), torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    opts = default_adamw().build(model_parts=[model])  # torchtitan's default: AdamW, implementation "fused"
    # a steady-state step, as ours (StageParts.materialize): the moments a first step makes, no gradients
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for opt in opts.optimizers:
        adam_init_state(opt)
    opts.zero_grad(set_to_none=True)
    loss_fn = CrossEntropyLoss.Config(global_vocab_size=mc.vocab_size).build(compile_config=CompileConfig())
    context = dist_utils.get_spmd_context(parallel_dims=dims)

    tracker = memtracker_class()()
    tracker.track_external(model, *opts.optimizers)
    flops = flop_counter()
    log = CommLog(record_comm=False)
    tracker.comm_log = log
    phases = {}

    def close_phase(name):  # as helpers.fake_world.step._measure: each phase's peak, gradients filed first
        tracker.file_gradients(model)
        if refile:  # (the tracker's defect: see LEAF_UNIT) FSDP2's unsharded parameters filed as parameters
            for p in _unsharded_params(model):
                tracker._update_and_maybe_create_winfos(p, MemRefType.PARAM)
        phases[name] = _categories(tracker.get_tracker_snapshot("peak"))
        tracker.restart_peak()

    with tracker, log, flops:
        # Trainer.train_step: the token count summed over the batch mesh, then forward_backward_step
        tokens = torch.randint(0, mc.vocab_size, (batch, seq))
        labels = torch.randint(0, mc.vocab_size, (batch, seq))
        local_valid = (labels != -100).sum()
        global_valid = (dist_utils.dist_sum_tensor(local_valid, dims.get_mesh("batch")) if dims.dp_enabled
                        else local_valid)
        close_phase("start")
        with context():
            pred = model(tokens)
            loss, _ = loss_fn(pred, labels, global_valid)
            del pred
            close_phase("forward")
            loss.backward()
        close_phase("backward")
        dist_utils.clip_grad_norm_([p for p in model.parameters()], training.max_norm, foreach=True,
                                   pp_mesh=dims.get_optional_mesh("pp"), ep_enabled=dims.ep_enabled)
        opts.step()
        close_phase("optimizer")
    peak = max(phases.values(), key=lambda snap: snap["total"])
    held = _categories(tracker.get_tracker_snapshot("current"))
    return {"peak": peak, "phases": phases, "held": held, "reserve": _replay_allocations(tracker.alloc_events),
            "comm": _comm_by_kind([(o.op, o.bytes, o.group_size) for o in log.ops]),
            "flops": flops.get_total_flops()}


def _comm_by_kind(ops) -> dict:
    out = defaultdict(lambda: [0, 0])
    for kind, nbytes, size in ops:
        if size > 1:
            out[kind, size][0] += 1
            out[kind, size][1] += nbytes
    return dict(out)


# ---- ours ---------------------------------------------------------------------------------------------

def run_ours(model, dp: int, tp: int, ac: str, batch: int = 1, reshard: str = "default") -> dict:
    """:func:`helpers.fake_world.simulate` of the same step: ZeRO-3 with our ``reshard`` policy
    (RESHARD_POLICIES: default, always), or ZeRO-2 for torchtitan's "never" (no unit resharded)."""
    from helpers import fake_world
    from helpers.planner import Layout

    zero = 2 if reshard == "never" else 3
    layout = Layout(dp=dp, tp=tp, zero=zero, micro_batch=batch, recompute=ac, sequence_parallel=True)
    t0 = time.perf_counter()
    step = fake_world.simulate(model, layout, micro_batches=1, extrapolate=False, optimizer="fused",
                               loss_dtype="float32", reduce_dtype="float32", timing=False,
                               reshard_after_forward="default" if reshard == "never" else reshard)
    return {"peak": step.memory, "held": step.held, "reserve": step.reserve, "comm": _ours_comm(step),
            "flops": step.flops, "wall_s": time.perf_counter() - t0, "layout": layout.label()}


def _ours_comm(step) -> dict:
    out = defaultdict(lambda: [0, 0])
    for r in step.comm:
        if r["group_size"] > 1:
            out[r["kind"], r["group_size"]][0] += r["calls"]
            out[r["kind"], r["group_size"]][1] += r["bytes"]
    return dict(out)


# ---- what each keeps for backward -------------------------------------------------------------------------

def saved_tensors(fn, *args, params=()) -> list:
    """Run ``fn(*args)`` (under a FakeTensorMode) and list every storage autograd keeps for backward:
    (the module whose forward kept it, the op that made it, shape, dtype, bytes), one entry per storage; ``params``' storages (parameters
    and buffers) are left out (not activations); the inputs' are named "(input)"."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.module_tracker import ModuleTracker

    key = lambda t: t.untyped_storage()._cdata
    made = {key(a): "(input)" for a in args if isinstance(a, torch.Tensor)}
    skip = {key(p) for p in params}

    class Producers(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and not func._schema.is_mutable:  # a new storage (its address may be reused)
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        made[key(t)] = func.overloadpacket.__name__
            return out

    saved = {}
    modules = ModuleTracker()

    def pack(t):
        k = key(t)
        if k not in skip and k not in saved:
            inner = max(modules.parents - {"Global"} or {"Global"}, key=lambda n: n.count("."))
            where = inner.split(".", 1)[1] if "." in inner else "(its own forward)"  # the innermost submodule
            saved[k] = (where, made.get(k, "(made before)"), tuple(t.shape), str(t.dtype).replace("torch.", ""),
                        t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), modules, Producers():
        fn(*args)
    return list(saved.values())


def _bf16_params(module):
    """Every parameter of ``module`` in BF16 (FSDP2's param_dtype), buffers as they are."""
    import torch

    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[name] = torch.nn.Parameter(p.detach().to(torch.bfloat16))
    return module


class _Tail:
    """The last stage's end, one module so the saved tensors are named by its parts: norm, output, loss."""

    def __new__(cls, norm, output, loss_fn):
        import torch.nn as nn

        class Tail(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm, self.output = norm, output

            def forward(self, h):
                return loss_fn(self.output(self.norm(h)))

        return Tail()


def saved_per_block(flavor: str, seq: int) -> dict:
    """What one block, and the final norm, output head and loss, keep for backward in each
    implementation: BF16 weights, b = 1, ``seq`` tokens, no parallelism, fake tensors."""
    import torch
    import torch.nn as nn

    from helpers.fake_world import llama_model as ours
    from helpers.fake_world.recipes import loss as our_loss
    from helpers.torch_private import FakeTensorMode

    _trainer_stand_in()
    from torchtitan.components.loss import cross_entropy_loss

    mc = tt_config(flavor, 1)
    for lc in mc.layers:
        lc.attention.rope = dataclasses.replace(lc.attention.rope, max_seq_len=seq)
    model = our_model(mc, flavor, seq)
    out = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(1, seq, mc.dim, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, mc.vocab_size, (1, seq))
        # ours: a Block, the cos/sin tables its Stage makes once per forward, then norm, head, FP32 loss
        blk = _bf16_params(ours.Block(model))
        cos, sin = ours.rope_tables(torch.arange(seq), model.hd, torch.bfloat16)
        out["ours block"] = saved_tensors(lambda h: blk(h, cos, sin), x, params=list(blk.parameters()))
        tail = _Tail(ours.RMSNorm(mc.dim), nn.Linear(mc.dim, mc.vocab_size, bias=False),
                     lambda logits: our_loss(logits, labels, "float32"))
        out["ours norm+head+loss"] = saved_tensors(_bf16_params(tail), x, params=list(tail.parameters()))
        # torchtitan's: its block (its RoPE cache made as it is built), its norm, lm_head and loss
        tblk = _bf16_params(mc.layers[0].build())
        out["torchtitan block"] = saved_tensors(lambda h: tblk(h, None), x,
                                                params=[*tblk.parameters(), *tblk.buffers()])
        tail = _Tail(mc.norm.build(), mc.lm_head.build(), lambda logits: cross_entropy_loss(logits, labels))
        out["torchtitan norm+head+loss"] = saved_tensors(_bf16_params(tail), x, params=list(tail.parameters()))
    return out


def print_saved(inv: dict) -> None:
    for name, rows in inv.items():
        agg = defaultdict(lambda: [0, 0])
        for where, op, shape, dtype, nbytes in rows:
            agg[where, op, shape, dtype][0] += 1
            agg[where, op, shape, dtype][1] += nbytes
        for (where, op, shape, dtype), (n, nbytes) in agg.items():  # in the order they were kept
            print(f"saved_per_block {name} {where}: {op} {list(shape)} {dtype}"
                  + (f" x {n}" if n > 1 else "") + f": {nbytes / 2**20:.1f} MiB")
        print(f"saved_per_block_total {name}: {sum(r[-1] for r in rows) / 2**20:.1f} MiB")


# ---- printing -----------------------------------------------------------------------------------------

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries", "other", "total")


def _ratio(a, b) -> str:
    return f"{b / a:.3f}" if a else ("n/a" if not b else "inf")


def compare(case: str, ours: dict, tt: dict) -> None:
    for c in CATEGORIES:
        a, b = ours["peak"][c], tt["peak"][c]
        print(f"memory {case} {c}: ours {a / GIB:.3f} GiB, torchtitan {b / GIB:.3f} GiB, "
              f"torchtitan/ours {_ratio(a, b)}")
    a, b = ours["reserve"]["peak_reserved"], tt["reserve"]["peak_reserved"]
    print(f"reserved {case}: ours {a / GIB:.3f} GiB, torchtitan {b / GIB:.3f} GiB, torchtitan/ours {_ratio(a, b)}")
    a, b = ours["held"]["total"], tt["held"]["total"]
    print(f"held {case}: ours {a / GIB:.3f} GiB, torchtitan {b / GIB:.3f} GiB, torchtitan/ours {_ratio(a, b)}")
    for key in sorted(set(ours["comm"]) | set(tt["comm"])):
        (ca, ba), (cb, bb) = ours["comm"].get(key, (0, 0)), tt["comm"].get(key, (0, 0))
        print(f"comm {case} {key[0]} g{key[1]}: ours {ca} calls {ba / 2**20:.1f} MiB, torchtitan {cb} calls "
              f"{bb / 2**20:.1f} MiB")
    print(f"flops {case}: ours {ours['flops']:.4e}, torchtitan {tt['flops']:.4e}, torchtitan/ours "
          f"{_ratio(ours['flops'], tt['flops'])}")
    print(f"wall {case}: ours {ours['wall_s']:.1f} s, torchtitan {tt['wall_s']:.1f} s")


def explain(case: str, model, seq: int, dp: int, tp: int, ac: str, ours: dict, tt: dict, tt_cuda: dict) -> None:
    """Each measured gap against the mechanism that accounts for it, in bytes (or FLOPs), from the dims."""
    h, v, hd, kv, heads, ffn, L = model.hidden, model.vocab, model.hd, model.kv, model.heads, model.ffn, model.layers
    s_local = seq // tp  # sequence parallelism: norms and residuals on s / TP positions
    mib = lambda x: f"{x / 2**20:.1f} MiB"
    block = (h * (heads + 2 * kv) * hd + heads * hd * h + 3 * h * ffn) // tp * 2 + 2 * h * 2
    pred = v * h * 2 // tp + block - L * seq * (hd // 2) * 8
    got = ours["peak"]["parameters"] - tt["peak"]["parameters"]
    print(f"explained {case} parameters: ours - torchtitan = {mib(got)}; predicted {mib(pred)} (ours keeps its root "
          f"unit, embedding + norm + head, and its last block unsharded from forward to backward: the embedding's BF16 "
          f"weights V x h x 2 / TP and the last block's; torchtitan reshards both and keeps [norm, lm_head]; minus "
          f"torchtitan's RoPE cache, a complex64 buffer of s x hd/2 in every layer: {mib(L * seq * hd // 2 * 8)})")
    kept = 2 * L + 1 if ac == "none" else 1  # norms whose forward is kept at the peak (others recomputed)
    pred = kept * 6 * s_local * h
    got = tt["peak"]["activations"] - tt_cuda["peak"]["activations"]
    print(f"explained {case} activations: torchtitan on CPU - torchtitan with the CUDA norm = {mib(got)}; predicted "
          f"{mib(pred)} (nn.RMSNorm decomposed on the CPU keeps an FP32 copy of its input and the FP32 normalised "
          f"input instead of the BF16 input: 6 bytes per element more, in each of the {kept} norms kept)")
    pred = 2 * seq * hd * 2
    extra = ""
    if ac == "selective":
        pred -= L * seq * kv * hd * 2 // tp
        extra = (f"; minus K, which torchtitan's per-op policy keeps in its fused wqkv output (saved, every first "
                 f"of 5 matmuls) and ours recomputes (wk, the second of 7): {mib(L * seq * kv * hd * 2 // tp)}")
    got = ours["peak"]["activations"] - tt_cuda["peak"]["activations"]
    print(f"explained {case} activations with the CUDA norm: ours - torchtitan = {mib(got)}; predicted {mib(pred)} "
          f"(ours computes RoPE's BF16 cos and sin tables, s x hd each, once per forward and keeps them, "
          f"{mib(2 * seq * hd * 2)}; torchtitan's complex freqs are views of its buffer{extra})")
    (ca, ba), (cb, bb) = ours["comm"].get(("all_gather", dp), (0, 0)), tt["comm"].get(("all_gather", dp), (0, 0))
    print(f"explained {case} all_gather g{dp}: torchtitan - ours = {cb - ca} calls, {mib(bb - ba)}; predicted 3 "
          f"calls, {mib(v * h * 2 // tp + block)} (its embedding and [norm, lm_head] gathered apart in forward; the "
          f"embedding and the last block gathered again for backward)")
    if tp > 1 and ac == "full":
        (ca, ba), (cb, bb) = ours["comm"].get(("reduce_scatter", tp), (0, 0)), tt["comm"].get(("reduce_scatter", tp), (0, 0))
        print(f"explained {case} reduce_scatter g{tp}: torchtitan - ours = {cb - ca} calls, {mib(bb - ba)}; predicted "
              f"{L} calls, {mib(L * seq * h * 2)} (w2's sequence-parallel reduce-scatter, recomputed by its "
              f"early_stop=False recompute)")
    if tp > 1:
        ca, cb = ours["comm"].get(("all_reduce", tp), (0, 0))[0], tt["comm"].get(("all_reduce", tp), (0, 0))[0]
        print(f"explained {case} all_reduce g{tp}: ours {ca}, torchtitan {cb} calls; predicted {3 + 2 * L + 1} and "
              f"{3 + 2 * L + 2} (the loss-parallel cross-entropy's 3, the {2 * L + 1} norm weights' gradients, "
              f"Partial over TP under sequence parallelism; torchtitan's clip_grad_norm_ one more)")
    got = tt["flops"] - ours["flops"]
    if ac == "none":
        pred, why = 0, "the same matmuls and attention"
    elif ac == "full":
        pred = L * 2 * seq * h * ffn // tp
        why = ("torchtitan's checkpoint_wrapper has early_stop=False: its recompute runs the whole block, the w2 matmul "
               "too, whose output backward does not need; ours (PyTorch's default, early_stop=True) stops before it")
    else:
        pred = -L * 2 * seq * h * kv * hd // tp
        why = "ours recomputes wk in backward, torchtitan's fused wqkv is saved"
    print(f"explained {case} flops: torchtitan - ours = {got:.4e}; predicted {pred:.4e} ({why})")


def reshard_policies(seq: int) -> None:
    """torchtitan's other reshard policies against ours: "always" (every unit resharded; ours
    reshard_after_forward="always") and "never" (none; ours ZeRO-2), Llama 3.1 8B, 4 layers, DP 8, full
    AC, torchtitan's RMSNorm as on CUDA. Under "never" torchtitan's run is also measured with FSDP2's
    unsharded parameters filed as parameters at each phase boundary (LEAF_UNIT: our tracker's gap)."""
    flavor, layers, dp, tp, ac = "8B", 4, 8, 1, "full"
    mc = tt_config(flavor, layers)
    model = our_model(mc, f"Llama 3.1 {flavor} (torchtitan's args, {layers} layers)", seq)
    mib = lambda x: f"{x / 2**20:.1f} MiB"
    for policy in ("always", "never"):
        case = f"{flavor} L{layers} s{seq} DP{dp} AC-{ac} reshard-{policy}"
        tt = run_torchtitan(flavor, layers, seq, dp, tp, ac, cuda_norm=True, reshard=policy)
        ours = run_ours(model, dp, tp, ac, reshard=policy)
        print(f"case {case}: torchtitan fsdp_reshard_after_forward={policy!r} with its RMSNorm as on CUDA; ours "
              f"{ours['layout']}" + (", reshard_after_forward='always'" if policy == "always" else ""))
        compare(case, ours, tt)
        rope, tables = layers * seq * model.hd // 2 * 8, 2 * seq * model.hd * 2
        got = ours["peak"]["total"] - tt["peak"]["total"]
        print(f"explained {case} total: ours - torchtitan = {mib(got)}; predicted {mib(tables - rope)} (the same "
              f"bytes but torchtitan's RoPE caches, {mib(rope)}, and our RoPE tables, {mib(tables)})")
        if policy == "never":
            fixed = run_torchtitan(flavor, layers, seq, dp, tp, ac, cuda_norm=True, reshard=policy, refile=True)
            for c in ("parameters", "activations"):
                a, b = ours["peak"][c], fixed["peak"][c]
                print(f"memory_refiled {case} {c}: ours {a / GIB:.3f} GiB, torchtitan with FSDP2's unsharded "
                      f"parameters filed as parameters {b / GIB:.3f} GiB, torchtitan/ours {_ratio(a, b)}")
            emb = model.vocab * model.hidden * 2
            got = tt["peak"]["activations"] - fixed["peak"]["activations"]
            print(f"explained {case} activations: torchtitan as measured - refiled = {mib(got)}; predicted "
                  f"{mib(emb)} (the embedding's unsharded BF16 weight, V x h x 2, filed under activations: "
                  f"LEAF_UNIT)")
        sys.stdout.flush()


def main() -> int:
    missing = torchtitan_available()
    if missing is not None:
        print(f"torchtitan: not installed ({type(missing).__name__}: {missing}); this benchmark compares it with the "
              f"fake world only where it is. To run it: {INSTALL}")
        return 0
    import torch
    import torchtitan

    print(f"torchtitan_version: {getattr(torchtitan, '__version__', '?')} (torch {torch.__version__})")
    for what, why in NOT_RUN.items():
        print(f"torchtitan_not_run {what}: {why}")
    seq = 8192
    cases = [("8B", 4, 8, 1, "none"), ("8B", 4, 8, 1, "full"), ("8B", 4, 8, 1, "selective"),
             ("8B", 4, 4, 2, "none"), ("8B", 4, 4, 2, "full")]
    if "--quick" in sys.argv:
        cases = cases[:2]
    elif "--no-70b" not in sys.argv:
        cases += [("70B", 2, 8, 1, "full"), ("70B", 2, 4, 2, "full")]
    for flavor, layers, dp, tp, ac in cases:
        mc = tt_config(flavor, layers)
        model = our_model(mc, f"Llama 3.1 {flavor} (torchtitan's args, {layers} layers)", seq)
        case = f"{flavor} L{layers} s{seq} DP{dp}" + (f" TP{tp}" if tp > 1 else "") + f" AC-{ac}"
        tt = run_torchtitan(flavor, layers, seq, dp, tp, ac)
        tt_cuda = run_torchtitan(flavor, layers, seq, dp, tp, ac, cuda_norm=True)
        ours = run_ours(model, dp, tp, ac)
        print(f"case {case}: hidden {model.hidden}, heads {model.heads}/{model.kv}, ffn {model.ffn}, vocab "
              f"{model.vocab}, {layers} layers, seq {seq}, micro-batch 1; ours {ours['layout']}; torchtitan "
              f"FSDP units: {', '.join(tt['fsdp_units'])}")
        compare(case, ours, tt)
        for c in ("activations", "total"):
            a, b = ours["peak"][c], tt_cuda["peak"][c]
            print(f"memory_cuda_norm {case} {c}: ours {a / GIB:.3f} GiB, torchtitan with its RMSNorm keeping what the "
                  f"CUDA kernel keeps {b / GIB:.3f} GiB, torchtitan/ours {_ratio(a, b)}")
        explain(case, model, seq, dp, tp, ac, ours, tt, tt_cuda)
        sys.stdout.flush()
    if "--quick" not in sys.argv:
        reshard_policies(seq)
    print_saved(saved_per_block("8B", seq))
    for i, line in enumerate(DIFFERENCES, 1):
        print(f"difference {i}: {line}")
    print(f"defect_ours memtracker_class (helpers/fake_world/step.py): {LEAF_UNIT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
