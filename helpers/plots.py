"""Plots and controls shared by the notebooks: every chart of the workbook is drawn here.

The per-rank timeline of a launch (P.4, P.5, P.7, P.9, ...), the ring all-reduce steps (P.7),
memory bars (12.1.1, 12.1.2), one colour convention for forward/backward work (P.9's measured
timeline and every simulated Gantt chart), the charts of the other modules' results (drawn here,
called by their modules' names: ``ps.gantt``, ``dag.gantt``, ``hm.draw``, ...), and
:func:`controls`, the one way notebooks show interactive controls (every notebook with a
parameter to play with).
"""
from __future__ import annotations

import io
import itertools
import math
import os
import weakref

# One colour per kind of pipeline work, in every chart that shows it: spans named "F"/"forward"
# in a measured timeline and F ops in a simulated Gantt chart get the same blue (P.9, 12.2.2).
PHASE_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "weight grad": "#55A868"}
_PHASE_ALIASES = {"F": "forward", "fwd": "forward", "B": "backward", "bwd": "backward",
                  "W": "weight grad", "weight": "weight grad"}


def phase_color(name: str):
    """The colour of a kind of work ("F", "forward", "B", "backward", "W", ...), or None."""
    return PHASE_COLORS.get(_PHASE_ALIASES.get(name, name))


def span_colors(names) -> dict:
    """Colours for span names: phase names get :data:`PHASE_COLORS`, the others tab10 in order
    (skipping tab10's blue, orange and green when phase colours are in the same chart)."""
    import matplotlib.pyplot as plt

    names = list(names)
    phases = any(phase_color(n) for n in names)
    palette = [plt.cm.tab10(i) for i in range(10) if not (phases and i in (0, 1, 2))]
    colors, k = {}, 0
    for n in names:
        if phase_color(n):
            colors[n] = phase_color(n)
        else:
            colors[n], k = palette[k % len(palette)], k + 1
    return colors


def timeline(run, ax=None, title: str = "per-rank timeline"):
    """Draw each rank's named spans as bars and its communication calls as ticks.

    ``run`` is what :func:`helpers.launcher.launch` returned; spans come from
    ``helpers.launcher.commlog.span`` in the worker. Times are seconds since the first rank started.
    Forward/backward spans take :data:`PHASE_COLORS`; the legend sits outside, right of the bars.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * run.world_size))
    names = sorted({s.name for spans in run.spans for s in spans})
    colors = span_colors(names)
    order = list(PHASE_COLORS)  # forward, backward, weight grad first, then the rest by name
    names.sort(key=lambda n: (order.index(_PHASE_ALIASES.get(n, n)) if phase_color(n) else len(order), n))
    for r in range(run.world_size):
        offset = run.rank_times[r][0] if run.rank_times else 0.0
        for s in run.spans[r]:
            ax.barh(r, s.duration, left=offset + s.start, color=colors[s.name], edgecolor="k", linewidth=0.3)
        ticks = [offset + o.t for o in run.comm[r]]
        ax.plot(ticks, [r + 0.4] * len(ticks), "k|", markersize=6)
    ax.set_yticks(range(run.world_size), [f"rank {r}" for r in range(run.world_size)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (ticks: communication calls)")
    ax.set_title(title)
    if names or any(run.comm):
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        handles = [Patch(color=colors[n], label=n) for n in names]
        if any(run.comm):  # the ticks are marks too: the legend says what they are
            handles.append(Line2D([], [], color="k", marker="|", ls="None", markersize=6, label="communication call"))
        # outside the axes, to the right: a legend inside would cover the bars
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, borderaxespad=0)
    return ax


def ring_state(state, ax=None, fontsize: float = 11):
    """Draw one step of a ring all-reduce (P.7): devices x chunks with their values.

    ``state`` is a :class:`helpers.collectives.RingStep`; the chunks changed in this step are
    highlighted (yellow: reduce-scatter adds, green: all-gather copies), and the sends are listed
    under the title as ``source→destination:chunk``.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Rectangle

    n, _, length = state.chunks.shape
    if ax is None:
        _, ax = plt.subplots(figsize=(1.1 * n + 1.2, 0.7 * n + 1.4))
    changed = {(dst, c) for _, dst, c in state.sends}
    color = "#f6c85f" if state.phase == "reduce-scatter" else "#9dd9d2"
    for d in range(n):
        for c in range(n):
            face = color if (d, c) in changed else "white"
            ax.add_patch(Rectangle((c, d), 1, 1, facecolor=face, edgecolor="k"))
            vals = state.chunks[d, c]
            text = " ".join(f"{v:g}" for v in vals) if length <= 2 else f"{vals[0]:g}.."
            ax.text(c + 0.5, d + 0.5, text, ha="center", va="center", fontsize=fontsize)
    ax.set_xlim(0, n), ax.set_ylim(n, 0)
    ax.set_xticks(np.arange(n) + 0.5, [f"c{c}" for c in range(n)], fontsize=fontsize)
    ax.set_yticks(np.arange(n) + 0.5, [f"dev {d}" for d in range(n)], fontsize=fontsize)
    ax.set_xlabel("chunk", fontsize=fontsize)
    ax.tick_params(length=0)
    title = "start" if state.phase == "start" else f"{state.phase} step {state.step} of {n - 1}"
    sends = " ".join(f"{s}→{t}:c{c}" for s, t, c in state.sends)
    ax.set_title(title + f"\n{'sends ' + sends if sends else 'each device its own vector'}", fontsize=fontsize)
    return ax


def ring_step_panels(states, ncols: int = 4, panel=(2.4, 2.9)):
    """All steps of a ring all-reduce in a grid of panels (P.7): readable at laptop width.

    ``states`` is :func:`helpers.collectives.ring_allreduce_steps`'s list (start, N-1
    reduce-scatter steps, N-1 all-gather steps). Rows of ``ncols`` panels; the start and the
    reduce-scatter steps fill the first row for N = 4, the all-gather steps the second.
    Returns the figure (made without pyplot's registry, see :func:`figure`).
    """
    if not states:
        raise ValueError("states must hold at least the start state")
    if ncols < 1:
        raise ValueError(f"ncols must be at least 1, got {ncols}")
    nrows = -(-len(states) // ncols)
    fig, axes = figure(panel[0] * ncols, panel[1] * nrows, nrows=nrows, ncols=ncols, squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k < len(states):
            ring_state(states[k], ax, fontsize=10)
        else:
            ax.axis("off")
    return fig


def alpha_beta_fit(sizes, measured, model, ax=None, label="all-reduce"):
    """Measured time per message size beside the fitted α-β model, log-log (P.7)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    ax.loglog(sizes, measured, "o", label=f"{label}, measured (median)")
    ax.loglog(sizes, model, "-", label="α-β model, fitted")
    ax.set_xlabel("message size S (bytes)")
    ax.set_ylabel("time (s)")
    ax.legend()
    return ax


def memory_bars(per_device: dict, hbm_bytes: float | None = None, ax=None, title: str = ""):
    """Stacked bars of per-device model-state memory by component, in GB (12.1.1, 12.1.2).

    ``per_device`` maps a bar label to a component dict from :func:`helpers.memory.per_device_bytes`.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    labels = list(per_device)
    components = list(next(iter(per_device.values())))
    bottom = [0.0] * len(labels)
    for comp in components:
        vals = [per_device[l][comp] / 1e9 for l in labels]
        ax.bar(labels, vals, bottom=bottom, label=comp)
        bottom = [b + v for b, v in zip(bottom, vals)]
    if hbm_bytes:
        ax.axhline(hbm_bytes / 1e9, color="r", ls="--", label=f"device memory {hbm_bytes / 1e9:g} GB")
    ax.set_ylabel("GB per device")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return ax


def lanes(rows: dict, lanes: dict, ax=None, title: str = "", unit: float = 1e3):
    """Spans drawn in lanes: one group of rows per entry of ``rows``, one lane per entry of
    ``lanes`` (P.6, 12.1.2, 12.2.1: compute above, communication below, so that what runs at the
    same time is seen side by side instead of hidden under another bar).

    ``rows`` maps a label (e.g. "rank 0, overlapped") to {span name: [(start, end), ...]} in
    seconds, or to a list of :class:`helpers.launcher.commlog.Span` (as in ``run.spans[r]``); ``lanes``
    maps a lane label to the span names drawn in it. Times are shown in ms (``unit``). Concurrent
    spans of one lane are drawn half height, alternating, so each stays visible. The legend sits
    outside, right of the bars.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = [n for ns in lanes.values() for n in ns]
    colors = span_colors(names)  # forward/backward in PHASE_COLORS, as in timeline
    n_lanes = len(lanes)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.4 + 0.32 * n_lanes * len(rows)))
    ticks, labels = [], []
    for g, (label, spans) in enumerate(rows.items()):
        if isinstance(spans, (list, tuple)):
            grouped = {}
            for sp in spans:
                grouped.setdefault(sp.name, []).append((sp.start, sp.end))
            spans = grouped
        for k, (lane, members) in enumerate(lanes.items()):
            y = g * (n_lanes + 0.6) + k
            ticks.append(y), labels.append(f"{label}: {lane}")
            bars = sorted((s, e, n) for n in members for s, e in spans.get(n, []))
            for i, (s, e, n) in enumerate(bars):
                busy = i > 0 and s < bars[i - 1][1]
                ax.barh(y + (0.2 if busy else 0), (e - s) * unit, left=s * unit,
                        height=0.4 if busy else 0.8, color=colors[n], edgecolor="k", linewidth=0.4)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(title)
    # outside the axes, to the right: a legend inside would cover the bars
    ax.legend(handles=[Patch(color=colors[n], label=n) for n in names], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    return ax


# ---- the charts of the other modules' results -----------------------------------------------------
# Each is drawn here and called through its module's own name (``ps.gantt``, ``dag.gantt``,
# ``hm.draw``, ...), which checks its input and passes it on: the modules that compute stay free of
# drawing code. Without ``ax`` each makes a pyplot figure of its own size (shown by ``plt.show()``);
# a controls callback passes an axes of :func:`figure` instead.

# the colours of simulated pipeline ops, the same as measured timelines' spans: F blue, B orange, W green
KIND_COLORS = {k: PHASE_COLORS[name] for k, name in (("F", "forward"), ("B", "backward"), ("W", "weight grad"))}


def _axes_or_new(ax, width: float, height: float):
    """``ax``, or the axes of a new pyplot figure of ``width`` x ``height`` inches."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(width, height))
    return ax


def schedule_gantt(tl, ax=None, title: str | None = None, labels: bool = True, time_unit: str = "", xmax=None):
    """A :class:`helpers.pipeline_schedule.Timeline` as a Gantt chart (``ps.gantt``, P.9, 12.2.2)."""
    from matplotlib.patches import Patch

    ax = _axes_or_new(ax, 10, 0.45 * tl.p + 1.0)
    span = float(tl.makespan)
    for o in tl.ops:
        s, dur = float(o.start), float(o.duration)
        ax.barh(o.device, dur, left=s, height=0.8, color=KIND_COLORS[o.kind], edgecolor="k", linewidth=0.4,
                hatch="//" if o.chunk % 2 else None, alpha=1.0 if o.chunk == 0 else 0.8)
        if labels and dur > span / 90:  # on a small white box, so that a hatch does not hide it
            ax.text(s + dur / 2, o.device, str(o.mb), ha="center", va="center", fontsize=8, color="k",
                    bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.85))
    ax.set_yticks(range(tl.p), [f"dev {d}" for d in range(tl.p)])
    ax.set_ylim(tl.p - 0.5, -0.5)
    ax.set_xlim(0, span if xmax is None else float(xmax))
    ax.set_xlabel(f"time{' (' + time_unit + ')' if time_unit else ''}")
    kinds = [k for k in KIND_COLORS if any(o.kind == k for o in tl.ops)]
    names = {"F": "forward", "B": "backward (input grad)" if tl.split_backward else "backward", "W": "weight grad"}
    handles = [Patch(color=KIND_COLORS[k], label=names[k]) for k in kinds]
    if any(o.chunk % 2 for o in tl.ops):  # the hatch is a mark too
        handles.append(Patch(facecolor="white", edgecolor="k", hatch="//", label="odd-numbered chunk"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if title is None:
        title = (f"{tl.schedule}: p={tl.p} m={tl.m}" + (f" v={tl.v}" if tl.v > 1 else "")
                 + f"  bubble {float(tl.bubble('total')):.1%} of total, {float(tl.bubble('useful')):.1%} of useful")
    ax.set_title(title, fontsize=9)
    return ax


def schedule_in_flight(tl, ax=None):
    """A timeline's live micro-batches per device over time (``ps.plot_in_flight``, P.9)."""
    ax = _axes_or_new(ax, 6, 3)
    for d in range(tl.p):
        steps = tl.in_flight(d)
        ts = [float(t) for t, _ in steps] + [float(tl.makespan)]
        ls = [float(x) for _, x in steps]
        ax.step(ts[:-1] + [ts[-1]], ls + [ls[-1]], where="post", label=f"dev {d}")
    ax.set_xlabel("time")
    ax.set_ylabel("micro-batches in flight")
    ax.set_title(f"{tl.schedule}: activations held (p={tl.p}, m={tl.m})", fontsize=9)
    ax.legend(fontsize=8)
    return ax


def task_gantt(schedule, kind_of, ax=None, title: str | None = None, colors: dict | None = None):
    """A :class:`helpers.dag.Schedule` as a Gantt chart, one bar per task coloured by
    ``kind_of(task)`` (``dag.gantt``, P.1, P.4)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ax = _axes_or_new(ax, 9, 0.6 + 0.35 * schedule.workers)
    kinds = list(dict.fromkeys(kind_of(s.task) for s in schedule.slots))
    colors = colors or {k: plt.cm.tab10(i % 10) for i, k in enumerate(kinds)}
    for s in schedule.slots:
        ax.barh(s.worker, s.duration, left=s.start, color=colors[kind_of(s.task)], edgecolor="k", linewidth=0.4)
    ax.set_yticks(range(schedule.workers), [f"worker {w}" for w in range(schedule.workers)])
    ax.invert_yaxis()
    ax.set_xlabel("time")
    ax.axvline(schedule.makespan, color="k", ls="--", lw=0.8)
    ax.set_title(title or f"{schedule.workers} workers: makespan {schedule.makespan:g}")
    ax.legend(handles=[Patch(facecolor=colors[k], edgecolor="k", label=k) for k in kinds],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return ax


def roofline(peak_flops: float, bandwidth: float, ridge: float, points: dict | None = None,
             marks: dict | None = None, ax=None, title: str = "roofline of this machine"):
    """Log-log roofline min(peak, I x bandwidth) with its ``ridge`` intensity, measured ``points``
    ({label: (intensity, FLOP/s)}) and vertical ``marks`` ({label: intensity})
    (``intensity.roofline_plot``, P.3)."""
    import matplotlib.pyplot as plt
    import numpy as np

    ax = _axes_or_new(ax, 7, 4)
    xs = [i for i, _ in (points or {}).values()] + list((marks or {}).values()) + [ridge]
    lo, hi = min(xs + [0.05]) / 3, max(xs + [10]) * 3
    I = np.logspace(math.log10(lo), math.log10(hi), 200)
    ax.loglog(I, np.minimum(peak_flops, I * bandwidth), "k-", lw=2, label="roof: min(peak, I x bandwidth)")
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    for j, (label, (i, f)) in enumerate((points or {}).items()):
        ax.loglog([i], [f], "o", ms=8, color=plt.cm.tab10(j), label=f"{label} (measured)")
    for j, (label, i) in enumerate((marks or {}).items()):
        ax.axvline(i, color=plt.cm.Set2(j), ls="--", lw=1.5, label=label)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    return ax


def servers(mesh, devices_per_node: int, highlight: dict | None = None, ax=None, title: str | None = None):
    """A :class:`helpers.mesh.Mesh` on servers of ``devices_per_node`` devices: boxes of devices
    labelled with rank and coordinate, each group of a ``highlight``-ed dimension a line through
    its members (``hm.draw``, P.11, 12.4.1)."""
    from matplotlib.patches import Rectangle

    n_nodes = mesh.world // devices_per_node
    ax = _axes_or_new(ax, 1.6 * devices_per_node + (3 if highlight else 1), 1.25 * n_nodes + 0.6)
    pos = {}
    for r in range(mesh.world):
        node, slot = divmod(r, devices_per_node)
        pos[r] = (slot, -node)
    for node in range(n_nodes):
        ax.add_patch(Rectangle((-0.45, -node - 0.42), devices_per_node - 0.1, 0.84, fill=False, lw=1.5, ec="0.35"))
        ax.text(-0.6, -node, f"server {node}", ha="right", va="center", fontsize=9)
    for k, (name, color) in enumerate((highlight or {}).items()):
        off = 0.12 * (k - (len(highlight) - 1) / 2)
        for gi, g in enumerate(mesh.groups(name)):
            xs, ys = _group_path([pos[r] for r in g], off)
            ax.plot(xs, ys, "-", color=color, lw=2.2, alpha=0.75, label=f"{name} groups" if gi == 0 else None)
    for r, (x, y) in pos.items():
        c = mesh.coord(r)
        ax.add_patch(Rectangle((x - 0.36, y - 0.3), 0.72, 0.6, fc="white", ec="0.2", zorder=3))
        ax.text(x, y + 0.1, f"GPU {r}", ha="center", va="center", fontsize=8, weight="bold", zorder=4)
        ax.text(x, y - 0.13, ",".join(f"{n}{i}" for n, i in c.items()), ha="center", va="center", fontsize=6.5, zorder=4)
    ax.set_xlim(-1.9, devices_per_node + 0.2)
    ax.set_ylim(-n_nodes + 0.4, 0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    if highlight:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    shape = " x ".join(f"{n.upper()}{s}" for n, s in zip(mesh.names, mesh.sizes))
    ax.set_title(title or f"{mesh.world} devices as {shape}, {devices_per_node} per server", fontsize=10)
    return ax


def _group_path(points, off):
    """A polyline through a group's members; a hop that skips a server or a slot bows outwards
    (a quadratic curve), so that it does not run through the devices in between."""
    import numpy as np

    xs, ys = [points[0][0] + off], [points[0][1] + off]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        a, b = np.array([x0 + off, y0 + off]), np.array([x1 + off, y1 + off])
        d = b - a
        if abs(d[0]) > 1 or abs(d[1]) > 1:
            ctrl = (a + b) / 2 + np.array([-d[1], d[0]]) * 0.5
            t = np.linspace(0, 1, 24)[1:, None]
            curve = (1 - t) ** 2 * a + 2 * (1 - t) * t * ctrl + t ** 2 * b
            xs += list(curve[:, 0]); ys += list(curve[:, 1])
        else:
            xs.append(b[0]); ys.append(b[1])
    return xs, ys


def prefetch_timeline(result, ax=None, title: str = ""):
    """One rank's step of :func:`helpers.layer_overlap.fsdp_prefetch_worker`: each layer's forward
    and backward compute as bars, and below them FSDP2's all-gathers (AG i) and reduce-scatters
    (RS i) at the moment they were issued (``lov.prefetch_plot``, 12.1.2)."""
    ax = _axes_or_new(ax, 9, 2.2)
    for (kind, i), (s, e) in result["compute"].items():
        ax.barh(1, (e - s) * 1e3, left=s * 1e3, color=f"C{i}", edgecolor="k", alpha=0.5 if kind == "backward" else 1.0)
        ax.text((s + e) / 2 * 1e3, 1, f"{kind[0].upper()}{i}", ha="center", va="center", fontsize=8)
    for k, (op, layer, t) in enumerate(result["ops"]):
        y = 0.35 if op == "all_gather" else -0.15
        ax.plot([t * 1e3] * 2, [y - 0.15, y + 0.15], color=f"C{layer}" if layer is not None else "k")
        ax.text(t * 1e3, y + 0.2 + 0.12 * (k % 2), f"{'AG' if op == 'all_gather' else 'RS'}{layer}", ha="center", fontsize=7)
    ax.set_yticks([1, 0.35, -0.15], ["compute (F: forward, B: backward)", "all-gather issued", "reduce-scatter issued"], fontsize=8)
    ax.set_ylim(-0.5, 1.6)
    ax.set_xlabel("ms since the step began")
    ax.set_title(title, fontsize=9)
    return ax


# ---- figures and controls ----------------------------------------------------------------------


def figure(width: float, height: float, nrows: int = 1, ncols: int = 1, layout: str = "constrained", **kw):
    """A matplotlib figure and its axes, *not* registered with pyplot.

    Controls' callbacks draw on these (see :func:`controls`): a callback may run in a kernel
    subshell thread while another cell runs, and pyplot's global list of open figures is shared
    between threads: the inline backend flushing another cell's figures would display or close a
    callback's half-drawn figure (the blank plot of 12.1.2's explorer). ``kw`` goes to
    ``Figure.subplots`` (``sharex``, ``squeeze``, ...). Returns ``(fig, ax)`` or ``(fig, axes)``.
    """
    from matplotlib.figure import Figure

    if width <= 0 or height <= 0:
        raise ValueError(f"figure size must be positive, got {width} x {height}")
    fig = Figure(figsize=(width, height), layout=layout)
    return fig, fig.subplots(nrows, ncols, **kw)


def series_125(lo: float, hi: float) -> list:
    """The values 1, 2, 5 x 10^k from ``lo`` to ``hi`` inclusive (a log scale with round steps)."""
    if not 0 < lo <= hi:
        raise ValueError(f"need 0 < lo <= hi, got lo={lo}, hi={hi}")
    out = []
    for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = float(f"{m}e{e}")
            if lo * (1 - 1e-12) <= v <= hi * (1 + 1e-12):
                out.append(v)
    return out


def log_slider(value: float, lo: float, hi: float, description: str = "", fmt: str = "{:g}", extra=()):
    """A slider over round values on a log scale (1-2-5 per decade) that holds ``value`` exactly.

    Replaces ``FloatLogSlider``, whose step (0.1 in the exponent by default) moves a start value
    off the book's: 7.5 shows as 7.94 and 400 as 398. ``extra`` adds more exact stops (other
    values the chapter uses).
    """
    from ipywidgets import SelectionSlider

    if not lo <= value <= hi:
        raise ValueError(f"start value {value} must lie in [{lo}, {hi}]")
    values = sorted(set(series_125(lo, hi)) | {float(value)} | {float(x) for x in extra})
    return SelectionSlider(options=[(fmt.format(v), v) for v in values], value=float(value),
                           description=description)


def say(*lines: str, width: int = 100) -> None:
    """Print sentences wrapped at word boundaries, ``width`` characters a line.

    JupyterLab breaks a long output line wherever the window ends, mid-word; callbacks of
    :func:`controls` print their sentences with this instead. Each argument starts a new line;
    the continuation lines of a wrapped one are indented by two spaces.
    """
    import textwrap

    for line in lines:
        print(textwrap.fill(line, width, subsequent_indent="  ", break_long_words=False) if line else "")


def _on_grid(value, lo, step) -> bool:
    k = (value - lo) / step
    return abs(k - round(k)) <= 1e-9 * max(1.0, abs(k))


def check_start(name: str, widget) -> None:
    """Refuse a control whose start value the browser would move (ValueError) or a FloatLogSlider.

    JupyterLab's sliders snap to ``min + k * step``: a start value off that grid is moved when
    the slider is drawn, the kernel gets the moved value and the callback runs a second time on
    a value that is not the book's.
    """
    from ipywidgets import FloatLogSlider, FloatSlider, IntSlider

    if isinstance(widget, FloatLogSlider):
        raise TypeError(f"control {name!r}: FloatLogSlider moves its start value when drawn; "
                        "use plots.log_slider(value, lo, hi)")
    if isinstance(widget, (FloatSlider, IntSlider)) and not _on_grid(widget.value, widget.min, widget.step):
        raise ValueError(f"control {name!r}: start value {widget.value} is not min + k * step "
                         f"(min {widget.min}, step {widget.step}); the browser would move it")


def _show_value(widget, value) -> str:
    labels = getattr(widget, "_options_labels", None)
    options = getattr(widget, "_options_values", None)
    if labels and options is not None:
        for lab, v in zip(labels, options):
            if v is value or v == value:
                return lab
    return f"{value:g}" if isinstance(value, float) else str(value)


def _figures(result):
    from matplotlib.figure import Figure

    if result is None:
        return []
    items = list(result) if isinstance(result, (list, tuple)) else [result]
    bad = [type(x).__name__ for x in items if not isinstance(x, Figure)]
    if bad:
        raise TypeError(f"a controls callback returns None, a Figure or a list of Figures, got {bad}")
    return items


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", facecolor="white")
    return buf.getvalue()


def _controls_class():
    from ipywidgets import Output, VBox

    class Controls(VBox):
        """The controls of :func:`controls`: ``widgets`` (name -> control), ``out`` (the Output the
        callback draws into), ``start`` (the values it started with), ``values`` (now), ``runs``
        (how many times the callback ran: once at the start, once per change)."""

        def __init__(self, fn, widgets):
            self.fn, self.widgets, self.out, self.runs = fn, dict(widgets), Output(), 0
            self.working = None  # the "Working: ..." line while a change is worked on
            self.serial = next(_SERIAL)
            _SHOWN.add(self)
            width = max(len(w.description) for w in self.widgets.values())
            for w in self.widgets.values():
                if hasattr(w, "style") and hasattr(w.style, "description_width"):
                    w.style.description_width = f"{width + 2}ch"  # names in full, aligned
                    if w.layout.width is None:
                        w.layout.width = f"calc({width + 2}ch + 320px)"  # the control keeps its width
                if hasattr(w, "continuous_update"):
                    w.continuous_update = False  # one run per release, not one per pixel
                w.observe(self._changed, names="value")
            self.start = self.values
            super().__init__(children=[*self.widgets.values(), self.out])
            self._draw(note=None, first=True)

        @property
        def values(self) -> dict:
            return {k: w.value for k, w in self.widgets.items()}

        def _changed(self, change):
            w = change["owner"]
            name = next(k for k, x in self.widgets.items() if x is w)
            note = (f"You moved '{w.description or name}' from {_show_value(w, change['old'])} to "
                    f"{_show_value(w, change['new'])} (it starts at {_show_value(w, self.start[name])}).")
            # the last result goes while the callback works (a fake-world trace takes seconds): no
            # figure stays up for values it was not drawn for
            self.working = f"Working: '{w.description or name}' is now {_show_value(w, change['new'])} ..."
            self.out.outputs = ({"output_type": "stream", "name": "stdout", "text": self.working + "\n"},)
            try:
                self._draw(note)
            finally:
                self.working = None

        def _draw(self, note, first=False):
            """Run the callback and set the Output's outputs to what it printed and drew.

            The outputs are set as the Output widget's state, not captured from the kernel's
            messages (``with out:``): JupyterLab creates the Output's model asynchronously, and
            output sent before it is ready lands in the cell, above the controls, where the next
            run cannot clear it (seen in the browser test).
            """
            import base64
            import contextlib
            import sys
            import traceback

            pyplot = sys.modules.get("matplotlib.pyplot")
            before = set(pyplot.get_fignums()) if first and pyplot else set()
            text, outputs, error = io.StringIO(), [], None
            try:
                _RUNNING.append(self)
                try:
                    with contextlib.redirect_stdout(text):
                        if note:
                            say(note)
                        figs = _figures(self.fn(**self.values))
                finally:
                    _RUNNING.pop()
                made = set(pyplot.get_fignums()) - before if first and pyplot else set()
                if made:
                    for num in made:
                        pyplot.close(num)
                    raise TypeError("a controls callback must draw on plots.figure(...) and return the "
                                    "figure, not use pyplot (plt.subplots / plt.figure)")
                if os.environ.get("WORKBOOK_CHECK_FIGURES") == "1":  # the suite checks controls' figures too
                    from .course.readability import check

                    for fig in figs:
                        check(fig)
                images = [base64.b64encode(_png(fig)).decode("ascii") for fig in figs]
            except Exception as exc:
                error, images = exc, []
            finally:
                self.runs += 1
            if text.getvalue():
                outputs.append({"output_type": "stream", "name": "stdout", "text": text.getvalue()})
            outputs += [{"output_type": "display_data", "metadata": {},
                         "data": {"image/png": png, "text/plain": "<figure>"}} for png in images]
            if error is not None and not first:  # shown under the controls; the controls stay usable
                outputs.append({"output_type": "error", "ename": type(error).__name__, "evalue": str(error),
                                "traceback": traceback.format_exception(error)})
            self.out.outputs = tuple(outputs)
            if error is not None and first:
                raise error  # the first run is the cell's own: a broken callback fails the cell

    return Controls


_CONTROLS = None
_SHOWN = weakref.WeakSet()
_RUNNING = []  # the controls whose callback runs now (innermost last)


def progress(text: str) -> None:
    """Show ``text`` under the "Working: ..." line of the controls whose callback is running after a
    change, replacing the previous progress line (e.g. ``fake_world.simulate(..., progress=plots.progress)``:
    which trace, micro-batch and layer it is on). The line goes when the callback's result is drawn.
    Anywhere else (a cell's own code, the controls' first run inside their cell) it shows nothing:
    what a cell prints is its own output."""
    if not isinstance(text, str):
        raise TypeError(f"progress takes a str, got {type(text).__name__}")
    if _RUNNING and _RUNNING[-1].working is not None:
        c = _RUNNING[-1]
        c.out.outputs = ({"output_type": "stream", "name": "stdout", "text": f"{c.working}\n  {text}\n"},)
_SERIAL = itertools.count()


def controls(fn, /, **widgets):
    """Interactive controls for ``fn``: the one way notebooks show them (instead of ``interact``).

    ``widgets`` maps each parameter of ``fn`` to an ipywidgets control (an ``IntSlider``,
    :func:`log_slider`, a ``Dropdown``, ...). ``fn`` runs once now and again after each change;
    it prints (with :func:`say`) a sentence saying what the values mean and returns ``None``, a
    figure made with :func:`figure`, or a list of them. Returned is a ``Controls`` box; as the cell's last
    expression it shows the controls and the output. Differences from ``interact``, each fixing
    something seen in the browser:

    * a start value the browser would move (off a slider's step grid, or any ``FloatLogSlider``)
      is refused (ValueError / TypeError), so the controls start exactly at the book's values and
      the callback does not run a second time on its own right after the cell;
    * figures are drawn off pyplot and shown as PNG images, so no other cell's inline flush can
      blank or steal them; a callback that uses pyplot fails; what the callback prints and draws
      becomes the Output's state (not captured messages), so it always lands under the controls;
    * control names are shown in full and aligned; sliders update on release;
    * after a change the output first says which control moved, from what to what, and where
      it started (the book's value);
    * an error in the first run fails the cell (nbval sees it); later errors show under the
      controls.
    """
    global _CONTROLS
    import inspect

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not widgets:
        raise ValueError("controls needs at least one control")
    params = inspect.signature(fn).parameters
    missing = [k for k in widgets if k not in params]
    unset = [k for k, p in params.items() if k not in widgets and p.default is inspect.Parameter.empty]
    if missing or unset:
        raise TypeError(f"controls for {fn.__name__}: no parameter named {missing}" if missing
                        else f"controls for {fn.__name__}: parameters without a control or default: {unset}")
    from ipywidgets import ValueWidget

    for name, w in widgets.items():
        if not isinstance(w, ValueWidget):
            raise TypeError(f"control {name!r} must be an ipywidgets control, got {type(w).__name__}")
        if not w.description:
            w.description = name
        check_start(name, w)
    if _CONTROLS is None:
        _CONTROLS = _controls_class()
    return _CONTROLS(fn, widgets)


def live_controls() -> list:
    """Every :func:`controls` box alive in this process, oldest first (the browser test asks the
    kernel for them)."""
    return sorted(_SHOWN, key=lambda c: c.serial)
