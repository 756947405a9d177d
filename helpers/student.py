"""Student editions of the notebooks, for teachers (the teaching-assignments issue).

A notebook's exercise solutions sit between nbgrader's ``### BEGIN SOLUTION`` and
``### END SOLUTION`` markers, after an ``answer = None`` line, and are followed by a check from
:mod:`helpers.exercises`. The student edition replaces every solution region with
``# YOUR CODE HERE`` (so the check reports "not answered yet" instead of crashing), keeps every
check and every verification cell, and clears all outputs. It uses nbgrader's own preprocessors
(``ClearSolutions``, ``ClearHiddenTests``, ``ClearOutput``), which need no course set-up.

    python -m helpers.student [OUT_DIR]      # default: student/, mirroring notebooks/
"""
from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = "# YOUR CODE HERE\n"


def notebook_paths(root: Path = NOTEBOOKS) -> list[Path]:
    """Every notebook of the workbook, in section order (folder, then file name)."""
    return sorted(p for p in Path(root).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def solution_cells(nb) -> list:
    """The code cells that hold a solution region."""
    return [c for c in nb.cells if c.cell_type == "code" and BEGIN in c.source]


def student_notebook(nb):
    """A copy of ``nb`` (an nbformat notebook) with solutions stubbed and outputs cleared."""
    import copy

    from nbgrader.preprocessors import ClearHiddenTests, ClearOutput, ClearSolutions

    nb = copy.deepcopy(nb)
    for cell in solution_cells(nb):
        if cell.source.count(BEGIN) != cell.source.count(END):
            raise ValueError(f"unbalanced solution markers in cell:\n{cell.source[:200]}")
    resources: dict = {}
    for pp in (
        ClearSolutions(enforce_metadata=False, code_stub={"python": STUB}),
        ClearHiddenTests(enforce_metadata=False),
        ClearOutput(),
    ):
        nb, resources = pp.preprocess(nb, resources)
    return nb


def build(out_dir: Path | str = ROOT / "student", src_dir: Path | str = NOTEBOOKS) -> list[Path]:
    """Write the student edition of every notebook under ``out_dir`` (same sub-folders)."""
    import nbformat

    src_dir, out_dir = Path(src_dir), Path(out_dir)
    written = []
    for path in notebook_paths(src_dir):
        nb = nbformat.read(path, as_version=4)
        if not solution_cells(nb):
            raise ValueError(f"{path} has no exercise solutions between {BEGIN!r} markers")
        target = out_dir / path.relative_to(src_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(student_notebook(nb), target)
        written.append(target)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build the student edition of every notebook.")
    parser.add_argument("out_dir", nargs="?", default=str(ROOT / "student"))
    args = parser.parse_args(argv)
    for p in build(args.out_dir):
        print(p)


if __name__ == "__main__":
    main()
