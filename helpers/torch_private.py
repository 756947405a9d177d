"""torch's private APIs, behind one door (issue 24, point 3).

The workbook runs PyTorch's own parallelism on a fake world, measures it with ``MemTracker`` and
``FlopCounterMode``, and records its collectives: that reaches into modules and attributes whose
names start with an underscore, which torch may move or drop in any release. Every such reach-in
of ``helpers/`` goes through this module, pinned to torch :data:`PINNED_TORCH`; when an upgrade
moves one, this is the one file to update.

* :data:`API` is the table: each :class:`Private` entry names a public name, where the thing lives
  in torch 2.13 (``module:attribute``), what it is and who uses it. ``from .torch_private import
  MemTracker`` looks the entry up then (the module itself imports no torch, so importing
  ``helpers`` stays cheap and the torch-free modules stay torch-free), and a lookup that fails
  raises :class:`MissingPrivateAPI` naming exactly what moved, the installed torch and this file.
* The functions below wrap what is done *to* torch's private state (writes, private methods).
* :func:`probe` looks up every entry and returns what is missing (``./workbook doctor`` prints it;
  ``tests/test_torch_private.py`` checks each entry on the pinned torch).

The subclasses of ``MemTracker`` and ``_FlopCounterMode`` in :mod:`helpers.fake_world.step` override and
call private methods of their bases: those methods are listed here under their class (``members``)
so that the probe and the tests name them when they move.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

PINNED_TORCH = "2.13.0"  # requirements.txt pins torch==2.13.0
DOOR = "helpers/torch_private.py"
FUNCTIONAL_NAMESPACE = "_c10d_functional"  # the op namespace of torch's functional collectives (torch.ops)
DYNAMO_MODULE = "torch._dynamo"  # what the first op under a TorchDispatchMode imports (helpers.launcher.pool preloads it)


@dataclass(frozen=True)
class Private:
    """One private thing of torch: ``name`` here, ``where`` it lives (``module:attr.attr``; a module
    alone when there is no ``:``), what it is, who uses it, and the ``members`` its users rely on."""

    name: str
    where: str
    what: str
    users: str
    members: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        """The dotted path, as one would write it in Python."""
        return self.where.replace(":", ".")


_MEM = "torch.distributed._tools.mem_tracker"
_PYTREE = "torch.utils._pytree"
_TENSOR = "torch.distributed.tensor"

API: tuple[Private, ...] = (
    # ---- the fake world: a fake process group, DTensor's caches -------------------------------------
    Private("FakeStore", "torch.testing._internal.distributed.fake_pg:FakeStore",
            "the store of the 'fake' process-group backend: one process plays one rank of any world",
            "fake_world.fake_world"),
    Private("clear_sharding_prop_cache", f"{_TENSOR}.debug:_clear_sharding_prop_cache",
            "clears DTensor's cache of sharding decisions", "clear_dtensor_caches (fake_world)"),
    Private("propagate_tensor_meta_cached",
            f"{_TENSOR}:DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached",
            "DTensor's lru-cached shape propagation (its cache_clear)", "clear_dtensor_caches (fake_world)"),
    Private("gen_transform_infos", f"{_TENSOR}._redistribute:_gen_transform_infos",
            "DTensor's lru-cached redistribution plans (its cache_clear)", "clear_dtensor_caches (fake_world)"),
    Private("MeshTopoInfo", f"{_TENSOR}._collective_utils:MeshTopoInfo",
            "DTensor's mesh topology, cached per mesh (build_from_mesh.cache_clear)",
            "clear_dtensor_caches (fake_world)", ("build_from_mesh",)),
    Private("ShardingPropagator", f"{_TENSOR}._sharding_prop:ShardingPropagator",
            "DTensor's sharding propagation; _fake_mode_lock is the lock its shape propagation runs in",
            "swap_propagation_lock (fake_step.measured_step)", ("_fake_mode_lock",)),
    # ---- the fake step: PyTorch's parallelism APIs that are still private ----------------------------
    Private("checkpoint_wrapper", "torch.distributed.algorithms._checkpoint.checkpoint_wrapper:checkpoint_wrapper",
            "activation checkpointing of one module", "fake_step.build"),
    Private("replicate", "torch.distributed._composable.replicate_with_fsdp:replicate",
            "DDP on FSDP2's machinery (ZeRO-0)", "fake_step.build"),
    Private("DeviceMesh", "torch.distributed.device_mesh:DeviceMesh",
            "the device mesh; _flatten merges dims into one (DP x CP)", "flatten_mesh (fake_step.make_mesh)",
            ("_flatten",)),
    Private("all_gather_single_autograd", "torch.distributed._functional_collectives:all_gather_single_autograd",
            "a differentiable all-gather (backward: reduce-scatter), for context parallelism",
            "llama_model (Attention.forward)"),
    # ---- measuring: MemTracker, FlopCounterMode, fake tensors, dispatch ------------------------------
    Private("MemTracker", f"{_MEM}:MemTracker", "memory by category, per module and peak",
            "recompute.peak_bytes, fake_step.memtracker_class (subclassed: overrides and calls these members)",
            ("_pre_fw_hook", "_update_peak_stats", "_track", "reset_mod_stats", "track_external",
             "get_tracker_snapshot", "_update_snap", "_update_and_maybe_create_winfos")),
    Private("UpdateType", f"{_MEM}:_UpdateType", "the kinds of change MemTracker's _update_snap applies",
            "fake_step.memtracker_class", ("ADD", "SIZE", "REF")),
    Private("TOTAL_KEY", f"{_MEM}:_TOTAL_KEY", "the key of a snapshot's total ('Total')", "fake_step.memtracker_class"),
    Private("MemRefType", f"{_MEM}:_MemRefType", "the categories MemTracker counts a tensor under",
            "fake_step.memtracker_class", ("OPT", "TEMP", "ACT", "GRAD", "PARAM")),
    Private("ModState", f"{_MEM}:_ModState", "the per-module states MemTracker keeps peaks for",
            "fake_step.memtracker_class", ("PEAK_FW", "PEAK_BW")),
    Private("FlopCounterDispatchMode", "torch.utils.flop_counter:_FlopCounterMode",
            "the dispatch mode behind FlopCounterMode", "fake_step.flop_counter (subclassed)",
            ("_handle_higher_order_ops",)),
    Private("count_flops", "torch.utils.flop_counter:FlopCounterMode._count_flops",
            "FlopCounterMode's count of one op", "fake_step.flop_counter"),
    Private("sdpa_flash_cpu", "torch:ops.aten._scaled_dot_product_flash_attention_for_cpu",
            "the CPU attention kernel (FLOPs; saved by per-op checkpointing)",
            "fake_step.flop_counter, recipes.sac_save_ops"),
    Private("sdpa_flash_cpu_backward", "torch:ops.aten._scaled_dot_product_flash_attention_for_cpu_backward",
            "the CPU attention kernel's backward (FLOPs)", "fake_step.flop_counter"),
    Private("HigherOrderOperator", "torch._ops:HigherOrderOperator", "the class of higher-order ops",
            "fake_step.flop_counter"),
    Private("TorchDispatchMode", "torch.utils._python_dispatch:TorchDispatchMode",
            "the base of every Python dispatch mode; _should_skip_dynamo is overridden by fake_step's modes",
            "commlog (the recorder), fake_step (via MemTracker, _FlopCounterMode)", ("_should_skip_dynamo",)),
    Private("active_fake_mode", "torch._guards:active_fake_mode", "the FakeTensorMode active now, or None",
            "fake_step.memtracker_class"),
    Private("FakeTensor", "torch._subclasses.fake_tensor:FakeTensor", "a tensor without storage",
            "fake_step.memtracker_class"),
    Private("FakeTensorMode", "torch._subclasses.fake_tensor:FakeTensorMode", "the mode that makes tensors fake",
            "fake_step.measured_step"),
    # torch.utils._pytree: mapping over, flattening and rebuilding nested containers of tensors
    Private("tree_map_only", f"{_PYTREE}:tree_map_only", "maps over leaves of a type", "fake_step.memtracker_class"),
    Private("tree_flatten", f"{_PYTREE}:tree_flatten", "leaves and spec", "fake_step._collective_on_copies"),
    Private("tree_unflatten", f"{_PYTREE}:tree_unflatten", "from leaves and spec", "fake_step._collective_on_copies"),
    # ---- collectives: functional ops, process groups, FSDP and DDP internals -------------------------
    Private("wait_tensor", f"torch:ops.{FUNCTIONAL_NAMESPACE}.wait_tensor.default",
            "the wait of a functional collective", "fake_step (memtracker_class, _collective_on_copies)"),
    Private("resolve_process_group", "torch.distributed.distributed_c10d:_resolve_process_group",
            "a process group from its name (what functional collectives receive)", "commlog._find_group"),
    Private("FSDPModule", "torch.distributed.fsdp:FSDPModule",
            "a module wrapped by fully_shard; _set_unshard_async_op makes its all-gathers asynchronous",
            "set_unshard_async_op (layer_overlap), fsdp_gradient_buffers (fake_step)",
            ("_set_unshard_async_op", "_get_fsdp_state")),
    Private("FSDPState", "torch.distributed.fsdp._fully_shard._fsdp_state:FSDPState",
            "a fully_shard module's state; _fsdp_param_groups (an instance's) holds its units",
            "fsdp_gradient_buffers (fake_step)"),
    Private("FSDPParamGroup", "torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup",
            "one fully_shard unit: fsdp_params (an instance's) and _partial_reduce_output, replicate's "
            "accumulated gradient", "fsdp_gradient_buffers (fake_step)", ("post_backward",)),
    Private("FSDPParam", "torch.distributed.fsdp._fully_shard._fsdp_param:FSDPParam",
            "one parameter of a unit: unsharded_accumulated_grad is the FP32 gradient accumulated over "
            "micro-batches without a reduction (ZeRO-1)", "fsdp_gradient_buffers (fake_step)",
            ("to_accumulated_grad_if_needed",)),
    Private("DistributedDataParallel", "torch.nn.parallel:DistributedDataParallel",
            "DDP; _get_ddp_logging_data reports its buckets", "ddp_logging_data (overlap.bucket_worker)",
            ("_get_ddp_logging_data",)),
    Private("Adam", "torch.optim:Adam", "Adam (AdamW's base); _init_group makes a parameter's state as its first "
            "step does", "adam_init_state (fake_step.StageParts.materialize)", ("_init_group",)),
    Private("dynamo", DYNAMO_MODULE, "torch.compile's frontend, imported by the first op under a dispatch mode",
            "pool (preloaded by the forkserver)"),
)
_BY_NAME = {p.name: p for p in API}


class MissingPrivateAPI(ImportError):
    """A private torch API this workbook uses is not where torch 2.13 has it."""


def _torch_version() -> str:
    try:
        import torch
    except Exception as exc:  # the message is about what moved; say why torch itself is absent
        return f"(torch not importable: {type(exc).__name__})"
    return torch.__version__


def missing(path: str, reason: str = "") -> MissingPrivateAPI:
    """The error for ``path`` being gone, naming the installed torch, the pin and this file."""
    why = f" ({reason})" if reason else ""
    return MissingPrivateAPI(
        f"torch {_torch_version()}: {path} is gone{why} (this workbook is pinned to torch {PINNED_TORCH}; "
        f"{DOOR} is the one file to update)")


def _resolve(entry: Private):
    module, _, attrs = entry.where.partition(":")
    if not attrs:  # a module: found, not imported (torch._dynamo costs seconds)
        if importlib.util.find_spec(module) is None:
            raise missing(entry.path)
        return module
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        raise missing(entry.path, f"{type(exc).__name__}: {exc}") from exc
    walked = module
    for attr in attrs.split("."):
        walked += "." + attr
        try:
            obj = getattr(obj, attr)
        except AttributeError as exc:
            raise missing(walked, "" if walked == entry.path else f"needed for {entry.path}") from exc
    return obj


def get(name: str):
    """The torch object of the entry ``name`` of :data:`API`, looked up now (an import already done
    is a dictionary lookup); :class:`MissingPrivateAPI` when torch has moved it."""
    return _resolve(_BY_NAME[name])


def __getattr__(name: str):  # ``from .torch_private import MemTracker``: the entry, looked up now
    if name in _BY_NAME:
        return get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check(entry: Private) -> list[str]:
    """What of ``entry`` (itself, then each member) is missing: ``[]`` when all is there."""
    try:
        obj = _resolve(entry)
    except MissingPrivateAPI as exc:
        return [f"{entry.path}: {exc}"]
    return [f"{entry.path}.{m}" for m in entry.members if not hasattr(obj, m)]


# the attributes MemTracker's instances hold (fake_step's subclass reads and writes them); the last
# one is set when the tracker is entered
MEMTRACKER_STATE = ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_mod_tracker", "_in_opt", "_in_ac",
                    "memory_tracking", "_fake_mode_on_entry")


def _check_memtracker_state() -> list[str]:
    tracker = get("MemTracker")()
    with tracker:
        gone = [a for a in MEMTRACKER_STATE if not hasattr(tracker, a)]
        if not hasattr(getattr(tracker, "memory_tracking", None), "data"):  # fake_step reads the weak dict's
            gone.append("memory_tracking.data")
    return [f"{_MEM}.MemTracker.{a} (an instance's)" for a in gone]


def probe() -> list[str]:
    """Look up every private API of :data:`API` (and the members and instance state its users rely
    on); the list of what is missing, ``[]`` when all is present. Imports torch."""
    gone = [line for entry in API for line in _check(entry)]
    if not any(line.startswith(f"{_MEM}.MemTracker:") for line in gone):
        gone += _check_memtracker_state()
    return gone


def verdict() -> str:
    """One line for ``./workbook doctor``: all present, or which are missing."""
    gone = probe()
    if not gone:
        return f"torch private APIs: all {len(API)} present"
    names = "; ".join(line.split(":")[0] for line in gone)
    return f"torch private APIs: {len(gone)} missing (update {DOOR}): {names}"


# ---- what is done to torch's private state -------------------------------------------------------

def _member(obj, entry: str, attr: str):
    """``obj.attr``, a private member listed under the entry ``entry``; :class:`MissingPrivateAPI` if gone."""
    try:
        return getattr(obj, attr)
    except AttributeError as exc:
        raise missing(f"{_BY_NAME[entry].path}.{attr}") from exc


def restart_peak(tracker) -> None:
    """Start ``tracker``'s (a ``MemTracker``) peak afresh from what it holds now, as
    ``MemTracker.__enter__`` does with its private ``_peak_mem_snap`` and ``_peak_mem``
    (fake_step measures each phase's peak on its own)."""
    for attr in ("_peak_mem_snap", "_peak_mem"):  # written, not read: a renamed one would be created silently
        _member(tracker, "MemTracker", attr)
    tracker._peak_mem_snap = tracker.get_tracker_snapshot("current")
    tracker._peak_mem = {dev: d["Total"] for dev, d in tracker._peak_mem_snap.items()}


def swap_propagation_lock(lock):
    """Put ``lock`` in place of ``ShardingPropagator._fake_mode_lock`` (the lock DTensor's shape
    propagation runs in) and return the one it replaces (fake_step.measured_step)."""
    cls = get("ShardingPropagator")
    old = _member(cls, "ShardingPropagator", "_fake_mode_lock")
    cls._fake_mode_lock = lock
    return old


def clear_dtensor_caches() -> None:
    """Clear DTensor's caches of sharding decisions, shape propagation, redistribution plans and
    mesh topology (fake_world: a cached entry from a destroyed world names its dead groups)."""
    get("clear_sharding_prop_cache")()
    get("propagate_tensor_meta_cached").cache_clear()
    get("gen_transform_infos").cache_clear()
    _member(get("MeshTopoInfo"), "MeshTopoInfo", "build_from_mesh").cache_clear()


def flatten_mesh(mesh, name: str):
    """``DeviceMesh._flatten``: the dims of ``mesh`` (a slice of a mesh) as one dim ``name`` (fake_step)."""
    return _member(mesh, "DeviceMesh", "_flatten")(name)


def set_unshard_async_op(module, async_op: bool) -> None:
    """``FSDPModule._set_unshard_async_op``: all-gathers return a Work, waited in pre-forward (layer_overlap)."""
    _member(module, "FSDPModule", "_set_unshard_async_op")(async_op)


def _fsdp_param_groups(module):
    """Every FSDP2 unit (``FSDPParamGroup``) of the ``fully_shard`` / ``replicate`` modules in ``module``."""
    FSDPModule = get("FSDPModule")
    for mod in module.modules():
        if isinstance(mod, FSDPModule):
            state = _member(mod, "FSDPModule", "_get_fsdp_state")()
            yield from _member(state, "FSDPState", "_fsdp_param_groups")


def fsdp_gradient_buffers(module) -> list:
    """Every gradient buffer FSDP2 holds for the ``fully_shard`` / ``replicate`` units in ``module``
    besides the parameters' ``.grad``: each parameter's FP32 gradient accumulated over micro-batches
    without a reduction (``FSDPParam.unsharded_accumulated_grad``), the unsharded parameter's own
    ``.grad``, and replicate's gradient accumulated after its reduction (``_partial_reduce_output``)
    (fake_step files them under gradients)."""
    out = []
    for group in _fsdp_param_groups(module):
        for fp in _member(group, "FSDPParamGroup", "fsdp_params"):
            out.append(_member(fp, "FSDPParam", "unsharded_accumulated_grad"))
            unsharded = getattr(fp, "_unsharded_param", None)  # absent until the first all-gather
            out.append(None if unsharded is None else unsharded.grad)
        out.append(_member(group, "FSDPParamGroup", "_partial_reduce_output"))
    return [t for t in out if t is not None]


def fsdp_unsharded_params(module) -> list:
    """FSDP2's unsharded (gathered) parameter of every parameter of the units in ``module``
    (``FSDPParam._unsharded_param``, absent until its first all-gather; its storage resized to 0
    while resharded) (fake_step files them under parameters)."""
    out = []
    for group in _fsdp_param_groups(module):
        for fp in _member(group, "FSDPParamGroup", "fsdp_params"):
            unsharded = getattr(fp, "_unsharded_param", None)
            if unsharded is not None:
                out.append(unsharded)
    return out


def adam_init_state(opt) -> None:
    """Give every parameter of ``opt`` (an Adam or AdamW, each parameter with a gradient) the state
    its first step would make (``step``, ``exp_avg``, ``exp_avg_sq``, and ``max_exp_avg_sq`` with
    amsgrad; same shapes, dtypes and devices), through ``Adam._init_group``, the code that step
    runs first, without the step's arithmetic (fake_step: under fake tensors that arithmetic, a
    DTensor op at a time, cost 0.2 s of a 70B trace's 1.3 s). ``step`` is 0, as before a first step."""
    init = _member(opt, "Adam", "_init_group")
    for group in opt.param_groups:
        init(group, [], [], [], [], [], [])


def ddp_logging_data(ddp) -> dict:
    """``DistributedDataParallel._get_ddp_logging_data()``: its bucket sizes, among others (overlap)."""
    return _member(ddp, "DistributedDataParallel", "_get_ddp_logging_data")()
