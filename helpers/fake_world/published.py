"""The fake world beside memory measured on real clusters (issue 26; ``data/published/memory.csv``).

:func:`match` turns each published point (:func:`helpers.published.memory_points`) into the fake
world's nearest configuration, a :class:`~helpers.fake_world.cases.Case`, and says what of the
published recipe the trace does not do. A point is

* ``exact`` when the trace does everything the run did that moves memory: the same model, degrees,
  local batch, sequence, recomputation (none, full, per-op or per-layer selective), BF16/FP32
  precision policy, AdamW implementation (foreach, fused, per parameter) and FP32-upcast loss,
  eager (:func:`recipe`);
* ``nearest`` when the trace runs the same model, degrees, batch and sequence but the run also used
  something the trace cannot do (``differences``: torch.compile, Float8 linears, async TP), or
  the source leaves part of the recipe unstated and the trace assumes torchtitan's default (the
  selective kind, the optimizer's implementation), each of which changes the measured figure;
* ``refused`` when no trace stands for it (``reason``): a sequence the source does not state, a
  recomputation the fake world refuses (its own error message), HSDP.

The published figures are, as far as their sources say, the caching allocator's peak *reserved*
bytes (torchtitan logs ``max_reserved``; the CSV's ``measures`` column, or ``measures_inferred``
where the source does not say). The fake world reports both peaks: *allocated* (the live tensors,
``FakeStep.memory``) and *reserved* (those allocations replayed through the caching allocator's
rules, ``FakeStep.peak_reserved``, :mod:`helpers.fake_world.allocator`). :func:`compare` runs the
matched traces and sets each published figure beside the fake figure that measures the same thing
(:data:`COMPARED`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..case_studies import llama3_model
from ..planner import Layout, Model, Rules, h100_cluster
from . import uneven_stages
from .cases import Case
from .timing import FLOAT8_ALL_GATHER, stages_per_rank

GIB = 2**30


def llama31(name: str, seq_len: int) -> Model:
    """Llama 3.1's 8B and 70B (Meta's published ``config.json``: layers, hidden size, heads, KV heads,
    the SwiGLU width, vocabulary 128,256, untied embeddings), and 405B from ``data/configs``."""
    if name == "llama3.1_405b":
        return llama3_model(seq_len)
    dims = {"llama3.1_8b": (32, 4096, 32, 14336), "llama3.1_70b": (80, 8192, 64, 28672)}
    if name not in dims:
        raise ValueError(f"no model named {name!r}: known are {sorted(dims) + ['llama3.1_405b']}")
    layers, hidden, heads, ffn = dims[name]
    return Model(name, layers=layers, hidden=hidden, heads=heads, kv_heads=8, ffn=ffn, mlp_matrices=3,
                 seq_len=seq_len, vocab=128256)


# what a run did that the trace does not, by the word its row uses, and which way it moves memory
NOT_TRACED = {
    "torch.compile": "torch.compile (fused kernels free intermediates early: lower than eager, 77.0 vs "
                     "82.4 GiB in torchtitan's own Table 1)",
    "Float8": "Float8 linears (torchao: FP8 copies of weights and activations for the matmuls)",
    "async TP": "async TP (micro-pipelined all-gather + matmul: its own buffers)",
}
RECOMPUTE = {"none": "none", "full": "full", "selective-op": "selective", "selective": "selective"}
# a source that says "selective" without its kind: traced per op, torchtitan's default selective_ac_option
SELECTIVE_KIND_UNSTATED = ("selective activation checkpointing of an unstated kind (traced per op: torchtitan's "
                           "default selective_ac_option 'op')")
OPTIMIZER_UNSTATED = ("AdamW's implementation unstated (traced foreach: torchtitan's default until 2025; fused "
                      "holds less, per-parameter more in its step)")


def _with_all_gather(word: str, text: str, how: str) -> str:
    """A difference's text; Float8 linears' names FSDP2's float8 all-gather of the weights, and its
    effect, where the run's row mentions it (inside the parenthesis: the lists that print a
    difference's first words print the same)."""
    if word != "Float8" or "float8 all-gather" not in how:
        return text
    return f"{text[:-1]}; if on, {FLOAT8_ALL_GATHER})"


def recipe(lay) -> tuple[dict, tuple]:
    """The publication's recipe as :func:`helpers.fake_world.simulate`'s options, and what of it is
    guessed (texts for ``Match.differences``), from the CSV's ``recompute``, ``optimizer`` and
    ``precision`` columns: per-layer selective checkpointing (``selective-layer-<k>``:
    ``checkpoint_every=k``; ``selective-op``: per op, without); AdamW's implementation (the
    first of the words ``fused``, ``foreach`` or ``for-loop`` the column names); the gradient reduction's dtype (``fp32 reduce`` /
    ``bf16 reduce``). The loss is always computed on FP32-upcast logits, as torchtitan does."""
    from ..published import SELECTIVE_LAYER

    opts, guessed = {"loss_dtype": "float32"}, []
    k = SELECTIVE_LAYER.fullmatch(lay.recompute or "")
    if k:
        opts["checkpoint_every"] = int(k.group(1))
    elif lay.recompute == "selective":
        guessed.append(SELECTIVE_KIND_UNSTATED)
    text = (lay.optimizer or "").lower()
    named = sorted((text.find(word), word) for word in ("fused", "foreach", "for-loop") if word in text)
    if named:  # the first named ("AdamW, foreach (fused off by default)" is foreach)
        opts["optimizer"] = named[0][1]
    else:
        opts["optimizer"] = "foreach"
        guessed.append(OPTIMIZER_UNSTATED)
    precision = (lay.precision or "").lower()
    if "bf16 reduce" in precision:
        opts["reduce_dtype"] = "bfloat16"
    elif "fp32 reduce" in precision:
        opts["reduce_dtype"] = "float32"
    return opts, tuple(guessed)


# what a published point measures -> the fake figure it is compared with. "active" (allocated plus
# blocks freed while another stream still uses them) is allocated with one stream; nvidia-smi's
# figure adds the CUDA context and NCCL's buffers to the reserve: reserved is the nearest, and low
COMPARED = {"allocated": "allocated", "active": "allocated", "reserved": "reserved", "nvidia-smi": "reserved",
            "unstated": "reserved"}


def measures(point) -> str:
    """What ``point`` measures: its source's word, else what the logging code of that version
    records (``measures_inferred``), else "unstated"."""
    return point.measures if point.measures != "unstated" else point.measures_inferred


@dataclass(frozen=True)
class Match:
    """One published point and the fake world's nearest trace of it (module docstring)."""
    point: object
    kind: str  # "exact", "nearest" or "refused"
    case: Case | None
    differences: tuple = ()
    reason: str = ""


def _layout(point) -> tuple[Layout | None, str]:
    lay = point.layout
    if lay.seq_len is None:
        return None, "the source states no sequence length"
    if lay.dp_replicate not in (1, None):
        return None, f"HSDP (dp_replicate={lay.dp_replicate}) is not built in the fake world"
    degrees = {k: getattr(lay, k) for k in ("dp_shard", "tp", "pp", "cp", "local_batch")}
    missing = [k for k, v in degrees.items() if v is None]
    if missing:
        return None, f"the source leaves {', '.join(missing)} unstated"
    if lay.pp > 1 and lay.micro_batches is None:
        return None, ("the source leaves the pipeline's micro-batch count unstated (at 1F1B's peak stage 0 holds "
                      "PP micro-batches: their size sets the activations)")
    v = stages_per_rank(lay.pp_schedule)  # interleaved 1F1B: its stages per rank, or why there are none
    if isinstance(v, str):
        return None, v
    from ..published import SELECTIVE_LAYER

    recompute = "selective" if SELECTIVE_LAYER.fullmatch(lay.recompute or "") else RECOMPUTE.get(lay.recompute)
    if recompute is None:
        return None, f"recompute {lay.recompute!r} has no counterpart in the fake world"
    # torchtitan: FSDP (ZeRO-3) over dp_shard; the local batch is one micro-batch without a pipeline, and
    # split into the stated micro-batches with one
    if lay.pp > 1 and lay.local_batch % lay.micro_batches:
        return None, f"{lay.micro_batches} micro-batches do not divide the local batch {lay.local_batch}"
    mb = lay.local_batch // lay.micro_batches if lay.pp > 1 else lay.local_batch
    try:
        layout = Layout(dp=lay.dp_shard, tp=lay.tp, pp=lay.pp, cp=lay.cp, zero=3, micro_batch=mb, v=v,
                        recompute=recompute, sequence_parallel=lay.tp > 1)
    except ValueError as e:
        return None, f"the planner's Layout refuses it: {e}"
    return layout, ""


def match(points=None) -> list[Match]:
    """Every published memory point with its nearest trace (module docstring)."""
    from .. import published
    from . import check

    out = []
    for p in published.memory_points() if points is None else points:
        layout, why = _layout(p)
        if layout is None:
            out.append(Match(p, "refused", None, reason=why))
            continue
        model = llama31(p.layout.model, p.layout.seq_len)
        # a pipeline that does not divide the layers: Llama 3's split, one layer fewer on the first and the
        # last stage, which hold the embedding and the head (the sources name no split points; 126 over 8)
        n = layout.pp * layout.v  # (virtual) stages
        stages = uneven_stages(model.layers, n) if model.layers % n else None
        opts, guessed = recipe(p.layout)
        try:
            check(model, layout, None, stages, opts.get("checkpoint_every"))
        except ValueError as e:  # the fake world's own refusal, by name
            out.append(Match(p, "refused", None, reason=f"the fake world refuses it: {e}"))
            continue
        how = f"{p.layout.precision}; {p.layout.other}; {p.layout.pp_schedule}"
        differences = tuple(_with_all_gather(word, text, how) for word, text in NOT_TRACED.items() if word in how)
        differences += guessed
        m = p.layout.micro_batches if layout.pp > 1 else 1
        sim = {"micro_batches": m, "trace_layers": 2, **opts, **({"stages": stages} if stages else {})}
        case = Case("published", p.id, model, layout, h100_cluster(layout.devices),
                    layout.dp * layout.micro_batch * m, Rules(dropout=False), sim)
        out.append(Match(p, "nearest" if differences else "exact", case, differences))
    return out


def compare(matches=None) -> list[dict]:
    """The traced peaks beside each published figure, for every point that is not refused: fake
    allocated (the live tensors' bytes, ``FakeStep.memory``) and reserved (the caching allocator's
    segments, ``FakeStep.peak_reserved``), what the point measures, and ``ratio``: the fake figure
    that measures the same (:data:`COMPARED`) over the published one."""
    rows = []
    for mt in match() if matches is None else matches:
        if mt.case is None:
            continue
        step = mt.case.simulate()
        what = measures(mt.point)
        fake = {"allocated": step.peak_bytes, "reserved": step.peak_reserved}
        compared = COMPARED[what]
        rows.append({"id": mt.point.id, "kind": mt.kind, "published GiB": mt.point.value_gib, "measures": what,
                     "compared": compared, "fake allocated GiB": fake["allocated"] / GIB,
                     "fake reserved GiB": fake["reserved"] / GIB, "fake GiB": fake[compared] / GIB,
                     "ratio": fake[compared] / GIB / mt.point.value_gib, "differences": mt.differences})
    return rows
