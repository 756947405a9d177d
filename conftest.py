"""Suite-wide guards, for every test and every notebook that pytest collects.

* **Nothing written inside the checkout.** A test that writes into the working tree can be read
  mid-write by another worker (issue 23: the browser test's saves made a notebook read as an empty
  file). The controller notes the size and modification time of every file in the checkout, tracked,
  untracked and ignored (except ``.venv/``, ``__pycache__/`` and ``*.egg-info/``, which the
  environment writes), before the first test and after the last; any difference fails the run and
  is named.
* **Traces outside the checkout.** The notebooks keep their profiler traces with
  ``helpers.launcher.traces.keep``; under the suite they go to a temporary folder (``WORKBOOK_TRACES``),
  which the kernels nbval starts inherit.
* **nbval's wait for a cell's outputs.** nbval reads a cell's outputs from the kernel's IOPub
  channel after the execute reply, allowing 5 s per message (``output_timeout``, fixed in its
  ``IPyNbCell``); past that it stops the kernel and fails the cell with "Timeout of 5 seconds
  exceeded waiting for output", with no traceback. On CI's 2 cores, loaded by three workers whose
  notebooks launch ranks, an idle message can trail its reply by more than that: P.14's first
  arithmetic cell failed "Notebook cell execution failed" once in four full runs (2026-12-02) and
  passed alone every time. :data:`NBVAL_OUTPUT_TIMEOUT` raises the allowance; the cell's own limit
  (``--nbval-cell-timeout``) is unchanged.
* **Each notebook executed once.** Three notebooks (:data:`CHECKED_UNDER_AUTOGRADE`: 12.4.2 and P.14,
  the slowest, and P.6, the course test's) are executed from their instructor editions by nbgrader's
  autograde in the nbgrader tests, which then check what nbval would (no error output; every
  ``NBVAL_CHECK_OUTPUT`` cell's outputs equal to the stored ones, with nbval's own comparison:
  ``tests/nbval_outputs.py``). When that test file is collected, nbval does not run them a second
  time (about 110 worker-seconds of the suite, 2026-12-02); named on the command line, nbval runs them.
* **Each fake-world configuration traced once.** ``WORKBOOK_FAKE_WORLD_MEMO`` names a temporary
  folder for the run (removed at its end), which every worker and kernel inherits:
  :mod:`helpers.fake_world.memo` answers a ``simulate`` call made before in the run from there
  (12.4.1's chapter cases are traced by nbval's kernel and the browser test's, 12.1.1's by nbval's
  and the student edition's).
* **Kernels over Unix sockets.** nbval's kernels (and the student-edition tests', through
  :mod:`helpers.course.nbexec`) use IPC transport: no TCP port for another process to take first.
* ``WORKBOOK_TEST_TIMELINE=FILE`` appends one JSON line per test (worker, id, start, end, in
  seconds since the epoch) for profiling the suite's schedule; ``benchmarks/suite_timeline.py``
  reads it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
SKIP_PARTS = {".venv", "__pycache__", ".git"}
_TIMELINE = os.environ.get("WORKBOOK_TEST_TIMELINE")
NBVAL_OUTPUT_TIMEOUT = 60.0  # seconds nbval waits for each IOPub message once a cell has replied
# checked on nbgrader's autograded copy instead of by nbval (docstring; tests/test_nbgrader_slowest.py)
CHECKED_UNDER_AUTOGRADE = {  # notebook: the test file that autogrades its instructor edition
    "notebooks/c12_parallelism_strategies/c12_4_2_case_studies.ipynb": "tests/test_nbgrader_slowest.py",
    "notebooks/p_parallel_processing/p14_failure_modes.ipynb": "tests/test_nbgrader_slowest.py",
    "notebooks/p_parallel_processing/p06_data_parallelism.ipynb": "tests/test_nbgrader_course.py",
}
_starts: dict[str, float] = {}
_xdist_controller = False


def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


def _git_files(root: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", *args], cwd=root, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split("\0") if p]


def _files_under(path: Path):
    if not path.is_dir():
        yield path
        return
    for folder, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in SKIP_PARTS]
        yield from (Path(folder) / f for f in files)


def checkout_snapshot(root: Path = ROOT) -> dict[str, tuple[int, int]] | None:
    """``{path: (size, mtime_ns)}`` of every file of the checkout but the environment's, or None
    outside a git checkout."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    listed = _git_files(root) + _git_files(root, "--others", "--exclude-standard")
    listed += _git_files(root, "--others", "--ignored", "--exclude-standard", "--directory")
    snap: dict[str, tuple[int, int]] = {}
    for rel in listed:
        parts = set(Path(rel).parts)
        if parts & SKIP_PARTS or any(p.endswith(".egg-info") for p in parts):
            continue
        for f in _files_under(root / rel):
            try:
                st = f.stat()
            except FileNotFoundError:  # a tracked file deleted in the working tree
                continue
            snap[f.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return snap


def changed_paths(before: dict, after: dict) -> list[str]:
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def _nbval_kernels_over_ipc():
    """nbval's kernels talk over Unix sockets, not TCP ports (helpers.course.nbexec: a port taken
    between jupyter_client's choice and the kernel's bind killed an nbval kernel at its start)."""
    import nbval.kernel

    from helpers.course.nbexec import BlockingKernelManager

    nbval.kernel.KernelManager = BlockingKernelManager


def pytest_configure(config):
    global _xdist_controller
    _nbval_kernels_over_ipc()
    _xdist_controller = _is_controller(config) and bool(getattr(config.option, "numprocesses", None))
    if _is_controller(config):
        config._checkout_before = checkout_snapshot()
        # one folder for every worker's (and kernel's) kept traces, removed at the end
        if "WORKBOOK_TRACES" not in os.environ:
            config._traces_dir = tempfile.mkdtemp(prefix="workbook-traces-")
            os.environ["WORKBOOK_TRACES"] = config._traces_dir  # xdist's workers inherit it
        # each fake-world configuration traced once in the run, whichever process asks first
        if "WORKBOOK_FAKE_WORLD_MEMO" not in os.environ:
            config._memo_dir = tempfile.mkdtemp(prefix="workbook-fake-world-")
            os.environ["WORKBOOK_FAKE_WORLD_MEMO"] = config._memo_dir


def _collects(config, target: Path) -> bool:
    """Whether the command line's paths include ``target`` (it, or a folder above it)."""
    base = Path(config.invocation_params.dir)
    for arg in config.args:
        path = (base / arg.split("::")[0]).resolve()
        if path == target or path in target.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    """nbval skips :data:`CHECKED_UNDER_AUTOGRADE` when the autograde test that checks them runs
    (a notebook named on the command line is collected all the same: pytest asks this hook only
    of the files it finds in folders)."""
    path = Path(collection_path).resolve()
    test = next((t for nb, t in CHECKED_UNDER_AUTOGRADE.items() if path == ROOT / nb), None)
    if test is not None and _collects(config, ROOT / test):
        return True
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Give every nbval cell :data:`NBVAL_OUTPUT_TIMEOUT` to deliver its outputs (see the docstring)."""
    for item in items:
        if getattr(item, "output_timeout", None) is not None:
            item.output_timeout = max(item.output_timeout, NBVAL_OUTPUT_TIMEOUT)


def pytest_runtest_logstart(nodeid, location):
    # on the process that runs the test (an xdist worker, or pytest alone); xdist's controller
    # sees the same events again from the workers' reports
    if _TIMELINE and (os.environ.get("PYTEST_XDIST_WORKER") or not _xdist_controller):
        _starts[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid, location):
    if _TIMELINE and nodeid in _starts:
        row = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "id": nodeid,
               "start": _starts.pop(nodeid), "end": time.time()}
        with open(_TIMELINE, "a") as f:
            f.write(json.dumps(row) + "\n")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if not _is_controller(config):
        return
    for folder in (getattr(config, "_traces_dir", None), getattr(config, "_memo_dir", None)):
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    before = getattr(config, "_checkout_before", None)
    if before is None:
        return
    config._checkout_changed = changed_paths(before, checkout_snapshot() or {})
    if config._checkout_changed and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _is_controller(config):
        return
    if getattr(config, "_checkout_before", 0) is None:
        terminalreporter.write_line("checkout guard off: not a git checkout (nothing compared)")
        return
    changed = getattr(config, "_checkout_changed", [])
    if changed:
        terminalreporter.write_sep("=", "the suite wrote inside the checkout", red=True)
        terminalreporter.write_line("No test may write into the working tree (a worker can read a file mid-write).")
        terminalreporter.write_line("Created, changed or removed while the suite ran:")
        for p in changed[:50]:
            terminalreporter.write_line(f"  {p}")
        if len(changed) > 50:
            terminalreporter.write_line(f"  ... and {len(changed) - 50} more")
