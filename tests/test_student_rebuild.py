"""Rebuilding the student edition after an update keeps a student's work (issue 25, point 4)."""
import shutil

import nbformat
import pytest

from helpers import student

SRC = [p for p in student.NOTEBOOKS.rglob("*.ipynb") if p.stem in ("p04_amdahl", "p01_work_and_span")]


@pytest.fixture
def course(tmp_path):
    """A copy of two instructor notebooks (``src``) and their student edition (``out``)."""
    src, out = tmp_path / "src", tmp_path / "student"
    for p in SRC:
        (src / p.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(p, src / p.parent.name / p.name)
    student.build(out, src)
    return src, out


def _answer(nb, k):
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id", "").endswith(f"-ex{k}-answer")]
    return cell


def _edit(path, change):
    nb = nbformat.read(path, as_version=4)
    change(nb)
    nbformat.write(nb, path)


def _amdahl(root):
    return root / "p_parallel_processing" / "p04_amdahl.ipynb"


def _update_upstream(src):
    def change(nb):
        md = next(c for c in nb.cells if c.cell_type == "markdown")
        md.source += "\n\nA sentence added upstream."
    _edit(_amdahl(src), change)


def test_answers_are_kept_and_the_rest_comes_from_the_new_edition(course, capsys):
    src, out = course
    _edit(_amdahl(out), lambda nb: [setattr(_answer(nb, 1), "source", "answer_1 = 4.7  # mine"),
                                     setattr(_answer(nb, 2), "source", "answer_2 = 0.9  # mine")])
    other = out / "p_parallel_processing" / "p01_work_and_span.ipynb"
    other_before = (other.read_bytes(), other.stat().st_mtime_ns)
    _update_upstream(src)
    written = student.build(out, src, quiet=False)
    said = capsys.readouterr().out
    nb = nbformat.read(_amdahl(out), as_version=4)
    assert _answer(nb, 1).source == "answer_1 = 4.7  # mine" and _answer(nb, 2).source == "answer_2 = 0.9  # mine"
    assert "A sentence added upstream." in next(c for c in nb.cells if c.cell_type == "markdown").source
    assert written == [_amdahl(out)]
    assert (other.read_bytes(), other.stat().st_mtime_ns) == other_before  # an unchanged notebook is not rewritten
    (backup,) = (out / ".backup").iterdir()
    kept = nbformat.read(backup / "p_parallel_processing" / "p04_amdahl.ipynb", as_version=4)
    assert _answer(kept, 1).source == "answer_1 = 4.7  # mine"
    assert "updated   p_parallel_processing/p04_amdahl.ipynb" in said and "1 current, 1 updated" in said


def test_a_notebook_changed_outside_its_answers_is_kept_with_the_new_edition_beside(course, capsys):
    src, out = course
    def mine(nb):
        _answer(nb, 1).source = "answer_1 = 4.7"
        nb.cells.append(nbformat.v4.new_markdown_cell("my own notes"))
    _edit(_amdahl(out), mine)
    before = _amdahl(out).read_bytes()
    _update_upstream(src)
    student.build(out, src, quiet=False)
    assert _amdahl(out).read_bytes() == before
    beside = nbformat.read(_amdahl(out).with_name("p04_amdahl.updated.ipynb"), as_version=4)
    assert _answer(beside, 1).source == "answer_1 = 4.7"
    assert "kept      p_parallel_processing/p04_amdahl.ipynb" in capsys.readouterr().out
    # the copy beside may be worked in: a second update keeps it in a backup before replacing it
    _edit(_amdahl(out).with_name("p04_amdahl.updated.ipynb"), lambda nb: setattr(_answer(nb, 2), "source", "answer_2 = 1"))
    _update_upstream(src)
    student.build(out, src)
    assert len(list((out / ".backup").iterdir())) == 2  # each build its own backup folder
    backups = sorted((out / ".backup").rglob("p04_amdahl.updated.ipynb"))
    assert len(backups) == 1 and _answer(nbformat.read(backups[-1], as_version=4), 2).source == "answer_2 = 1"


def test_nothing_is_rewritten_when_nothing_changed_upstream(course):
    src, out = course
    _edit(_amdahl(out), lambda nb: setattr(_answer(nb, 1), "source", "answer_1 = 4.7"))
    stamps = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*.ipynb")}
    assert student.build(out, src) == []
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*.ipynb")} == stamps
    assert not (out / ".backup").exists()


def test_an_answer_whose_exercise_is_gone_is_named_and_kept_in_the_backup(course, capsys):
    src, out = course
    _edit(_amdahl(out), lambda nb: setattr(_answer(nb, 3), "source", "answer_3 = 7"))
    def drop_ex3(nb):
        nb.cells = [c for c in nb.cells if not c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("p04-ex3")]
    _edit(_amdahl(src), drop_ex3)
    student.build(out, src, quiet=False)
    said = capsys.readouterr().out
    assert "p04-ex3-answer" in said and ".backup" in said
    (backup,) = (out / ".backup").iterdir()
    assert _answer(nbformat.read(backup / "p_parallel_processing" / "p04_amdahl.ipynb", as_version=4), 3).source == \
        "answer_3 = 7"


def test_status_names_missing_and_stale_editions(course):
    src, out = course
    assert student.status(out, src) == []
    _update_upstream(src)
    (out / "p_parallel_processing" / "p01_work_and_span.ipynb").unlink()
    assert student.status(out, src) == ["p_parallel_processing/p01_work_and_span.ipynb",
                                        "p_parallel_processing/p04_amdahl.ipynb"]
