"""Student editions: every notebook has checked exercises; the student copy stubs the solutions,
keeps the checks, and runs up to the first exercise, whose check fails with a helpful message."""
import re

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from helpers import student

NOTEBOOKS = student.notebook_paths()
IDS = [p.stem for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_notebook_has_at_least_three_checked_exercises(path):
    nb = nbformat.read(path, as_version=4)
    cells = student.solution_cells(nb)
    assert len(cells) >= 3, f"{path.name}: {len(cells)} exercises"
    for cell in cells:
        before, _, rest = cell.source.partition(student.BEGIN)
        _, _, after = rest.partition(student.END)
        assert re.search(r"^\w+ = None\s*$", before, re.M), f"no `answer = None` before the solution:\n{cell.source}"
        assert re.search(r"\b\w+\.ex\d+\(", after), f"no check after the solution:\n{cell.source}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_student_edition_stubs_solutions_and_keeps_checks(path):
    nb = nbformat.read(path, as_version=4)
    st = student.student_notebook(nb)
    assert len(st.cells) == len(nb.cells)
    for orig, new in zip(nb.cells, st.cells):
        if new.cell_type == "code":
            assert new.outputs == [] and new.execution_count is None
        if orig.cell_type == "code" and student.BEGIN in orig.source:
            assert student.BEGIN not in new.source and student.STUB.strip() in new.source
            check = orig.source.partition(student.END)[2].strip()
            assert new.source.rstrip().endswith(check)
        else:
            assert new.source == orig.source


def test_build_writes_every_notebook(tmp_path):
    written = student.build(tmp_path)
    assert sorted(p.relative_to(tmp_path) for p in written) == sorted(p.relative_to(student.NOTEBOOKS) for p in NOTEBOOKS)


def test_unbalanced_markers_are_rejected():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"x = None\n{student.BEGIN}\nx = 1\n")])
    with pytest.raises(ValueError, match="unbalanced solution markers"):
        student.student_notebook(nb)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_student_edition_runs_to_the_first_exercise_and_fails_helpfully(path, tmp_path):
    nb = student.student_notebook(nbformat.read(path, as_version=4))
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    assert info.value.ename == "NotAnswered", info.value.evalue
    assert "not answered yet" in info.value.evalue
    failed = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(o.output_type == "error" for o in c.outputs)]
    first_exercise = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and student.STUB.strip() in c.source)
    assert failed == [first_exercise]
