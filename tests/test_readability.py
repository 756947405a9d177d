"""helpers.course.readability: each rule caught on a figure built to break it, a clean figure passes,
and the IPython hook fails a cell that shows an unreadable figure."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from helpers import readability  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def clean():
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([0, 1, 2, 3], [0, 1, 4, 9], "C0o-", label="squares")
    ax.plot([0, 1, 2, 3], [0, 1, 2, 3], "k:", label="linear")
    ax.axhline(5, color="0.6", lw=0.8)          # a grey guide needs no entry
    ax.set(xlabel="x", ylabel="y", title="clean", xlim=(0, 6))
    ax.legend(loc="upper right")                # the data stay left of x = 3
    return fig


def test_a_clean_figure_has_no_problems():
    assert readability.problems(clean()) == []


def test_small_text_is_caught_and_the_shrink_counts():
    fig = clean()
    fig.axes[0].legend(loc="upper right", fontsize=6)          # 6 pt at 100 dpi: 8.3 px
    found = readability.problems(fig)
    assert len(found) == 1 and "legend: text 8.3 px high" in found[0] and "'squares'" in found[0]
    wide, ax = plt.subplots(figsize=(18, 3), dpi=100)           # 1,800+ px shrunk to 926
    ax.set_title("title", fontsize=8)
    assert readability.shrink(wide) < 0.7
    assert any("title: text" in p for p in readability.problems(wide))
    fine, ax = plt.subplots(figsize=(6, 3), dpi=100)
    ax.set_title("title", fontsize=8)
    assert readability.shrink(fine) == 1 and readability.problems(fine) == []


def test_a_legend_over_a_line_a_bar_or_an_annotation_is_caught():
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([0, 1, 2], [10, 5, 0], "C0-", label="fall")
    ax.legend(loc="upper left")
    assert readability.legend_overlaps(fig) == ["axes 1 of 1: the legend covers line 'fall'"]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.bar([0, 1, 2], [10, 1, 1], color="C0", label="bars")
    ax.legend(loc="upper left")
    assert readability.problems(fig) == ["axes 1 of 1: the legend covers bar 'bars'"]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([0, 10], [0, 1], "C0-", label="rise")
    ax.text(0.5, 0.95, "note", fontsize=10)
    ax.legend(loc="upper left")
    assert readability.legend_overlaps(fig) == ["axes 1 of 1: the legend covers text 'note'"]


def test_a_legend_outside_the_axes_covers_nothing():
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.bar([0, 1, 2], [10, 10, 10], color="C0", label="bars")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    assert readability.problems(fig) == []


def test_hatch_marker_and_colour_missing_from_the_legend_are_caught():
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.bar([0, 1], [1, 2], color="C0", hatch="//")
    ax.bar([2], [3], color="C1")
    ax.plot([0, 2], [0.5, 0.5], "C2^", label="targets")
    ax.set_ylim(0, 8)
    ax.legend(handles=[Patch(color="C0", label="work")] + ax.get_lines(), loc="upper right")
    found = readability.unexplained(fig)
    assert len(found) == 1
    assert "hatch '//'" in found[0] and "colour #ff7f0e" in found[0] and "marker" not in found[0]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([0, 1], [0, 1], "C0o", label="points")
    ax.plot([0, 1], [1, 0], "C0s")
    ax.set_xlim(0, 3); ax.legend(loc="upper right")  # noqa: E702
    assert readability.unexplained(fig) == ["axes 1 of 1: the legend does not explain the marker 's'"]


def test_no_legend_asks_for_no_entries():
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.bar([0, 1], [1, 2], color=["C0", "C1"], hatch="xx")
    assert readability.problems(fig) == []


class _Events:
    def __init__(self):
        self.callbacks = {"pre_run_cell": [], "post_run_cell": []}

    def register(self, name, fn):
        self.callbacks[name].append(fn)

    def run_cell(self, body):
        for fn in self.callbacks["pre_run_cell"]:
            fn(None)
        body()
        for fn in self.callbacks["post_run_cell"]:
            fn(None)


class _Shell:
    def __init__(self):
        self.display_formatter = type("F", (), {"format": lambda self, obj, **k: ({"text/plain": "x"}, {})})()
        self.events = _Events()


def test_the_hook_fails_the_cell_that_shows_an_unreadable_figure():
    shell = _Shell()
    assert readability.install(shell) and readability.install(shell)      # twice: installed once
    assert len(shell.events.callbacks["post_run_cell"]) == 1
    good = clean()
    shell.events.run_cell(lambda: shell.display_formatter.format(good))   # passes
    bad = clean()
    bad.axes[0].legend(fontsize=5)
    with pytest.raises(readability.UnreadableFigure, match=r"figure 1: axes 1 of 1 \('clean'\) legend: text 6.9"):
        shell.events.run_cell(lambda: shell.display_formatter.format(bad))
    shell.display_formatter.format(bad)                  # outside a cell (a widget callback): not blamed
    shell.events.run_cell(lambda: None)                  # ... on the next cell either


def test_install_outside_ipython_does_nothing(monkeypatch):
    monkeypatch.setenv(readability.ENV, "1")
    assert readability.install_if_asked() is False


def test_an_errorbar_entry_explains_its_markers():
    import matplotlib.pyplot as plt

    from helpers.course import readability

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.errorbar([1, 2, 3], [1, 2, 3], yerr=[0.1] * 3, fmt="o", label="simulated")
    ax.plot([1, 2, 3], [1, 2, 2], "-", label="exact")
    ax.legend(fontsize=9)
    assert readability.unexplained(fig) == []
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.errorbar([1, 2, 3], [1, 2, 3], yerr=[0.1] * 3, fmt="o")  # no label: its markers are unexplained
    ax.plot([1, 2, 3], [1, 2, 2], "-", label="exact")
    ax.legend(fontsize=9)
    assert any("marker 'o'" in p for p in readability.unexplained(fig))
    plt.close(fig)
