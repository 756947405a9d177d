"""Student editions of the notebooks, for teachers (the teaching-assignments issue).

A notebook's exercise solutions sit between nbgrader's ``### BEGIN SOLUTION`` and
``### END SOLUTION`` markers, after an ``answer = None`` line, in a cell with nbgrader's
"autograded answer" metadata; the next cell, locked "autograder tests", calls a check from
:mod:`helpers.exercises`. :func:`mark_exercises` puts a notebook in that form. The student edition replaces every solution region with
``# YOUR CODE HERE`` (so the check reports "not answered yet" instead of crashing), keeps every
check and every verification cell, and clears all outputs. It uses nbgrader's own preprocessors
(``ClearSolutions``, ``ClearHiddenTests``, ``ClearOutput``), which need no course set-up.

    python -m helpers.student [OUT_DIR]      # default: student/, mirroring notebooks/
"""
from __future__ import annotations

import argparse
import re
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


def check_cells(nb) -> list:
    """The locked nbgrader test cells that check the exercises."""
    return [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]


def _grade_id(nb_stem: str, k: int, part: str) -> str:
    return f"{nb_stem}-ex{k}-{part}"


def mark_exercises(nb, stem: str, points: int = 1):
    """Give every exercise nbgrader's cell metadata, splitting answer and check into two cells.

    A cell ``answer = None / ### BEGIN SOLUTION ... ### END SOLUTION / check(answer)`` becomes an
    *autograded answer* cell (everything up to the end marker) followed by a locked *autograder
    tests* cell worth ``points`` (the check). Idempotent: cells already marked are left alone.
    Then nbgrader's own ``generate_assignment`` / ``autograde`` work on the notebook as it is.
    """
    import nbformat

    cells, k = [], 0
    for cell in nb.cells:
        if cell.cell_type != "code" or BEGIN not in cell.source:
            cells.append(cell)
            continue
        k += 1
        head, sep, check = cell.source.partition(END)
        cell.source = head + sep
        cell.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False,
                                     "grade_id": _grade_id(stem, k, "answer"), "schema_version": 3}
        cells.append(cell)
        if check.strip():
            test = nbformat.v4.new_code_cell(check.strip())
            test.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "points": points,
                                         "grade_id": _grade_id(stem, k, "check"), "schema_version": 3}
            cells.append(test)
    nb.cells = cells
    return nb


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
        ClearSolutions(code_stub={"python": STUB}),  # nbgrader's default: solution cells must carry metadata
        ClearHiddenTests(),
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


def exercise_prefix(path: Path) -> str:
    """``p06_data_parallelism.ipynb`` -> ``p06``; ``c12_1_1_naive_ddp.ipynb`` -> ``c12_1_1``."""
    m = re.match(r"(p\d\d|c12_\d_\d)_", Path(path).name)
    if not m:
        raise ValueError(f"{path}: notebook names start with pNN_ or c12_N_N_")
    return m.group(1)


def mark_all(src_dir: Path | str = NOTEBOOKS) -> list[Path]:
    """Apply :func:`mark_exercises` to every notebook in place (authoring aid; idempotent)."""
    import nbformat

    changed = []
    for path in notebook_paths(src_dir):
        nb = nbformat.read(path, as_version=4)
        before = nbformat.writes(nb)
        nb = mark_exercises(nb, exercise_prefix(path))
        if nbformat.writes(nb) != before:
            nbformat.write(nb, path)
            changed.append(path)
    return changed


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build the student edition of every notebook.")
    parser.add_argument("out_dir", nargs="?", default=str(ROOT / "student"))
    parser.add_argument("--mark", action="store_true",
                        help="instead: give every notebook's exercises nbgrader's cells and metadata, in place")
    args = parser.parse_args(argv)
    for p in (mark_all() if args.mark else build(args.out_dir)):
        print(p)


if __name__ == "__main__":
    main()
