"""helpers.plots: controls that start at the book's values and draw reliably, one colour per kind
of pipeline work, legends outside the bars, the ring figure at laptop width (issue 16)."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from ipywidgets import Dropdown, FloatLogSlider, FloatSlider, IntSlider  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from helpers import collectives, plots  # noqa: E402
from helpers import pipeline_schedule as ps  # noqa: E402


def _draw(a, mode="x"):
    fig, ax = plots.figure(3, 2)
    ax.plot([0, 1], [0, a])
    plots.say(f"a is {a}, mode {mode}")
    return fig


def test_log_slider_holds_the_book_value_exactly():
    s = plots.log_slider(7.5, 0.1, 1000, "params (B)", extra=[405])
    assert s.value == 7.5 and s.label == "7.5"
    assert list(s.options[:4]) == [("0.1", 0.1), ("0.2", 0.2), ("0.5", 0.5), ("1", 1.0)]
    assert ("405", 405.0) in s.options and s.options[-1] == ("1000", 1000.0)
    assert plots.series_125(10, 2000) == [10, 20, 50, 100, 200, 500, 1000, 2000]
    with pytest.raises(ValueError, match=r"start value 5000 must lie in \[1, 1000\]"):
        plots.log_slider(5000, 1, 1000)
    with pytest.raises(ValueError, match="0 < lo <= hi"):
        plots.series_125(0, 10)


def test_start_values_the_browser_would_move_are_refused():
    # what defect 2 saw: FloatLogSlider's step moves 7.5 to 7.94 and 400 to 398 when drawn
    with pytest.raises(TypeError, match="FloatLogSlider"):
        plots.controls(_draw, a=FloatLogSlider(value=7.5, base=10, min=-1, max=3))
    with pytest.raises(ValueError, match="not min \\+ k \\* step"):
        plots.controls(_draw, a=FloatSlider(value=0.75, min=0, max=2, step=0.5))
    with pytest.raises(ValueError, match="not min \\+ k \\* step"):
        plots.controls(_draw, a=IntSlider(value=1020, min=8, max=16384, step=8))
    ok = plots.controls(_draw, a=IntSlider(value=1024, min=8, max=16384, step=8),
                        mode=Dropdown(options=["x", "y"], value="y"))
    assert ok.start == ok.values == {"a": 1024, "mode": "y"}


def _text(c):
    return "".join(o["text"] for o in c.out.outputs if o["output_type"] == "stream")


def test_controls_run_once_then_once_per_change_and_say_what_moved():
    c = plots.controls(_draw, a=IntSlider(value=3, min=0, max=10, description="size"))
    assert c.runs == 1 and c in plots.live_controls() and _text(c) == "a is 3, mode x\n"
    c.widgets["a"].value = 5
    assert c.runs == 2 and c.values == {"a": 5} and c.start == {"a": 3}
    assert _text(c) == "You moved 'size' from 3 to 5 (it starts at 3).\na is 5, mode x\n"  # replaced, not added
    assert c.widgets["a"].continuous_update is False
    assert c.widgets["a"].style.description_width == f"{len('size') + 2}ch"


def test_while_a_change_is_worked_on_the_old_result_is_gone_and_says_so():
    seen = []

    def f(a):
        seen.append(_text(c) if seen else None)  # what the Output shows while the callback runs
        plots.say(f"a is {a}")

    c = plots.controls(f, a=IntSlider(3, 0, 9))
    c.widgets["a"].value = 4
    assert seen == [None, "Working: 'a' is now 4 ...\n"]
    assert _text(c) == "You moved 'a' from 3 to 4 (it starts at 3).\na is 4\n"


def test_progress_shows_under_the_working_line_while_a_change_is_worked_on_and_then_goes():
    seen = []

    def f(a):
        plots.progress(f"step {a}: half done")  # the first run (inside its cell): shows nothing
        seen.append(_text(c) if seen else None)
        plots.say(f"a is {a}")

    c = plots.controls(f, a=IntSlider(3, 0, 9, description="size"))
    assert seen == [None] and _text(c) == "a is 3\n" and c.working is None
    c.widgets["a"].value = 4
    assert seen[1] == "Working: 'size' is now 4 ...\n  step 4: half done\n"
    assert _text(c) == "You moved 'size' from 3 to 4 (it starts at 3).\na is 4\n" and c.working is None
    plots.progress("outside any callback")  # nothing to show it under: no error, no change
    assert _text(c) == "You moved 'size' from 3 to 4 (it starts at 3).\na is 4\n"
    with pytest.raises(TypeError, match="progress takes a str"):
        plots.progress(3)


def test_controls_show_figures_as_png_and_leave_pyplot_alone():
    import base64

    before = plt.get_fignums()
    c = plots.controls(_draw, a=IntSlider(value=3, min=0, max=10))
    assert plt.get_fignums() == before  # nothing left for the inline backend to flush
    images = [o["data"]["image/png"] for o in c.out.outputs if o["output_type"] == "display_data"]
    assert len(images) == 1 and base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"


def test_controls_reject_pyplot_callbacks_and_bad_arguments():
    def with_pyplot(a):
        plt.figure()
        plt.plot([a])

    before = plt.get_fignums()
    with pytest.raises(TypeError, match="plots.figure"):
        plots.controls(with_pyplot, a=IntSlider(value=1, min=0, max=3))
    assert plt.get_fignums() == before
    with pytest.raises(TypeError, match="no parameter named \\['b'\\]"):
        plots.controls(_draw, a=IntSlider(1, 0, 3), b=IntSlider(1, 0, 3))
    with pytest.raises(TypeError, match="without a control or default: \\['a'\\]"):
        plots.controls(_draw, mode=Dropdown(options=["x"], value="x"))
    with pytest.raises(TypeError, match="must be an ipywidgets control"):
        plots.controls(_draw, a=3)
    with pytest.raises(TypeError, match="a Figure or a list of Figures"):
        plots.controls(lambda a: "text", a=IntSlider(1, 0, 3))


def test_an_error_fails_the_first_run_and_shows_under_the_controls_later():
    def broken(a):
        if a != 2:
            raise ZeroDivisionError("no")

    with pytest.raises(ZeroDivisionError):
        plots.controls(broken, a=IntSlider(1, 0, 3))
    c = plots.controls(broken, a=IntSlider(2, 0, 3))
    c.widgets["a"].value = 3  # does not raise: the error is the Output's, the controls stay usable
    assert [o["output_type"] for o in c.out.outputs] == ["stream", "error"]
    assert c.out.outputs[-1]["ename"] == "ZeroDivisionError"


def test_say_wraps_at_words():
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        plots.say("word " * 50, "short")
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 100 and lines[1].startswith("  word") and lines[-1] == "short"


def test_one_colour_for_forward_and_backward_in_timelines_and_gantt_charts():
    colors = plots.span_colors(["B", "F", "recv"])
    assert colors["F"] == plots.KIND_COLORS["F"] == plots.PHASE_COLORS["forward"]
    assert colors["B"] == plots.KIND_COLORS["B"] == plots.PHASE_COLORS["backward"]
    assert colors["recv"] not in (colors["F"], colors["B"], plots.KIND_COLORS["W"])
    assert plots.span_colors(["serial", "tasks"]) == {"serial": plt.cm.tab10(0), "tasks": plt.cm.tab10(1)}
    tl = ps.simulate("zb-h1", 2, 2)
    fig, ax = plots.figure(6, 2)
    ps.gantt(tl, ax=ax)  # a simulated Gantt chart's bars take the same colours
    assert [bar.get_facecolor() for bar in ax.patches] == [to_rgba(plots.KIND_COLORS[o.kind]) for o in tl.ops]


def test_the_modules_that_compute_draw_through_plots():
    """pipeline_schedule, dag, intensity, mesh and layer_overlap import neither plots nor matplotlib
    (their charts are drawn by plots, called through their own names)."""
    code = ("import sys, helpers.pipeline_schedule, helpers.dag, helpers.intensity, helpers.mesh, helpers.layer_overlap; "
            "print(sorted(m for m in sys.modules if m == 'helpers.plots' or m.startswith('matplotlib')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"


def _run(names):
    spans = [[NS(name=n, start=0.2 * k, duration=0.15) for k, n in enumerate(names)] for _ in range(2)]
    return NS(world_size=2, spans=spans, rank_times=[(0.0,), (0.0,)], comm=[[NS(t=0.1)], [NS(t=0.1)]])


def test_timeline_legend_sits_outside_the_bars():
    ax = plots.timeline(_run(["B", "F", "recv"]))
    fig = ax.figure
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # right of the axes, over no bar
    # forward first; the communication ticks are explained too
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["F", "B", "recv", "communication call"]
    plt.close(fig)


def test_timeline_and_gantt_legends_explain_every_mark():
    from helpers import pipeline_schedule as ps
    from helpers import readability

    ax = plots.timeline(_run(["F", "B"]))
    assert readability.unexplained(ax.figure) == []
    plt.close(ax.figure)
    ax = plots.schedule_gantt(ps.simulate("interleaved", 4, 8, v=2))
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "odd-numbered chunk" in labels and readability.unexplained(ax.figure) == [], labels
    plt.close(ax.figure)


def test_ring_step_panels_fit_a_laptop_screen():
    states = collectives.ring_allreduce_steps(np.arange(16).reshape(4, 4))
    fig = plots.ring_step_panels(states)
    assert isinstance(fig, Figure) and len(fig.axes) == 8  # 2 rows of 4, the last one empty
    assert not fig.axes[-1].axison and fig.get_size_inches()[0] <= 10
    assert fig.axes[4].get_title().startswith("all-gather step 1 of 3")
    with pytest.raises(ValueError, match="ncols"):
        plots.ring_step_panels(states, ncols=0)
