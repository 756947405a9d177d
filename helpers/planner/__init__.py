"""A layout planner for hybrid parallelism: which (DP, TP, PP, CP, EP, ZeRO, micro-batch) to use (12.4.1;
also P.11, P.15 and 12.4.2).

Given a model (:class:`Model`), a cluster (:class:`Cluster`) and a global batch (sequences per
optimizer step), :func:`plan` enumerates the layouts (:class:`Layout`), rejects those that break a
divisibility, placement or memory constraint, with the reason, and ranks the rest by an estimated
step time. :func:`explain` says why the chosen degrees are what they are; :func:`neighbours` shows
what changing one knob would cost. :func:`decision_sequence` follows P.15's questions in order and
:func:`rule_of_thumb` 12.4.1's recipe (TP first, then PP or ZeRO-3, then DP), so their answers can
be set beside the planner's.

The planner is four modules, each read in one sitting; import everything from here:

* :mod:`helpers.planner.specs`: the :class:`Model` and the :class:`Cluster` (and the chapters' examples);
* :mod:`helpers.planner.assess`: the :class:`Layout`, the constraints and the step-time model
  (:func:`assess`, :func:`step_time_breakdown`, :func:`stage_activation_bytes`);
* this module: enumerating, ranking, reporting and explaining (:func:`plan`, :func:`report`,
  :func:`explain`, :func:`neighbours`);
* :mod:`helpers.planner.recipes`: the chapters' recipes and worked examples.

Everything is an estimate with stated assumptions (efficiency, alpha, reserve); ranks between
layouts are what the model is for, not absolute seconds.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, replace

from ..memory import GB
from .assess import (
    ACTIVATION_MODELS,
    MEMORY_MODELS,
    RECOMPUTE,
    RECOMPUTE_POLICIES,
    Assessment,
    Layout,
    Rules,
    assess,
    stage_activation_bytes,
    step_time_breakdown,
)
from .recipes import book_12_4_1, book_p11, decision_sequence, rule_of_thumb
from .specs import (
    DATA,
    Cluster,
    Model,
    a100_cluster,
    book_70b,
    book_100b,
    book_175b,
    divisors,
    h100_cluster,
    hardware,
    p11_40b,
    p11_cluster,
)

__all__ = ["DATA", "ACTIVATION_MODELS", "MEMORY_MODELS", "RECOMPUTE", "RECOMPUTE_POLICIES", "Model", "Cluster", "hardware", "h100_cluster", "a100_cluster",
           "divisors", "book_70b", "book_100b", "book_175b", "p11_40b", "p11_cluster", "Layout", "Rules", "Assessment",
           "stage_activation_bytes", "assess", "step_time_breakdown", "Plan", "enumerate_layouts", "plan", "table", "report",
           "format_steps", "neighbours", "explain", "decision_sequence", "rule_of_thumb", "book_p11", "book_12_4_1",
           "WIDTH", "wrap"]

# Output lines longer than this wrap at the window's edge in JupyterLab, mid-word (issue 16).
WIDTH = 100


def wrap(text: str, indent: int = 2, width: int = WIDTH) -> str:
    """``text`` broken at spaces into lines of at most ``width`` characters, each continuation line
    indented ``indent`` spaces more than the first line. The one place the planner's sentences
    (:func:`explain`), steps (:func:`format_steps`) and rejection reasons (:func:`table`) are
    wrapped; notebooks printing a reason of their own use it too. A word longer than a line
    (a layout label, a number) stays whole; hyphenated words ("all-reduce") are not split."""
    lead = text[:len(text) - len(text.lstrip(" "))]
    return textwrap.fill(text, width, subsequent_indent=lead + " " * indent, break_long_words=False,
                         break_on_hyphens=False)


# ---- enumerating and ranking ---------------------------------------------------------------------------

@dataclass
class Plan:
    """Every layout considered: ``ranked`` (valid, fastest first) and ``rejected`` (with reasons)."""

    model: Model
    cluster: Cluster
    global_batch: int
    rules: Rules
    ranked: list
    rejected: list

    @property
    def best(self) -> Assessment:
        if not self.ranked:
            raise ValueError("no layout satisfies every constraint; see .rejected for the reasons")
        return self.ranked[0]

    def find(self, layout: Layout) -> Assessment:
        for a in self.ranked + self.rejected:
            if a.layout == layout:
                return a
        return assess(self.model, self.cluster, self.global_batch, layout, self.rules)

    def rank_of(self, layout: Layout) -> int | None:
        """1-based position of ``layout`` among the valid layouts (None if rejected or absent)."""
        for i, a in enumerate(self.ranked, 1):
            if a.layout == layout:
                return i
        return None

    def reasons(self) -> dict:
        """How many rejected layouts failed each kind of constraint (first reason only)."""
        out = {}
        for a in self.rejected:
            key = _reason_kind(a.reasons[0])
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _reason_kind(reason: str) -> str:
    for key, words in (("memory", "GB per device"), ("TP across servers", "servers"), ("heads / FFN", "heads"),
                       ("heads / FFN", "FFN"), ("layers", "layers"), ("batch", "global batch"),
                       ("interleaving", "interleaved"), ("sequence", "chunks"), ("experts", "EP=")):
        if words in reason:
            return key
    return "other"


def enumerate_layouts(model: Model, cluster: Cluster, global_batch: int, *, zero_stages=(0, 1, 2, 3),
                      micro_batches=(1, 2, 4, 8), cps=(1,), eps=(1,), vs=(1,), recomputes=RECOMPUTE,
                      max_tp: int | None = None, sequence_parallel=(True,)) -> list:
    """Every layout with DP x TP x PP x CP = devices from the given option lists (TP and PP over
    the divisors of the device count; TP up to ``max_tp``, default twice the server size)."""
    n = cluster.n_devices
    max_tp = max_tp or 2 * cluster.devices_per_node
    out = []
    for tp in divisors(n):
        if tp > max_tp:
            continue
        for cp in cps:
            for pp in divisors(n // tp) if n % tp == 0 else []:
                if (n // tp // pp) % cp or pp > model.layers:
                    continue
                dp = n // (tp * pp * cp)
                for ep in eps:
                    for z in (zero_stages if dp * cp > 1 else (0,)):  # ZeRO needs replicas to shard over
                        for mb in micro_batches:
                            for v in (vs if pp > 1 else (1,)):
                                for rc in recomputes:
                                    for sp in (sequence_parallel if tp > 1 else (True,)):
                                        out.append(Layout(dp, tp, pp, cp, ep, z, mb, v, sp, rc))
    return out


def plan(model: Model, cluster: Cluster, global_batch: int, rules: Rules = Rules(), **options) -> Plan:
    """Assess every layout of :func:`enumerate_layouts` (``options`` go there) and rank the valid ones."""
    done = [assess(model, cluster, global_batch, lay, rules) for lay in enumerate_layouts(model, cluster, global_batch, **options)]
    ranked = sorted((a for a in done if a.ok), key=lambda a: (a.step_s, a.layout.zero, a.layout.pp, a.layout.tp))
    return Plan(model, cluster, global_batch, rules, ranked, [a for a in done if not a.ok])


def table(assessments, k: int = 10) -> str:
    """A plain-text table of the first ``k`` assessments."""
    rows = [a.row() for a in list(assessments)[:k]]
    if not rows:
        return "(none)"
    head = f"{'layout':40s} {'m':>5s} {'GB/dev':>7s} {'step s':>8s} {'MFU':>6s}  why not"
    lines = [head]
    for r in rows:
        step = f"{r['step s']:8.2f}" if r["step s"] is not None else f"{'-':>8s}"
        mfu = f"{r['MFU']:6.3f}" if r["MFU"] is not None else f"{'-':>6s}"
        m = f"{r['m']:5d}" if r["m"] is not None else f"{'-':>5s}"
        lines.append(wrap(f"{r['layout']:40s} {m} {r['GB/device']:7.1f} {step} {mfu}  {r['why not']}", 4))
    return "\n".join(lines)


def report(p: Plan, k: int = 10) -> str:
    """The ``k`` fastest valid layouts, the count of rejections by kind, and the best one explained."""
    lines = [table(p.ranked, k), "", f"rejected: {p.reasons()}"]
    if p.ranked:
        lines += [""] + explain(p.best, p.model, p.cluster)
    return "\n".join(lines)


def format_steps(steps: list) -> str:
    """The steps of :func:`decision_sequence` or :func:`rule_of_thumb`, one a line (a long detail
    continues on indented lines, :func:`wrap`)."""
    return "\n".join(wrap(f"  {s['question']:58s} {'yes' if s['answer'] else 'no ':3s}  {s['detail']}", 4)
                     for s in steps)


# ---- explaining a choice ------------------------------------------------------------------------------

def neighbours(p: Plan, layout: Layout) -> list:
    """Layouts one knob away from ``layout`` (TP or PP doubled/halved against DP, ZeRO +-1,
    micro-batch doubled/halved, recomputation toggled), each assessed: what each choice avoided."""
    out = []

    def add(what, **changes):
        try:
            alt = replace(layout, **changes)
        except ValueError:
            return
        a = p.find(alt)
        out.append((what, a))

    for dim in ("tp", "pp"):
        cur = getattr(layout, dim)
        if layout.dp % 2 == 0:
            add(f"{dim.upper()} x2 (DP /2)", **{dim: cur * 2, "dp": layout.dp // 2})
        if cur % 2 == 0:
            add(f"{dim.upper()} /2 (DP x2)", **{dim: cur // 2, "dp": layout.dp * 2, **({"v": 1} if dim == "pp" and cur == 2 else {})})
    for z in (layout.zero - 1, layout.zero + 1):
        if 0 <= z <= 3:
            add(f"ZeRO-{z}", zero=z)
    add("micro-batch x2", micro_batch=layout.micro_batch * 2)
    if layout.micro_batch % 2 == 0:
        add("micro-batch /2", micro_batch=layout.micro_batch // 2)
    add("recompute toggled", recompute="full" if layout.recompute == "none" else "none")
    return out


def explain(a: Assessment, model: Model, cluster: Cluster) -> list:
    """Sentences that say why each degree of ``a.layout`` is what it is (12.4.1's reading of a table),
    each wrapped by :func:`wrap` (a sentence over :data:`WIDTH` characters holds newlines)."""
    return [wrap(line) for line in _sentences(a, model, cluster)]


def _sentences(a: Assessment, model: Model, cluster: Cluster) -> list:
    L, dpn = a.layout, cluster.devices_per_node
    lines = []
    if not a.ok:
        return [f"{L.label()} is rejected: " + "; ".join(a.reasons)]
    t, mem = a.time, a.memory
    pct = lambda x: f"{100 * x / t['compute']:.1f}% of compute"
    if L.tp > 1:
        lines.append(f"TP={L.tp}: {model.heads // L.tp} of {model.heads} heads and {model.ffn // L.tp} of {model.ffn} FFN columns per device; "
                     f"{'inside one server' if L.tp <= dpn else 'ACROSS servers'}; its all-reduces cost {t['tp']:.2f} s per step ({pct(t['tp'])}).")
    else:
        lines.append("TP=1: no tensor parallelism; the layers fit whole on a device.")
    if L.pp > 1:
        lines.append(f"PP={L.pp}{f' x {L.v} chunks' if L.v > 1 else ''}: {math.ceil(model.layers / L.pp)} layers per stage; with m = {a.m} micro-batches "
                     f"the bubble costs {t['bubble']:.2f} s ({pct(t['bubble'])}; (p-1)/(v m) = {L.pp - 1}/{L.v * a.m}).")
    else:
        lines.append("PP=1: no pipeline, no bubble.")
    if L.cp > 1:
        lines.append(f"CP={L.cp}: {model.seq_len // L.cp} tokens per device; K/V gathers cost {t['cp']:.2f} s ({pct(t['cp'])}).")
    if L.ep > 1:
        lines.append(f"EP={L.ep}: {model.experts // L.ep} of {model.experts} experts per device; all-to-alls cost {t['ep']:.2f} s ({pct(t['ep'])}).")
    lines.append(f"DP={L.dp} with ZeRO-{L.zero}: {a.m} micro-batches of {L.micro_batch} per replica; the gradient sync takes "
                 f"{t['dp (total)']:.2f} s of which {t['dp exposed']:.2f} s is not hidden behind the backward pass.")
    lines.append(f"Memory per device: {mem['total'] / GB:.1f} of {mem['capacity'] / GB:.0f} GB (weights {mem['weights'] / GB:.1f}, "
                 f"gradients {mem['gradients'] / GB:.1f}, optimizer {mem['optimizer'] / GB:.1f}, activations {mem['activations'] / GB:.1f}, "
                 f"reserve {mem['reserve'] / GB:.1f}){'' if L.recompute == 'none' else f'; {L.recompute} recomputation'}.")
    lines.append(f"Step {t['total']:.2f} s = compute {t['compute']:.2f} + TP {t['tp']:.2f} + CP {t['cp']:.2f} + EP {t['ep']:.2f} + bubble "
                 f"{t['bubble']:.2f} + hand-offs {t['pp hand-off']:.3f} + exposed DP {t['dp exposed']:.2f}; model FLOPs utilisation {a.mfu:.1%}.")
    return lines
