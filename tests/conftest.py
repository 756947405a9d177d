"""Shared fixtures for the helper tests; the suite's figure check.

``WORKBOOK_CHECK_FIGURES=1``: every kernel nbval starts (it inherits this environment) checks each
figure a cell displays with ``helpers.course.readability`` and fails the cell on an unreadable one (text
under 9 px on a laptop, a legend over the data, a hatch, marker or colour the legend leaves out).
"""
import os

import pytest

os.environ.setdefault("WORKBOOK_CHECK_FIGURES", "1")


def _nothing():
    return None


@pytest.fixture
def warm_workers():
    """``warm_workers(n)`` starts ``n`` worker processes before a timed failure test, so its clock
    measures the job and not a pool start (a previous failure leaves no workers, and starting them
    takes seconds on a loaded CI machine)."""
    from helpers.launcher import launch

    return lambda n: launch(_nothing, world_size=n, quiet=True)


# The files that take longest, longest first: `./workbook test` runs files on 3 workers in the order
# collected (--no-loadscope-reorder), and one of these started last would run alone at the end.
# xdist's own order (most test items first) started the browser test and nbgrader's course, which
# have few items and take 2-3 minutes each, last: 7m21s instead of about 5 on the 2-core machine.
LONGEST_FIRST = (  # measured with benchmarks/suite_timeline.py (WORKBOOK_TEST_TIMELINE), longest first
    "tests/browser/",
    "tests/test_nbgrader_slowest.py",
    "tests/test_nbgrader_course.py",
    "notebooks/c12_parallelism_strategies/c12_3_2_ring_attention.ipynb",
    "tests/test_student_answers_hidden.py",
    "tests/test_student_edition.py",
    "notebooks/c12_parallelism_strategies/c12_3_1_sequence_parallel.ipynb",
    "notebooks/c12_parallelism_strategies/c12_4_1_choosing_a_mix.ipynb",
    "notebooks/c12_parallelism_strategies/c12_1_2_zero_fsdp.ipynb",
    "notebooks/p_parallel_processing/p13_scaling_experiment.ipynb",  # 73 s, started last on 2026-12-02
    "tests/test_fake_world.py",
    "notebooks/c12_parallelism_strategies/c12_2_1_tensor_parallel.ipynb",
    "notebooks/c12_parallelism_strategies/c12_2_2_pipeline.ipynb",
    "tests/test_fake_world_recipes.py",
    "tests/test_fake_world_interleaved.py",
    "tests/test_exercise_shortcuts.py",
)


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return next((i for i, p in enumerate(LONGEST_FIRST) if path.startswith(p)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: each file's own order is kept
