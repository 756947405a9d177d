"""nbval's check of a notebook, on a copy that another executor ran (nbgrader's autograde).

The suite executes each notebook once: the ones nbgrader's tests autograde from the instructor's
edition (the root conftest.py's ``CHECKED_UNDER_AUTOGRADE``) are not run again by nbval; their
tests call :func:`assert_outputs_as_stored` on the autograded copy instead, which checks what
``--nbval-lax`` would: the same code cells, and every ``# NBVAL_CHECK_OUTPUT`` cell's outputs equal
to the stored ones under nbval's own comparison (``IPyNbCell.compare_outputs``, with its
``IPyNbFile``'s skips). Error outputs are each test's own check.
"""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import nbformat
from nbval.plugin import IPyNbCell, coalesce_streams, find_comment_markers, find_metadata_tags, nocolors

ROOT = Path(__file__).resolve().parents[1]


class NbvalComparison:
    """nbval's comparison of one cell's outputs, outside a collected notebook."""

    compare_outputs, sanitize = IPyNbCell.compare_outputs, IPyNbCell.sanitize
    # IPyNbFile's skip_compare without --nbval-nbdime (nbval 0.11.0): metadata, counts, images, widget ids
    SKIP = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
            "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")

    def __init__(self):
        self.parent, self.colors = SimpleNamespace(skip_compare=self.SKIP, sanitize_patterns={}), nocolors
        self.comparison_traceback = []

    def same(self, executed, stored) -> bool:
        """What nbval's ``IPyNbCell.runtest`` does with a cell's outputs: each side's streams merged by
        name (``coalesce_streams``: a kernel flushes a long print in several messages), then compared."""
        return self.compare_outputs(coalesce_streams(copy.deepcopy(list(executed))),
                                    coalesce_streams(copy.deepcopy(list(stored))))

    def format_output_compare(self, key, left, right):
        self.comparison_traceback.append(f"{key}: stored {str(left)[-400:]!r}\n  executed {str(right)[-400:]!r}")


def nbval_check_cells(nb) -> list[int]:
    """Indices of the code cells ``--nbval-lax`` compares (``# NBVAL_CHECK_OUTPUT`` or its tag), by
    nbval's own marker parsing; a marker this check does not apply (skip, raises) is refused."""
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        options = dict(find_metadata_tags(cell.metadata))
        options.update(dict(find_comment_markers(cell.source)))
        unknown = set(options) - {"check"}
        assert not unknown, f"cell {i}: nbval option(s) {unknown} are not applied to autograded copies"
        if options.get("check"):
            out.append(i)
    return out


def assert_outputs_as_stored(path: Path, executed) -> None:
    """``executed`` (a notebook node) ran the code cells of ``path`` and every NBVAL_CHECK_OUTPUT
    cell shows the stored outputs."""
    stored = nbformat.read(path, as_version=4)
    code = lambda nb: [c.source for c in nb.cells if c.cell_type == "code"]
    assert code(executed) == code(stored), f"{path.name}: the executed copy has other code cells"
    checked = nbval_check_cells(stored)
    assert checked, f"{path.name}: no NBVAL_CHECK_OUTPUT cell"
    ran = [c for c in executed.cells if c.cell_type == "code"]
    index = {i: k for k, i in enumerate(i for i, c in enumerate(stored.cells) if c.cell_type == "code")}
    bad = []
    for i in checked:
        cmp = NbvalComparison()
        if not cmp.same(ran[index[i]].outputs, stored.cells[i].outputs):
            bad.append(f"cell {i}:\n  " + "\n  ".join(cmp.comparison_traceback))
    assert not bad, f"{path.name}: outputs differ from the stored ones:\n" + "\n".join(bad)


def checked_under_autograde(test_file: Path) -> list[str]:
    """The notebooks (paths from the checkout's root) that nbval leaves to ``test_file``, as the
    root conftest.py lists them."""
    spec = importlib.util.spec_from_file_location("workbook_root_conftest", ROOT / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    rel = test_file.resolve().relative_to(ROOT).as_posix()
    return sorted(nb for nb, test in conftest.CHECKED_UNDER_AUTOGRADE.items() if test == rel)
