"""The chapters' headline configurations, run on a fake world beside the planner (12.1.1, 12.1.2,
12.2.1, 12.3.1, 12.3.2, 12.4.1, 12.4.2, P.11).

Each :class:`Case` is one configuration of a section: a planner :class:`~helpers.planner.Model`,
a :class:`~helpers.planner.Layout`, the cluster and global batch the planner needs, and how to
trace it (:func:`helpers.fake_world.simulate` arguments). :func:`memory_rows` sets the planner's
per-device memory beside what PyTorch's code holds at its peak; :func:`check_layouts` runs layouts of
a plan's ranking on the fake world and says whether PyTorch's peak fits the device (12.4.1, 12.4.2).

Two planner figures are shown: with the chapters' activation formula (Korthikanti et al.'s GPT-3
inventory and Megatron's sequence parallelism) and told PyTorch's recipe (:data:`PYTORCH`):
the model's own shapes and what PyTorch's ``SequenceParallel`` keeps (see
:data:`helpers.planner.ACTIVATION_MODELS`), FSDP2's model state at the step's peak and the loss on
FP32 logits (:func:`helpers.planner.assess.fsdp2_memory`), and the fake world's pipeline stages.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..case_studies import LLAMA_RULES, llama3_model
from ..memory import GB
from ..planner import Cluster, Layout, Model, Rules, assess, book_70b, book_100b, h100_cluster, p11_40b, p11_cluster
from . import simulate, uneven_stages

# the planner told PyTorch's recipe: the model's own shapes and SequenceParallel's kept inputs
# (activation_model), FSDP2's model state and peak and the FP32-upcast loss (memory_model)
PYTORCH = {"activation_model": "pytorch", "memory_model": "fsdp2"}


def book_7_5b() -> Model:
    """12.1.1/12.1.2's 7.5B model (the ZeRO paper's example). The chapters give only the size: we
    take GPT-style layers of h 4096 (32 heads, 4h GeLU MLP), 37 of them (12 L h^2 = 7.45e9), no
    vocabulary, sequences of 1024."""
    return Model("7.5B (12.1.1, shapes assumed)", layers=37, hidden=4096, heads=32, ffn=16384, seq_len=1024)


def book_13b() -> Model:
    """12.3.1's 13B example: 40 layers of h 5120 (40 heads of 128), 4h GeLU MLP, s 4096."""
    return Model("13B (12.3.1)", layers=40, hidden=5120, heads=40, ffn=20480, seq_len=4096)


@dataclass(frozen=True)
class Case:
    """One configuration of a section: what the planner is asked and how the fake world traces it."""

    section: str
    title: str
    model: Model
    layout: Layout
    cluster: Cluster
    global_batch: int
    rules: Rules = Rules()
    sim: dict = field(default_factory=dict)

    def planner(self, **rules) -> dict:
        """The planner's memory per device (bytes by part) with ``rules`` changed."""
        if rules.get("memory_model") == "fsdp2" and "stages" in self.sim:  # the stages the fake world traces
            rules = {"stage_layers": tuple(self.sim["stages"]), **rules}
        return assess(self.model, self.cluster, self.global_batch, self.layout, replace(self.rules, **rules)).memory

    def simulate(self, **overrides):

        kw = dict(self.sim)
        if "micro_batches" not in kw:
            kw["global_batch"] = self.global_batch
        kw.update(overrides)
        return simulate(self.model, self.layout, **kw)


def cases() -> dict:
    """The headline configurations of the issue's list, by key."""

    m75, nodrop = book_7_5b(), Rules(dropout=False)
    one = {"micro_batches": 1, "trace_layers": 2}
    out = [Case("12.1.1", "7.5B, naive DDP on 64 GPUs", m75, Layout(dp=64, zero=0), h100_cluster(64), 64, sim=one)]
    out += [Case("12.1.2", f"7.5B, ZeRO-{z} on 64 GPUs", m75, Layout(dp=64, zero=z), h100_cluster(64), 64, sim=one)
            for z in (1, 2, 3)]
    out.append(Case("12.2.1", "70B, TP 8 (s 2048, b 32)", book_70b(2048),
                    Layout(dp=1, tp=8, micro_batch=32, sequence_parallel=False), h100_cluster(8), 32, nodrop, one))
    for sp in (False, True):
        out.append(Case("12.3.1", f"13B, TP 8 {'with' if sp else 'without'} SP (s 4096, b 4)", book_13b(),
                        Layout(dp=1, tp=8, micro_batch=4, sequence_parallel=sp), h100_cluster(8), 4,
                        sim={**one, "dropout": True}))
    out.append(Case("12.3.2", "70B (64 KV heads, as drawn), 128K context, CP 8 x TP 8",
                    replace(book_70b(131072), kv_heads=64), Layout(dp=1, tp=8, cp=8), h100_cluster(64), 1, nodrop, one))
    out.append(Case("12.4.1", "70B on 256 H100s: TP 8, DP 32, ZeRO-1", book_70b(4096), Layout(dp=32, tp=8, zero=1),
                    h100_cluster(256), 2048, nodrop, {"trace_layers": 2}))
    out.append(Case("12.4.1", "100B on 512 H100s: TP 8, DP 64, ZeRO-1", book_100b(4096), Layout(dp=64, tp=8, zero=1),
                    h100_cluster(512), 2048, nodrop, {"trace_layers": 2}))
    st = {"stages": uneven_stages(126, 16), "trace_layers": 2}
    out.append(Case("12.4.2", "Llama 3 405B, 16,384 GPUs: TP 8, PP 16, DP 128 (8K)", llama3_model(8192),
                    Layout(dp=128, tp=8, pp=16, zero=2), h100_cluster(16384), 2048, LLAMA_RULES, st))
    out.append(Case("12.4.2", "Llama 3 405B, 16,384 GPUs: TP 8, CP 16, PP 16, DP 8 (128K)", llama3_model(131072),
                    Layout(dp=8, tp=8, pp=16, cp=16, zero=2), h100_cluster(16384), 128, LLAMA_RULES, st))
    out.append(Case("P.11", "40B on 16: DP 2, TP 4, PP 2, ZeRO-1, micro-batch 4", p11_40b(),
                    Layout(dp=2, tp=4, pp=2, zero=1, micro_batch=4), p11_cluster(), 64, sim={"trace_layers": 2}))
    keys = {}
    for c in out:
        keys[f"{c.section} {c.title}"] = c
    return keys


def memory_rows(case: Case, step) -> list:
    """Per-device memory, planner beside PyTorch (``step``: the case's FakeStep), in bytes:
    (quantity, planner with the chapters' formula, planner told PyTorch's recipe, fake world).
    The last row is what a GPU must have: PyTorch's caching allocator's peak reserve
    (``FakeStep.peak_reserved``, :mod:`helpers.fake_world.allocator`) beside the planner's total
    with its fixed allowance for the allocator and NCCL (``Cluster.reserve_bytes``)."""
    book, torch_ = case.planner(), case.planner(**PYTORCH)
    state = lambda m: m["weights"] + m["gradients"] + m["optimizer"]
    f = step.memory
    return [
        ("weights + gradients + optimizer at the peak", state(book), state(torch_),
         f["parameters"] + f["gradients"] + f["optimizer"]),
        ("activations", book["activations"], torch_["activations"], f["activations"]),
        ("temporaries (not modelled)", 0.0, 0.0, f["temporaries"] + f["other"]),
        ("peak per device", book["total"] - book["reserve"], torch_["total"] - torch_["reserve"], f["total"]),
        ("reserved (planner: + its fixed reserve)", book["total"], torch_["total"], step.peak_reserved),
    ]


def format_rows(rows, unit: float = GB) -> str:
    """A plain-text table of :func:`memory_rows` in GB with the ratio PyTorch / planner."""
    lines = [f"{'':44s} {'planner':>9s} {'(PyTorch recipe)':>17s} {'PyTorch':>9s} {'ratio':>6s}"]
    for q, a, b, f in rows:
        ratio = f"{f / b:6.2f}" if b else f"{'-':>6s}"
        lines.append(f"{q:44s} {a / unit:9.2f} {b / unit:17.2f} {f / unit:9.2f} {ratio}")
    return "\n".join(lines)


def check_layouts(p, layouts, keep: dict | None = None, **sim) -> list:
    """Each of ``layouts`` (of plan ``p``) run on the fake world: the planner's peak per device
    beside PyTorch's, and whether PyTorch's peak plus the cluster's reserve fits the device
    (12.4.1, 12.4.2: the planner's ranking checked with the memory PyTorch's code needs).
    ``keep``: a dict that receives each layout's :class:`~helpers.fake_world.FakeStep` (by layout),
    for a later look at the same traces (12.4.1 times them)."""
    if keep is not None and not isinstance(keep, dict):
        raise ValueError(f"keep must be a dict (or None), got {type(keep).__name__}")
    rows = []
    for lay in layouts:
        a = p.find(lay)
        case = Case("", "", p.model, lay, p.cluster, p.global_batch, p.rules, {"trace_layers": 2, **sim})
        step = case.simulate()
        if keep is not None:
            keep[lay] = step
        need = step.memory["total"] + p.cluster.reserve_bytes
        rows.append({"layout": lay.label(), "rank": p.rank_of(lay), "step s": a.step_s,
                     "planner GB": a.memory["total"] / GB, "PyTorch GB": need / GB,
                     "fits": need <= p.cluster.memory_bytes})
    return rows
