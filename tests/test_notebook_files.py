"""What every stored notebook must be for a student opening it in JupyterLab (issue 16).

Cheap checks on the files (no kernel, no browser; the browser test checks the same in Chromium):
opening a notebook must not modify it, stored outputs must render, lines must not scroll
sideways, figures must not be blank or too wide for a laptop, and every control cell goes
through ``helpers.plots.controls`` (which refuses start values the browser would move).
"""
from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import nbformat
import pytest

from helpers import nbfiles

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
MAX_LINE = 115  # longer lines scroll sideways in a laptop's notebook area with the file browser open
MAX_FIGURE_PX = 1150  # shown at >= 80 % of its size in the ~930 px output area of a 1366 px window
FIX = "run ./workbook refresh (or: python -m helpers.course.nbfiles NOTEBOOK) after executing a notebook"


def test_pre_save_hook_drops_the_python_version():
    info = {"name": "python", "version": "3.12.1"}
    model = {"type": "notebook", "content": {"metadata": {"language_info": info}}}
    nbfiles.pre_save_hook(model, path="x.ipynb", contents_manager=None)
    assert model["content"]["metadata"]["language_info"] == {"name": "python"}
    text = {"type": "file", "content": "version"}
    nbfiles.pre_save_hook(text)
    assert text == {"type": "file", "content": "version"}


def _read(path):
    return nbformat.read(path, as_version=4)


@pytest.fixture(scope="module", params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def notebook(request):
    return request.param, _read(request.param)


def test_opening_in_jupyterlab_does_not_modify_the_file(notebook):
    path, nb = notebook
    # JupyterLab writes nbformat's JSON plus a newline; the kernel it starts is python3 with this
    # display name, and it records no per-cell execution timestamps
    assert path.read_text(encoding="utf-8") == nbformat.writes(nb) + "\n", f"{path.name}: not JupyterLab's format"
    spec = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    assert nb.metadata.kernelspec == spec, f"{path.name}: kernelspec {nb.metadata.kernelspec}"
    assert not any("execution" in c.metadata for c in nb.cells), f"{path.name}: stored execution timestamps"
    # the kernel's Python version differs between students: stored, it makes JupyterLab mark the
    # notebook dirty and autosave rewrite it (the server's pre-save hook drops it from saves)
    assert "version" not in nb.metadata.get("language_info", {}), f"{path.name}: {FIX}"


def test_no_stored_widget_views(notebook):
    path, nb = notebook
    assert nbfiles.stored_widget_problems(nb) == [], f"{path.name}: widget views that cannot render; {FIX}"


def test_no_line_scrolls_sideways(notebook):
    path, nb = notebook
    # a markdown table row cannot be broken, and JupyterLab wraps its cells when rendered; nor can a
    # link's address, which the rendered cell does not show: a markdown line is measured without it
    def shown(c, line):
        return re.sub(r"\]\([^)\s]*\)", "]()", line) if c.cell_type == "markdown" else line

    long = [f"cell {i}: {len(line)} chars: {line[:60]}..." for i, c in enumerate(nb.cells)
            for line in c.source.splitlines() if len(shown(c, line)) > MAX_LINE
            and not (c.cell_type == "markdown" and line.lstrip().startswith("|"))]
    assert not long, f"{path.name}: lines over {MAX_LINE} characters:\n" + "\n".join(long)


def test_figures_are_not_blank_and_fit_a_laptop(notebook):
    import matplotlib.image as mpimg

    path, nb = notebook
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            png = out.get("data", {}).get("image/png")
            if png is None:
                continue
            rgb = mpimg.imread(io.BytesIO(base64.b64decode(png)), format="png")[..., :3]
            assert (rgb.min(axis=-1) < 0.9).mean() > 0.01, f"{path.name} cell {i}: a blank figure"
            assert rgb.shape[1] <= MAX_FIGURE_PX, (f"{path.name} cell {i}: a figure {rgb.shape[1]} px wide is "
                                                   "shrunk below 80 % at laptop width: make it narrower")


CONTROL = re.compile(r"\b(interact|interactive|interactive_output)\s*\(|FloatLogSlider")


def test_controls_go_through_plots_controls(notebook):
    path, nb = notebook
    raw = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and CONTROL.search(c.source)]
    assert not raw, (f"{path.name} cells {raw}: ipywidgets.interact / FloatLogSlider; use helpers.plots.controls "
                     "and plots.log_slider, which start exactly at the book's values and draw reliably")
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code" and "plots.controls(" in c.source:
            tags = c.metadata.get("tags", [])
            assert "nbval-ignore-output" in tags, f"{path.name} cell {i}: tag it nbval-ignore-output"


def test_strip_widget_views_keeps_what_the_controls_showed_and_a_note():
    view = nbformat.v4.new_output("display_data", data={nbfiles.WIDGET_VIEW: {"model_id": "box"},
                                                        "text/plain": "Box()"})
    text = nbformat.v4.new_output("stream", name="stdout", text="kept\n")
    shown = [{"output_type": "stream", "name": "stdout", "text": "7.5B parameters ...\n"},
             {"output_type": "display_data", "data": {"image/png": "iVBOR"}, "metadata": {}}]
    state = {"box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_s", "IPY_MODEL_out"]}},
             "s": {"model_name": "IntSliderModel", "state": {"value": 3}},
             "out": {"model_name": "OutputModel", "state": {"outputs": shown}}}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("c", outputs=[text, view])],
                                  metadata={"widgets": {nbfiles.WIDGET_STATE: {"state": state}}})
    assert nbfiles.stored_widget_problems(nb) == ["cell 0: a stored widget view", "metadata: stored widget state"]
    assert nbfiles.strip_widget_views(nb) == 1
    outs = nb.cells[0].outputs
    assert [o.get("text") for o in outs[:3]] == ["kept\n", nbfiles.RUN_NOTE, "7.5B parameters ...\n"]
    assert outs[3]["data"] == {"image/png": "iVBOR"} and len(outs) == 4
    assert nbfiles.stored_widget_problems(nb) == [] and "widgets" not in nb.metadata
    nbformat.validate(nb)
    bare = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("c", outputs=[view])])
    assert nbfiles.strip_widget_views(bare) == 1 and [o.text for o in bare.cells[0].outputs] == [nbfiles.RUN_NOTE]
    with pytest.raises(TypeError):
        nbfiles.strip_widget_views({"cells": []})
