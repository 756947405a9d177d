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
    for n in names:
        ax.barh([], [], color=colors[n], label=n)
    ax.set_yticks(range(run.world_size), [f"rank {r}" for r in range(run.world_size)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (ticks: communication calls)")
    ax.set_title(title)
    if names:
        ax.legend(loc="upper right", fontsize=8)
    return ax
