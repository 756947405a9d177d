"""The teacher's nbgrader path of docs/teaching.md, end to end on one notebook (P.6): a course
directory configured by docs/nbgrader_config.py, ``generate_assignment``, four submissions,
``autograde``, and the scores read back from the gradebook. A complete answer scores full marks,
an unanswered copy zero, and a mixed one exactly the exercises it got right, although it also
replaced the locked check cells of the exercises it got wrong or left blank by ``pass`` (had
nbgrader run the edited cells, those would have scored): editing a locked cell gains nothing.
Three submissions, each a full execution of P.6 (the fourth, a separate tamperer, repeated what
the mixed one shows); the complete one is also the suite's one run of P.6, whose stored outputs it
must show (nbval does not run P.6 again: the root conftest.py).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbval_outputs import assert_outputs_as_stored, checked_under_autograde

from helpers import student

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "notebooks" / "p_parallel_processing" / "p06_data_parallelism.ipynb"
ASSIGNMENT = "p06"
# the exercises of the assignment, by number, read from the notebook's locked check cells
STUDENTS = ("complete", "blank", "mixed")
EXERCISES = [k for k in range(1, 20) if f'"grade_id": "{ASSIGNMENT}-ex{k}-check"' in SOURCE.read_text()]


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # nbgrader runs the `alembic` executable to create its database: it must be on PATH, which it
    # is in an activated environment (docs/teaching.md says so)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _cell(nb, k: int, part: str):
    """Exercise ``k``'s ``answer`` or ``check`` cell, found by its nbgrader grade id."""
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == f"{ASSIGNMENT}-ex{k}-{part}"]
    return cell


def _submit(course: Path, who: str, nb) -> None:
    folder = course / "submitted" / who / ASSIGNMENT
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / SOURCE.name)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
    config = (ROOT / "docs" / "nbgrader_config.py").read_text()  # the one docs/teaching.md hands out
    (course / "nbgrader_config.py").write_text(config + f"c.CourseDirectory.root = {str(course)!r}\n")
    (course / "source" / ASSIGNMENT).mkdir(parents=True)
    shutil.copy(SOURCE, course / "source" / ASSIGNMENT)
    (course / "students.csv").write_text("id\n" + "\n".join(STUDENTS) + "\n")
    _nbgrader(course, "db", "student", "import", "students.csv")  # one nbgrader start, not one per student
    _nbgrader(course, "db", "assignment", "add", ASSIGNMENT)
    _nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")
    released = nbformat.read(course / "release" / ASSIGNMENT / SOURCE.name, as_version=4)
    instructor = nbformat.read(SOURCE, as_version=4)

    _submit(course, "complete", instructor)  # every solution in place
    _submit(course, "blank", released)  # handed in untouched
    mixed = nbformat.read(course / "release" / ASSIGNMENT / SOURCE.name, as_version=4)
    _cell(mixed, 1, "answer").source = _cell(instructor, 1, "answer").source  # right
    _cell(mixed, 2, "answer").source = "answer_2 = 1.0"  # wrong (the right answer is 4 * 20 / 32 = 2.5)
    for k in EXERCISES[1:]:
        _cell(mixed, k, "check").source = "pass  # no check here"  # a locked cell, edited
    _submit(course, "mixed", mixed)

    _nbgrader(course, "autograde", ASSIGNMENT, "--force")
    _nbgrader(course, "generate_feedback", ASSIGNMENT)
    feedback = {who: (course / "feedback" / who / ASSIGNMENT / SOURCE.with_suffix(".html").name).read_text()
                for who in ("complete", "mixed")}
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        scores = {}
        for who in STUDENTS:
            (nb,) = gb.find_submission(ASSIGNMENT, who).notebooks
            scores[who] = {g.name: (g.auto_score, g.max_score) for g in nb.grades}
    blank, complete = (nbformat.read(course / "autograded" / who / ASSIGNMENT / SOURCE.name, as_version=4)
                       for who in ("blank", "complete"))
    return {"released": released, "scores": scores, "feedback": feedback, "blank": blank, "complete": complete}


def test_generate_assignment_releases_what_our_student_build_writes(graded):
    # with docs/nbgrader_config.py, nbgrader's release and `./workbook student` are the same notebook
    ours = student.student_notebook(nbformat.read(SOURCE, as_version=4))
    assert [c.source for c in graded["released"].cells] == [c.source for c in ours.cells]


def test_autograde_gives_full_marks_to_the_instructor_solutions(graded):
    assert len(EXERCISES) >= 3 and EXERCISES == list(range(1, len(EXERCISES) + 1))
    assert graded["scores"]["complete"] == {f"p06-ex{k}-check": (1.0, 1.0) for k in EXERCISES}


def test_autograde_gives_zero_to_an_unanswered_copy(graded):
    assert graded["scores"]["blank"] == {f"p06-ex{k}-check": (0.0, 1.0) for k in EXERCISES}


def test_autograde_scores_each_exercise_on_its_own_and_editing_a_locked_check_earns_nothing(graded):
    # exercises 2.. had their check cells replaced by `pass`: autograde restores locked cells from
    # the source before running them, so they score what their (wrong or blank) answers earn
    assert graded["scores"]["mixed"] == {f"p06-ex{k}-check": (1.0 if k == 1 else 0.0, 1.0) for k in EXERCISES}


def test_feedback_shows_each_student_their_score(graded):
    n = len(EXERCISES)
    assert f"Score: {n}.0 / {n}.0" in graded["feedback"]["complete"]
    assert f"Score: 1.0 / {n}.0" in graded["feedback"]["mixed"]


def test_feedback_shows_a_failed_check_as_its_message_alone(graded):
    # the mixed copy answered exercise 2 wrong: its feedback says why, and shows nothing of the check's
    # code (the traceback showed helpers/course/exercises/p06.py's line holding the expected 4 * 20 / 32)
    html = graded["feedback"]["mixed"]
    assert "CheckFailed: not quite: the loss scale" in html and "NotAnswered: not answered yet" in html
    assert "helpers/course/exercises" not in html and "most recent call last" not in html


def test_an_untouched_edition_runs_to_the_end_and_every_check_says_not_answered(graded):
    # the student edition as handed out, executed whole by nbgrader: each check cell (and nothing else)
    # shows one error, "not answered yet", as its message alone (no frame of the checking code)
    nb = graded["blank"]
    checks = [i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id", "").endswith("-check")]
    errors = [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert [i for i, _ in errors] == checks, [(i, o.ename, o.evalue) for i, o in errors]
    for _, o in errors:
        assert o.ename == "NotAnswered" and "not answered yet" in o.evalue, (o.ename, o.evalue)
        assert o.traceback == [f"{o.ename}: {o.evalue}"], o.traceback
    assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")


def test_nbval_leaves_p6_to_this_file():
    assert checked_under_autograde(Path(__file__)) == [SOURCE.relative_to(ROOT).as_posix()]


def test_the_instructor_edition_autograded_shows_the_stored_outputs(graded):
    # what nbval would check of P.6, which it does not run again in the suite (the root conftest.py)
    nb = graded["complete"]
    errors = [(i, o.ename, o.evalue) for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors, errors
    assert_outputs_as_stored(SOURCE, nb)
