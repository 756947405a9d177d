"""Plots shared by several notebooks: the per-rank timeline of a launch (P.5, P.7, P.9, ...)."""
from __future__ import annotations


def timeline(run, ax=None, title: str = "per-rank timeline"):
    """Draw each rank's named spans as bars and its communication calls as ticks.

    ``run`` is what :func:`helpers.launcher.launch` returned; spans come from
    ``helpers.commlog.span`` in the worker. Times are seconds since the first rank started.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * run.world_size))
    names = sorted({s.name for spans in run.spans for s in spans})
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
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
    if names:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=colors[n], label=n) for n in names], loc="upper right", fontsize=8)
    return ax


def ring_state(state, ax=None):
    """Draw one step of a ring all-reduce (P.7): devices x chunks with their values.

    ``state`` is a :class:`helpers.collectives.RingStep`; the chunks changed in this step are
    highlighted, and the sends are listed under the grid.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    n, _, length = state.chunks.shape
    if ax is None:
        _, ax = plt.subplots(figsize=(1.3 * n + 1, 0.6 * n + 1.2))
    changed = {(dst, c) for _, dst, c in state.sends}
    color = "#f6c85f" if state.phase == "reduce-scatter" else "#9dd9d2"
    for d in range(n):
        for c in range(n):
            face = color if (d, c) in changed else "white"
            ax.add_patch(plt.Rectangle((c, d), 1, 1, facecolor=face, edgecolor="k"))
            vals = state.chunks[d, c]
            text = " ".join(f"{v:g}" for v in vals) if length <= 2 else f"{vals[0]:g}.."
            ax.text(c + 0.5, d + 0.5, text, ha="center", va="center", fontsize=9)
    ax.set_xlim(0, n), ax.set_ylim(n, 0)
    ax.set_xticks(np.arange(n) + 0.5, [f"chunk {c}" for c in range(n)])
    ax.set_yticks(np.arange(n) + 0.5, [f"device {d}" for d in range(n)])
    ax.tick_params(length=0)
    title = "start" if state.phase == "start" else f"{state.phase} step {state.step} of {n - 1}"
    sends = ", ".join(f"{s}→{t}:c{c}" for s, t, c in state.sends)
    ax.set_title(title + (f"\nsends {sends}" if sends else ""), fontsize=9)
    return ax


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
    seconds, or to a list of :class:`helpers.commlog.Span` (as in ``run.spans[r]``); ``lanes``
    maps a lane label to the span names drawn in it. Times are shown in ms
    (``unit``). Concurrent spans of one lane are drawn half height, alternating, so each stays visible.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = [n for ns in lanes.values() for n in ns]
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
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
                ax.barh(y + (0.2 if busy else 0), (e - s) * unit, left=s * unit, height=0.4 if busy else 0.8,
                        color=colors[n], edgecolor="k", linewidth=0.4)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(title)
    ax.legend(handles=[Patch(color=colors[n], label=n) for n in names], loc="lower right", fontsize=8)
    return ax
