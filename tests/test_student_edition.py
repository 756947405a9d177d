"""Student editions: every notebook has checked exercises in nbgrader's form; the student copy
stubs the solutions, keeps the checks, and runs to the end: every check fails with a helpful
message (not a crash), shown alone, and the cells after it still run."""
import re

import nbformat
import pytest
from nbclient import NotebookClient

from helpers import nbexec, student

NOTEBOOKS = student.notebook_paths()
IDS = [p.stem for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_notebook_has_at_least_three_checked_exercises_in_nbgrader_form(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    answers = student.solution_cells(nb)
    assert len(answers) >= 3, f"{path.name}: {len(answers)} exercises"
    ids = []
    for cell in answers:
        meta = cell.metadata.get("nbgrader", {})
        assert meta.get("solution") and not meta.get("grade"), cell.source
        assert re.search(r"^\w+(\s*,\s*\w+)* = None(\s*,\s*None)*\s*$", cell.source.partition(student.BEGIN)[0], re.M), cell.source
        assert cell.source.rstrip().endswith(student.END), cell.source
        check = code[code.index(cell) + 1]
        cmeta = check.metadata.get("nbgrader", {})
        assert cmeta.get("grade") and cmeta.get("locked") and cmeta.get("points", 0) > 0, check.source
        assert re.search(r"\b\w+\.ex\d+\(", check.source), check.source
        ids += [meta["grade_id"], cmeta["grade_id"]]
    assert len(ids) == len(set(ids)), "nbgrader grade ids must be unique within a notebook"


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
            assert new.source.startswith(orig.source.partition(student.BEGIN)[0])  # `answer = None` kept
        else:
            assert new.source == orig.source  # checks and everything else unchanged


def test_build_writes_every_notebook(tmp_path):
    written = student.build(tmp_path)
    assert sorted(p.relative_to(tmp_path) for p in written) == sorted(p.relative_to(student.NOTEBOOKS) for p in NOTEBOOKS)


def test_mark_exercises_splits_answer_and_check_once():
    src = f"a = None\n{student.BEGIN}\na = 1\n{student.END}\ncheck.ex1(a)"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src)])
    nb = student.mark_exercises(student.mark_exercises(nb, "t"), "t")
    assert [c.source for c in nb.cells] == [f"a = None\n{student.BEGIN}\na = 1\n{student.END}", "check.ex1(a)"]
    assert nb.cells[1].metadata["nbgrader"]["grade_id"] == "t-ex1-check"


def test_unbalanced_markers_are_rejected():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"x = None\n{student.BEGIN}\nx = 1\n")])
    with pytest.raises(ValueError, match="unbalanced solution markers"):
        student.student_notebook(nb)


def _execute(nb, tmp_path=None, km=None):
    """Run every cell of ``nb``, in a fresh kernel (in ``tmp_path``) or in the running kernel ``km``;
    return ``[(cell index, error output)]``. A failed check shows its error and lets the cells after it
    run (issue 25): nbclient raises CellExecutionError only for a cell whose reply is an error, which
    a failed check's is not, so a CellExecutionError here fails the test."""
    # nbexec's kernel manager: with nbclient's own, the reply of an `interact` cell (c12_1_1 has one
    # before its first exercise) was sometimes noticed only at the 300 s timeout on a loaded machine
    client = NotebookClient(nb, km=km, timeout=300, kernel_name="python3", kernel_manager_class=nbexec.KernelManager,
                            resources={"metadata": {"path": str(tmp_path)}} if tmp_path else {})
    try:
        client.execute()
    finally:
        if km is not None and client.kc is not None:
            client.kc.stop_channels()  # the kernel stays for the next notebook; this client does not
    return [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.outputs
            if o.output_type == "error"]


def _shows_only_its_message(err) -> bool:
    return err.traceback == [f"{err.ename}: {err.evalue}"]


# Executing a whole student edition repeats, cell for cell, what nbval already runs on the instructor
# edition (the cells before the first exercise are asserted identical above), so the whole run is
# done for one notebook of each part, and the part that is new, the stubbed exercise and its check,
# is run for every notebook below.
# (Part P's whole run is P.6's blank submission in tests/test_nbgrader_course.py: nbgrader executes the
# same student edition there, and that test checks every check's output says "not answered yet")
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem == "c12_1_1_naive_ddp"],
                         ids=lambda p: p.stem)
def test_student_edition_runs_to_the_end_and_every_check_fails_helpfully(path, tmp_path):
    nb = student.student_notebook(nbformat.read(path, as_version=4))
    errors = _execute(nb, tmp_path)
    first, err = errors[0]
    assert err.ename == "NotAnswered", err.evalue
    assert "not answered yet" in err.evalue
    checks = [nb.cells.index(c) for c in student.check_cells(nb)]
    assert first == checks[0]
    # Run All goes on past a failed check: every check ran and said "not answered yet", nothing else failed
    assert [i for i, _ in errors] == checks, [(i, e.ename, e.evalue) for i, e in errors]
    assert all(e.ename == "NotAnswered" and "not answered yet" in e.evalue and _shows_only_its_message(e)
               for _, e in errors)
    assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")


@pytest.fixture(scope="module")
def one_kernel(tmp_path_factory):
    """One kernel for the 23 short runs below, its namespace cleared before each (a kernel start
    costs seconds on a loaded 2-core machine; 23 of them were a minute and a half of the suite)."""
    from jupyter_core.utils import run_sync

    km = nbexec.KernelManager(kernel_name="python3")
    run_sync(km.start_kernel)(cwd=str(tmp_path_factory.mktemp("kernel")))
    yield km
    run_sync(km.shutdown_kernel)(now=True)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_student_edition_first_check_says_not_answered(path, one_kernel):
    st = student.student_notebook(nbformat.read(path, as_version=4))
    code = [c for c in st.cells if c.cell_type == "code"]
    check = student.check_cells(st)[0]
    answer = code[code.index(check) - 1]
    assert student.STUB.strip() in answer.source
    reset = nbformat.v4.new_code_cell("%reset -f")  # nothing left from the previous notebook
    after = nbformat.v4.new_code_cell("print('the next cell ran')")
    nb = nbformat.v4.new_notebook(cells=[reset, code[0], answer, check, after], metadata=st.metadata)
    errors = _execute(nb, km=one_kernel)  # imports, stub, check, one more cell
    assert [i for i, _ in errors] == [3], [(i, e.ename, e.evalue) for i, e in errors]
    err = errors[0][1]
    assert err.ename == "NotAnswered" and "not answered yet" in err.evalue, (err.ename, err.evalue)
    assert _shows_only_its_message(err), err.traceback  # nothing of helpers/course/exercises, no traceback
    assert nb.cells[2].outputs == [] or all(o.output_type != "error" for o in nb.cells[2].outputs)
    assert [o.get("text") for o in nb.cells[4].outputs] == ["the next cell ran\n"]
