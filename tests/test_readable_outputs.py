"""Every stored text output line fits the output area of a laptop (issue 25, point 8).

Measured in Chromium at 1366 x 768, JupyterLab with the file browser open: the output area is
about 926 px wide and a monospace output character 7.83 px, so a line longer than
:data:`MAX_CHARS` (118) characters wraps, and JupyterLab breaks it mid-word. Checked: every line
of every stream output (stdout, stderr) and of every ``text/plain`` result that has no HTML or
image form (those are what JupyterLab shows as text). Fix a long line at its source: the print in
the cell or the helper that formats it (shorter labels, a line break between items, an aligned
table), never by cutting the information.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
MAX_CHARS = 118
RICH = ("text/html", "image/png", "image/svg+xml", "image/jpeg", "text/markdown", "text/latex")


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def shown_text(output: dict) -> str:
    """The text JupyterLab shows as monospace output for one stored output ("" for none)."""
    kind = output.get("output_type")
    if kind == "stream":
        return _text(output.get("text", ""))
    if kind in ("execute_result", "display_data"):
        data = output.get("data", {})
        if "text/plain" in data and not any(k in data for k in RICH):
            return _text(data["text/plain"])
    return ""


def long_lines(path: Path, limit: int = MAX_CHARS) -> list[tuple[int, int, str]]:
    """``(cell index, line number in the output, line)`` for each line over ``limit`` characters."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        n = 0
        for out in cell.get("outputs", []):
            for line in shown_text(out).splitlines():
                n += 1
                if len(line.rstrip()) > limit:
                    found.append((i, n, line.rstrip()))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_output_lines_fit_the_output_area(path):
    bad = long_lines(path)
    assert not bad, f"{path.relative_to(ROOT)}: {len(bad)} output line(s) over {MAX_CHARS} characters:\n" + "\n".join(
        f"  cell {i}, output line {n} ({len(line)} chars): {line[:150]}" for i, n, line in bad)


def test_the_check_sees_stream_and_plain_text_only(tmp_path):
    long = "x" * (MAX_CHARS + 1)
    nb = {"cells": [{"cell_type": "code", "source": "", "metadata": {}, "outputs": [
        {"output_type": "stream", "name": "stdout", "text": ["ok\n", long + "\n"]},
        {"output_type": "execute_result", "data": {"text/plain": long, "text/html": "<p/>"}},
        {"output_type": "display_data", "data": {"text/plain": [long]}},
        {"output_type": "stream", "name": "stdout", "text": "y" * MAX_CHARS}]}]}
    p = tmp_path / "n.ipynb"
    p.write_text(json.dumps(nb))
    assert [(c, n) for c, n, _ in long_lines(p)] == [(0, 2), (0, 3)]  # the HTML result is not counted
