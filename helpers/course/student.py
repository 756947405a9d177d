"""Student editions of the notebooks, for teachers (the teaching-assignments issue).

A notebook's exercise solutions sit between nbgrader's ``### BEGIN SOLUTION`` and
``### END SOLUTION`` markers, after an ``answer = None`` line, in a cell with nbgrader's
"autograded answer" metadata; the next cell, locked "autograder tests", calls a check from
:mod:`helpers.course.exercises`. :func:`mark_exercises` puts a notebook in that form. The student edition replaces every solution region with
``# YOUR CODE HERE`` (so the check reports "not answered yet" instead of crashing), keeps every
check and every verification cell, and clears all outputs. It uses nbgrader's own preprocessors
(``ClearSolutions``, ``ClearHiddenTests``, ``ClearOutput``), which need no course set-up.

    python -m helpers.course.student [OUT_DIR]      # default: student/, mirroring notebooks/
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from .nbfiles import write

ROOT = Path(__file__).resolve().parents[2]
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


EDITION_KEY = "workbook_edition"  # notebook metadata: the fingerprint of the edition a file was built from
STUDENT_DIR_ENV = "WORKBOOK_STUDENT_DIR"  # where ./workbook lab and ./workbook student keep the edition


def student_dir() -> Path:
    """The student edition's folder: ``$WORKBOOK_STUDENT_DIR``, else ``student/`` (git-ignored, so a
    ``git pull`` never touches a student's work)."""
    import os

    return Path(os.environ.get(STUDENT_DIR_ENV) or ROOT / "student")


def _is_answer(cell) -> bool:
    return cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution", False)


def edition_fingerprint(nb) -> str:
    """A hash of everything in a notebook but its answer cells and outputs: the same for an
    instructor notebook and its student edition, and unchanged by a student who only writes answers."""
    import hashlib

    h = hashlib.sha256()
    for cell in nb.cells:
        if not _is_answer(cell):
            h.update(f"{cell.cell_type}\0{cell.source}\0".encode())
    return h.hexdigest()[:16]


def answers(nb) -> dict[str, str]:
    """``{nbgrader grade id: source}`` of the notebook's answer cells."""
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if _is_answer(c) and "grade_id" in c.metadata.get("nbgrader", {})}


def _with_answers(new, kept: dict[str, str]):
    """``new`` (a fresh student edition) with the answer cells of ``kept`` put in by grade id; the
    grade ids of ``kept`` that ``new`` no longer has."""
    ids = set()
    for cell in new.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if _is_answer(cell) and gid in kept:
            cell.source = kept[gid]
            ids.add(gid)
    return new, sorted(set(kept) - ids)


def _edition(path: Path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    if not solution_cells(nb):
        raise ValueError(f"{path} has no exercise solutions between {BEGIN!r} markers")
    st = student_notebook(nb)
    st.metadata[EDITION_KEY] = edition_fingerprint(st)
    return st


def build(out_dir: Path | str | None = None, src_dir: Path | str = NOTEBOOKS, *, quiet: bool = True) -> list[Path]:
    """Write the student edition of every notebook under ``out_dir`` (same sub-folders; default
    :func:`student_dir`) and return the paths written. A student's work is never lost:

    * a notebook not there yet is written;
    * one whose edition is current is left as it is (answers and outputs too);
    * one the student changed only in its answer cells gets the new edition with those answers
      (matched by nbgrader grade id) put back in;
    * one the student changed elsewhere too (a cell added or edited) is kept as it is, and the new
      edition, with the student's answers put in, is written beside it as ``NAME.updated.ipynb``;
    * every file replaced is first copied to ``out_dir/.backup/<time>/`` (hidden from JupyterLab's
      file list); answers whose exercise the new edition no longer has stay only there.

    With ``quiet=False`` a line per notebook says which of these happened, and a summary follows.
    """
    import datetime
    import shutil

    import nbformat

    src_dir = Path(src_dir)
    out_dir = Path(out_dir) if out_dir is not None else student_dir()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    backup, n = out_dir / ".backup" / stamp, 1
    while backup.exists():  # two builds within a second: each keeps its own backups
        n += 1
        backup = out_dir / ".backup" / f"{stamp}-{n}"
    written, report = [], {"new": 0, "current": 0, "updated": 0, "kept": 0}

    def say(line):
        if not quiet:
            print(line)

    for path in notebook_paths(src_dir):
        rel = path.relative_to(src_dir)
        target = out_dir / rel
        new = _edition(path)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            write(new, target)
            written.append(target)
            report["new"] += 1
            say(f"new       {rel}")
            continue
        old = nbformat.read(target, as_version=4)
        built_from = old.metadata.get(EDITION_KEY)
        now = edition_fingerprint(old)
        if now == new.metadata[EDITION_KEY]:
            report["current"] += 1  # nothing changed upstream: the file stays, outputs and all
            continue
        merged, lost = _with_answers(new, answers(old))
        (backup / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(target, backup / rel)
        lost_note = f"; answers of {', '.join(lost)} (no longer in the edition) are in {backup / rel}" if lost else ""
        if built_from is not None and now == built_from:
            write(merged, target)
            written.append(target)
            report["updated"] += 1
            say(f"updated   {rel}: new edition, your {len(answers(old))} answer cells kept{lost_note}")
        else:
            beside = target.with_name(target.stem + ".updated.ipynb")
            if beside.exists():  # an earlier update's copy, perhaps worked in: kept too
                shutil.copy2(beside, backup / beside.relative_to(out_dir))
            write(merged, beside)
            written.append(beside)
            report["kept"] += 1
            say(f"kept      {rel}: you changed it outside its answer cells, so it stays as it is; the new "
                f"edition with your answers is beside it: {beside.name}{lost_note}")
    if not quiet:
        print(f"student edition in {out_dir}: {report['new']} new, {report['current']} current, "
              f"{report['updated']} updated with your answers kept, {report['kept']} kept with the new edition "
              f"beside" + (f"; backups of every replaced file in {backup}" if backup.exists() else ""))
    return written


def status(out_dir: Path | str | None = None, src_dir: Path | str = NOTEBOOKS) -> list[str]:
    """The notebooks whose student edition is missing or older than the instructor notebook (cheap:
    no nbgrader, the fingerprint is that of the instructor notebook's non-answer cells)."""
    import nbformat

    src_dir = Path(src_dir)
    out_dir = Path(out_dir) if out_dir is not None else student_dir()
    stale = []
    for path in notebook_paths(src_dir):
        target = out_dir / path.relative_to(src_dir)
        if not target.exists():
            stale.append(str(path.relative_to(src_dir)))
            continue
        if nbformat.read(target, as_version=4).metadata.get(EDITION_KEY) != edition_fingerprint(
                nbformat.read(path, as_version=4)):
            stale.append(str(path.relative_to(src_dir)))
    return stale


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
    parser = argparse.ArgumentParser(description="Build or update the student edition of every notebook "
                                     "(a student's answers are kept).")
    parser.add_argument("out_dir", nargs="?", default=None,
                        help=f"default: ${STUDENT_DIR_ENV}, else student/ (git-ignored)")
    parser.add_argument("--mark", action="store_true",
                        help="instead: give every notebook's exercises nbgrader's cells and metadata, in place")
    parser.add_argument("--status", action="store_true",
                        help="instead: list the notebooks whose student edition is missing or out of date")
    args = parser.parse_args(argv)
    if args.mark and (args.status or args.out_dir):
        parser.error("--mark changes notebooks/ in place: it takes no out_dir and no --status")
    if args.mark:
        for p in mark_all():
            print(p)
    elif args.status:
        for p in status(args.out_dir):
            print(p)
    else:
        build(args.out_dir, quiet=False)


if __name__ == "__main__":
    main()
