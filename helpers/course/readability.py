"""Is a figure readable as JupyterLab shows it on a laptop? (issue 25, point 8; every section's plots)

JupyterLab shows a matplotlib figure as a PNG at the figure's dpi, cropped to its tight bounding
box, and shrinks an image wider than the output area to fit it: about 926 px at 1366 x 768 with
the file browser open (:data:`OUTPUT_PX`, measured in Chromium). :func:`problems` lists what a
reader cannot use on that screen:

* **small text**: any visible text (titles, axis labels, tick labels, legend entries and title,
  annotations, figure texts) whose font is under :data:`MIN_TEXT_PX` (9) pixels high on screen,
  i.e. ``fontsize * dpi / 72 * shrink``;
* **a legend over the data**: an axes' legend box covering a data artist of the same axes: a
  point of a line (its vertices, inside the axes' view), a bar or other patch, a marker of a
  scatter, a text annotation placed inside the axes;
* **what the legend does not explain**: in an axes that has a legend, a hatch, a marker or a
  colour used by a data artist (line, patch, collection) that no legend entry shows. Achromatic
  ink (black, greys, white) is reference ink (guides, edges, a linear bound) and is not asked for.

``WORKBOOK_CHECK_FIGURES=1`` makes ``import helpers`` in an IPython kernel call :func:`install`,
which checks every figure a cell displays (``plt.show()``, the inline backend's automatic show,
``display(fig)``, a figure as a cell's value) and fails the cell with the list of problems (an
error output: nbval fails the notebook; the suite sets the variable in ``tests/conftest.py``).
Figures drawn for ``plots.controls`` go to a widget as PNG bytes and are not seen by the hook.

This module imports matplotlib only when it checks a figure: ``import helpers`` stays cheap.
"""
from __future__ import annotations

import os

OUTPUT_PX = 926
MIN_TEXT_PX = 9.0
ENV = "WORKBOOK_CHECK_FIGURES"


class UnreadableFigure(Exception):
    """A figure a cell displayed has :func:`problems`."""


def shrink(fig, renderer=None) -> float:
    """The factor JupyterLab scales ``fig``'s PNG by (1 when it fits :data:`OUTPUT_PX`)."""
    renderer = renderer or _renderer(fig)
    bbox = fig.get_tightbbox(renderer)          # inches, as savefig(bbox_inches="tight") crops
    width_px = (bbox.width + 2 * 0.1) * fig.dpi  # plus savefig's pad_inches
    return min(1.0, OUTPUT_PX / width_px) if width_px > 0 else 1.0


def _renderer(fig):
    if not hasattr(fig.canvas, "get_renderer"):  # a Figure made without pyplot (plots.figure): no canvas yet
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()


def _shown(text) -> bool:
    return text.get_visible() and bool(text.get_text().strip())


def _where(ax, fig) -> str:
    axes = fig.axes
    title = ax.get_title() or ax.get_title("left") or ax.get_ylabel()
    name = f"axes {axes.index(ax) + 1} of {len(axes)}" if ax in axes else "axes"
    return f"{name} ({title!r})" if title else name


def _texts(fig):
    """``(where, Text)`` for every visible text of the figure."""
    out = [("figure", t) for t in fig.texts]
    if getattr(fig, "_suptitle", None) is not None:
        out.append(("figure title", fig._suptitle))
    for leg in fig.legends:
        out += [("figure legend", t) for t in leg.get_texts()] + [("figure legend title", leg.get_title())]
    for ax in fig.axes:
        w = _where(ax, fig)
        out += [(w + " title", ax.title), (w + " title", ax._left_title), (w + " title", ax._right_title)]
        for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            out.append((f"{w} {name} label", axis.label))
            out.append((f"{w} {name} offset", axis.get_offset_text()))
            ticks = axis.get_majorticklabels() + axis.get_minorticklabels()
            out += [(f"{w} {name} tick label", t) for t in ticks]
        out += [(w + " text", t) for t in ax.texts]
        leg = ax.get_legend()
        if leg is not None and leg.get_visible():
            out += [(w + " legend", t) for t in leg.get_texts()] + [(w + " legend title", leg.get_title())]
    return [(w, t) for w, t in out if _shown(t)]


def small_text(fig, renderer=None) -> list[str]:
    """Text under :data:`MIN_TEXT_PX` pixels high as shown (font size, dpi, shrink)."""
    renderer = renderer or _renderer(fig)
    scale = shrink(fig, renderer) * fig.dpi / 72
    found = {}
    for where, t in _texts(fig):
        px = t.get_fontsize() * scale
        if px < MIN_TEXT_PX:
            key = (where, round(px, 1))
            found.setdefault(key, []).append(t.get_text().strip().replace("\n", " "))
    return [f"{where}: text {px:.1f} px high on screen (under {MIN_TEXT_PX:g} px): "
            + ", ".join(repr(s[:30]) for s in texts[:4]) + (" ..." if len(texts) > 4 else "")
            for (where, px), texts in found.items()]


def _data_artists(ax):
    leg = ax.get_legend()
    own = set(leg.get_children()) if leg is not None else set()
    lines = [a for a in ax.lines if a.get_visible() and a not in own]
    patches = [a for a in ax.patches if a.get_visible() and a not in own]
    colls = [a for a in ax.collections if a.get_visible() and a not in own]
    return lines, patches, colls


def _inside(bbox, xy) -> bool:
    return bbox.x0 < xy[0] < bbox.x1 and bbox.y0 < xy[1] < bbox.y1


def legend_overlaps(fig, renderer=None) -> list[str]:
    """Each axes legend whose box covers a data artist of its axes."""
    import numpy as np

    renderer = renderer or _renderer(fig)
    out = []
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None or not leg.get_visible():
            continue
        box, view = leg.get_window_extent(renderer), ax.get_window_extent(renderer)
        lines, patches, colls = _data_artists(ax)
        hit = []
        for ln in lines:
            xy = ln.get_transform().transform(ln.get_xydata().astype(float))
            if any(_inside(view, p) and _inside(box, p) for p in xy if np.all(np.isfinite(p))):
                hit.append(f"line {ln.get_label()!r}" if not ln.get_label().startswith("_") else "a line")
        group = {id(p): c.get_label() for c in ax.containers for p in getattr(c, "patches", ())}
        for pa in patches:
            ext = pa.get_window_extent(renderer)
            if ext.width > 0 and ext.height > 0 and ext.overlaps(box) and ext.overlaps(view):
                label = group.get(id(pa)) or pa.get_label()
                hit.append(f"bar {label!r}" if label and not label.startswith("_") else "a bar")
        for co in colls:
            offs = co.get_offsets()
            if len(offs):
                pts = co.get_offset_transform().transform(np.asarray(offs, float))
                if any(_inside(view, p) and _inside(box, p) for p in pts if np.all(np.isfinite(p))):
                    hit.append(f"markers {co.get_label()!r}" if not co.get_label().startswith("_")
                               else "markers")
        for t in ax.texts:
            ext = t.get_window_extent(renderer)
            if _shown(t) and ext.overlaps(box) and ext.overlaps(view):
                hit.append(f"text {t.get_text().strip()[:30]!r}")
        if hit:
            uniq = list(dict.fromkeys(hit))
            out.append(f"{_where(ax, fig)}: the legend covers " + ", ".join(uniq[:5])
                       + (f" and {len(uniq) - 5} more" if len(uniq) > 5 else ""))
    return out


def _rgb(c):
    from matplotlib.colors import to_rgba

    r, g, b, a = to_rgba(c)
    return None if a == 0 else (round(r, 3), round(g, 3), round(b, 3))


def _chromatic(rgb) -> bool:
    return rgb is not None and max(rgb) - min(rgb) > 0.02


def _styles(artist):
    """``(colours, hatches, markers)`` an artist shows."""
    from matplotlib.collections import Collection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    colours, hatches, markers = set(), set(), set()
    if isinstance(artist, Line2D):
        if artist.get_linestyle() not in ("None", "none", " ", "") and artist.get_linewidth() > 0:
            colours.add(_rgb(artist.get_color()))
        m = artist.get_marker()
        if m not in (None, "None", "none", " ", "", ","):
            markers.add(str(m))
            colours.add(_rgb(artist.get_markerfacecolor()))
    elif isinstance(artist, Patch):
        if artist.get_fill():
            colours.add(_rgb(artist.get_facecolor()))
        if artist.get_hatch():
            hatches.add(artist.get_hatch())
    elif isinstance(artist, Collection):
        colours |= {_rgb(c) for c in artist.get_facecolors()}
        if artist.get_hatch():
            hatches.add(artist.get_hatch())
    return {c for c in colours if _chromatic(c)}, hatches, markers


def _flatten(container):
    for a in container:
        if isinstance(a, (tuple, list)):
            yield from _flatten(a)
        elif a is not None:
            yield a


def unexplained(fig) -> list[str]:
    """In each axes with a legend: hatches, markers and colours no legend entry shows."""
    out = []
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None or not leg.get_visible():
            continue
        handles = getattr(leg, "legend_handles", None) or getattr(leg, "legendHandles", [])
        # an errorbar's or a stem's entry is a container of artists: what it shows is what they show
        handles = [a for h in handles if h is not None for a in (h if isinstance(h, tuple) else (h,))
                   if a is not None]
        known = [set(), set(), set()]
        for h in handles:
            for k, s in zip(known, _styles(h)):
                k |= s
        lines, patches, colls = _data_artists(ax)
        # the artists of a container the legend names (an errorbar, a bar group) are explained by its entry
        labels = {t.get_text() for t in leg.get_texts()}
        named = {id(a) for c in ax.containers if c.get_label() in labels
                 for a in _flatten(c)}
        used = [set(), set(), set()]
        for a in lines + patches + colls:
            if id(a) in named:
                continue
            for u, s in zip(used, _styles(a)):
                u |= s
        missing = []
        if used[1] - known[1]:
            missing.append("hatch " + ", ".join(repr(str(h)) for h in sorted(used[1] - known[1])))
        if used[2] - known[2]:
            missing.append("marker " + ", ".join(repr(str(m)) for m in sorted(used[2] - known[2])))
        if used[0] - known[0]:
            from matplotlib.colors import to_hex

            missing.append("colour " + ", ".join(to_hex(c) for c in sorted(used[0] - known[0])))
        if missing:
            out.append(f"{_where(ax, fig)}: the legend does not explain the " + "; the ".join(missing))
    return out


def problems(fig) -> list[str]:
    """Everything :mod:`helpers.course.readability` finds in ``fig`` as JupyterLab would show it, or []."""
    renderer = _renderer(fig)
    return small_text(fig, renderer) + legend_overlaps(fig, renderer) + unexplained(fig)


def check(fig) -> None:
    """Raise :class:`UnreadableFigure` listing ``fig``'s :func:`problems`, if it has any."""
    found = problems(fig)
    if found:
        raise UnreadableFigure(_message([found]))


def _message(per_figure) -> str:
    lines = [f"{sum(map(len, per_figure))} readability problem(s) in the figure(s) this cell shows "
             f"(as JupyterLab shows them at {OUTPUT_PX} px; helpers/course/readability.py):"]
    for i, found in enumerate(per_figure, 1):
        lines += [f"  figure {i}: {p}" for p in found]
    return "\n".join(lines)


def _is_figure(obj) -> bool:
    return type(obj).__module__.startswith("matplotlib.figure") and hasattr(obj, "savefig")


def install(shell=None) -> bool:
    """Check every figure the cells of IPython ``shell`` display; fail the cell that shows one with
    :func:`problems`. Returns False outside IPython; installing twice changes nothing."""
    if shell is None:
        import sys

        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "display_formatter"):
        return False
    if getattr(shell, "_workbook_figure_check", None) is not None:
        return True
    state = {"in_cell": False, "found": []}
    formatter = shell.display_formatter
    original = formatter.format

    def format(obj, *args, **kwargs):
        result = original(obj, *args, **kwargs)
        if state["in_cell"] and _is_figure(obj):
            try:
                found = problems(obj)
            except Exception as exc:  # a check that cannot run must not hide the figure
                found = [f"the readability check failed: {type(exc).__name__}: {exc}"]
            if found:
                state["found"].append(found)
        return result

    def pre_run_cell(*_):
        state["in_cell"], state["found"] = True, []

    def post_run_cell(*_):
        state["in_cell"] = False
        found, state["found"] = state["found"], []
        if found:
            raise UnreadableFigure(_message(found))

    formatter.format = format
    shell.events.register("pre_run_cell", pre_run_cell)
    shell.events.register("post_run_cell", post_run_cell)
    shell._workbook_figure_check = (format, pre_run_cell, post_run_cell)
    return True


def install_if_asked() -> bool:
    """:func:`install` when ``WORKBOOK_CHECK_FIGURES=1`` (``helpers/__init__.py`` calls this)."""
    return os.environ.get(ENV) == "1" and install()
