"""What a stored notebook may hold: no widget views that cannot render (every notebook).

A notebook executed headless (``./workbook refresh``, nbconvert) stores each control cell's
widget as an ``application/vnd.jupyter.widget-view+json`` output plus the widgets' state in the
notebook metadata. JupyterLab cannot render either from a file: an untrusted notebook shows the
widget's text form (``Controls(children=(IntSlider(...``), a trusted one shows "Error displaying
widget: model not found". :func:`strip_widget_views` replaces each such output with a one-line
note telling the reader to run the cell, followed by what the controls showed at their start
values (the outputs the stored state kept for the widget's ``Output``: the sentence and the
figure, as ordinary outputs that render anywhere), and drops the stored widget state.

A notebook must also stay byte for byte the same when a student merely opens it: JupyterLab
writes the running kernel's ``language_info`` into the notebook when the kernel starts, so a
stored Python version other than the student's (3.11.2 here, 3.12.1 there) makes the document
dirty and autosave rewrites it (a conflict at the next ``git pull``). Notebooks are therefore
stored without ``language_info.version``, and :func:`pre_save_hook`, which ``./workbook lab``
installs as the server's pre-save hook (``jupyter_config/common``), drops it from every save.

``python -m helpers.course.nbfiles NOTEBOOK ...`` does both in place (``./workbook refresh`` runs it after
executing each notebook); files are written as ``nbformat.writes`` plus a newline, which is what
the server writes, so a save right after opening leaves the file as it was.
"""
from __future__ import annotations

import sys

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
RUN_NOTE = ("Run this cell to get the controls (live controls are not saved in the file). "
            "At their start values they show:\n")


def _start_outputs(state: dict, model_id: str) -> list:
    """The outputs a widget's Output children held when the notebook was executed."""
    model = state.get(model_id, {})
    if model.get("model_name") == "OutputModel":
        return list(model.get("state", {}).get("outputs", []))
    outs = []
    for child in model.get("state", {}).get("children", []):
        outs += _start_outputs(state, str(child).replace("IPY_MODEL_", "", 1))
    return outs


def strip_widget_views(nb) -> int:
    """Replace widget-view outputs by :data:`RUN_NOTE` and the start outputs, drop widget state.

    ``nb`` is an nbformat v4 notebook (``nbformat.read``), changed in place. Returns how many
    outputs were replaced.
    """
    import nbformat

    if not hasattr(nb, "cells") or not hasattr(nb, "metadata"):
        raise TypeError(f"need an nbformat notebook, got {type(nb).__name__}")
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    replaced = 0
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                outputs.append(out)
                continue
            outputs.append(nbformat.v4.new_output("stream", name="stdout", text=RUN_NOTE))
            for o in _start_outputs(state, view.get("model_id", "")):
                kind, data = o.get("output_type"), o.get("data", {})
                if kind == "stream":
                    outputs.append(nbformat.v4.new_output("stream", name=o["name"], text=o["text"]))
                elif kind in ("display_data", "execute_result") and WIDGET_VIEW not in data:
                    meta = o.get("metadata", {})
                    outputs.append(nbformat.v4.new_output("display_data", data=data, metadata=meta))
            replaced += 1
        cell["outputs"] = outputs
    nb.metadata.pop("widgets", None)
    return replaced


def drop_python_version(nb_json: dict) -> None:
    """Remove ``metadata.language_info.version`` (it differs from student to student), in place."""
    info = nb_json.get("metadata", {}).get("language_info")
    if isinstance(info, dict):
        info.pop("version", None)


def pre_save_hook(model, **kwargs) -> None:
    """Jupyter server pre-save hook: a notebook is saved without its kernel's Python version and
    without live widget views (autosave of a notebook whose controls ran would otherwise store
    views that show "Error displaying widget: model not found" when it is reopened)."""
    content = model.get("content")
    if model.get("type") != "notebook" or not isinstance(content, dict):
        return
    drop_python_version(content)
    if WIDGET_VIEW in str(content.get("cells", "")) or "widgets" in content.get("metadata", {}):
        import nbformat

        nb = nbformat.from_dict(content)
        strip_widget_views(nb)
        content.clear()
        content.update(nb)


def stored_widget_problems(nb) -> list[str]:
    """Where a notebook stores a widget view or widget state (empty list: none)."""
    problems = [f"cell {i}: a stored widget view" for i, c in enumerate(nb.cells)
                if any(WIDGET_VIEW in o.get("data", {}) for o in c.get("outputs", []))]
    if WIDGET_STATE in nb.metadata.get("widgets", {}):
        problems.append("metadata: stored widget state")
    return problems


def write(nb, path) -> None:
    """Write ``nb`` as JupyterLab does: ``nbformat.writes`` and a final newline. The text goes to
    a temporary file beside ``path`` that then replaces it, so a reader never sees half a file."""
    import os
    import tempfile

    import nbformat

    text = nbformat.writes(nb) + "\n"
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".~", suffix=".ipynb.tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if os.path.exists(path):
            mode = os.stat(path).st_mode & 0o777
        else:
            mask = os.umask(0)
            os.umask(mask)
            mode = 0o666 & ~mask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def clean_file(path) -> int:
    """:func:`strip_widget_views` and :func:`drop_python_version` on a notebook file, rewritten
    in place; returns the number of widget views replaced."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    n = strip_widget_views(nb)
    drop_python_version(nb)
    write(nb, path)
    return n


def main(argv=None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m helpers.course.nbfiles NOTEBOOK.ipynb ...", file=sys.stderr)
        return 2
    for p in paths:
        n = clean_file(p)
        if n:
            print(f"{p}: {n} widget view(s) replaced by a 'run this cell' note", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
