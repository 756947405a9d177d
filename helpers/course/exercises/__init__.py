"""Checks for the exercises that end every notebook.

Each notebook's exercises live in a module of this package named after the notebook
(``helpers.course.exercises.p06`` for P.6). A check prints a short confirmation when the answer is
right; when it is wrong it raises :class:`CheckFailed` with a message that says what kind of answer
was expected and a hint, never the answer itself. An answer still ``None`` (the student edition's
starting point) gets "not answered yet" (:class:`NotAnswered`).

What a student sees of a failed check is its message and nothing else (issue 25): IPython prints an
exception's traceback, source lines included, in JupyterLab and in nbgrader's feedback, and the
line of ``helpers/course/exercises/<nb>.py`` that raised holds the expected value. So every exercise check
is decorated with :func:`exercise`: whatever goes wrong inside it leaves as a :class:`CheckFailed`,
raised ``from None``, whose ``_render_traceback_`` is its one-line message; an unexpected exception
(a malformed answer the check could not read) becomes "the answer could not be checked: <type>:
<message>". It stays an ``error`` output with ``ename``/``evalue``: nbgrader scores the cell 0, nbval
fails it.

Inside an IPython kernel a failed check does not stop the cells queued after it (JupyterLab's Run
All): a ``post_run_cell`` hook marks a cell whose only error is a :class:`CheckFailed` as executed,
after IPython has shown the error. The check still raises (the rest of its cell does not run, a
``try`` around it sees the exception) and its output is still an error. ``./workbook refresh`` sets
``WORKBOOK_STOP_ON_FAILED_CHECK=1``, under which a failed check stops the run like any error.
"""
from __future__ import annotations

import functools
import math
import numbers
import os
import sys

from ...launcher import Run
from ...pipeline_schedule import simulate


class CheckFailed(AssertionError):
    """A check's verdict on an answer; displayed by IPython as its message alone."""

    _workbook_check_failure = True  # what the kernel hook looks for (a class attribute survives a reload)

    def _render_traceback_(self):
        return [f"{type(self).__name__}: {self}"]


class NotAnswered(CheckFailed):
    """The exercise's answer variable is still None."""


def _reason(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def exercise(check):
    """Decorator of every exercise check (``exN`` in the modules of this package): a failure leaves
    it as a :class:`CheckFailed` carrying only its message, raised ``from None`` without the frames
    of the checking code; any other exception (``AssertionError`` included) becomes a
    :class:`CheckFailed` that says the answer could not be checked, naming the exception's type and
    message."""

    @functools.wraps(check)
    def run_check(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except CheckFailed as failed:
            failure = failed.with_traceback(None)
        except Exception as exc:  # noqa: BLE001 (any exception of a check is the student's to read)
            failure = CheckFailed(f"the answer could not be checked: {type(exc).__name__}: {_reason(exc)}")
        raise failure from None

    run_check.__exercise__ = True
    return run_check


def _continue_after_failed_check(result) -> None:
    """IPython ``post_run_cell`` hook: a cell whose error is a failed check counts as executed (its
    error output is already shown), so the kernel does not abort the cells queued after it."""
    if getattr(getattr(result, "error_in_exec", None), "_workbook_check_failure", False):
        result.error_in_exec = None


def _install_kernel_hook() -> None:
    if os.environ.get("WORKBOOK_STOP_ON_FAILED_CHECK"):
        return
    ipython = sys.modules.get("IPython")  # a process that never imported IPython runs no shell
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or getattr(shell, "_workbook_check_hook", False):
        return
    shell.events.register("post_run_cell", _continue_after_failed_check)
    shell._workbook_check_hook = True


_install_kernel_hook()


def require(answer, what: str):
    if answer is None:
        raise NotAnswered(f"not answered yet: set the answer variable to {what}, then run this cell again")


def tolerance_text(rel: float) -> str:
    """A relative tolerance as a percentage that does not round to 0: 1e-3 -> "0.1%", 1e-6 -> "0.0001%"."""
    return f"{rel * 100:.2g}%"


def unit_slip(answer: float, expected: float, rel: float = 1e-3) -> bool:
    """``answer`` is ``expected`` times a power of 1000 or of 1024 other than 1 (within ``rel``, at
    least 0.1%): the number is right and its unit is not (bytes where GB are asked, ms for s)."""
    if answer == 0 or expected == 0 or (answer > 0) != (expected > 0):
        return False
    ratio = answer / expected
    for base in (1000.0, 1024.0):
        k = round(math.log(ratio, base))
        if k != 0 and abs(k) <= 6 and math.isclose(ratio, base ** k, rel_tol=max(rel, 1e-3)):
            return True
    return False


def check_number(answer, expected: float, *, what: str, rel: float = 1e-3, hint: str = "") -> None:
    """A real number within ``rel`` relative tolerance of ``expected``."""
    require(answer, what)
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real) or math.isnan(float(answer)):
        raise CheckFailed(f"expected {what} (a real number), got {type(answer).__name__} {answer!r}")
    if not math.isclose(float(answer), float(expected), rel_tol=rel, abs_tol=1e-12):
        if unit_slip(float(answer), float(expected), rel):
            raise CheckFailed(f"not quite: check the unit: your number is a power of 1000 (or of 1024) away from "
                              f"{what}, as bytes are from GB or milliseconds from seconds")
        raise CheckFailed(f"not quite: {what} is off by more than {tolerance_text(rel)}. {hint}".strip())
    print(f"correct: {what}")


def check_int(answer, expected: int, *, what: str, hint: str = "") -> None:
    """An integer equal to ``expected``."""
    require(answer, what)
    if isinstance(answer, bool) or not isinstance(answer, numbers.Integral):
        raise CheckFailed(f"expected {what} as an integer, got {type(answer).__name__} {answer!r}")
    if int(answer) != int(expected):
        raise CheckFailed(f"not quite: that is not {what}. {hint}".strip())
    print(f"correct: {what}")


def check_choice(answer, expected, *, what: str, options, hint: str = "") -> None:
    """One of ``options``, equal to ``expected``. ``None`` is never an option: it means "not answered"."""
    if any(o is None for o in options):
        raise ValueError(f"None cannot be one of the options {list(options)}: it is the unanswered state")
    require(answer, f"one of {list(options)}")
    if answer not in options:
        raise CheckFailed(f"expected {what}: one of {list(options)}, got {answer!r}")
    if answer != expected:
        raise CheckFailed(f"not quite: {answer!r} is not {what}. {hint}".strip())
    print(f"correct: {what}")


def check_true(ok: bool, *, what: str, hint: str = "") -> None:
    """A property of the student's own code or data holds (for open-ended exercises)."""
    if not ok:
        raise CheckFailed(f"not yet: {what}. {hint}".strip())
    print(f"correct: {what}")


# ---- exercises on the ranks ------------------------------------------------------------------------
# An exercise that asks for work on the ranks takes the Run that launch returned, so its check can
# read what happened there: the world size, every rank's result, its communication log and its spans.

def reject(message: str, hint: str = ""):
    """Raise the check's rejection: what was found, against what the exercise asks."""
    raise CheckFailed(f"not yet: {message}. {hint}".strip())


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def check_run(run, world: int, *, ops: dict | None = None, absent=(), hint: str = "") -> None:
    """``run`` is the Run of a launch on ``world`` ranks in which every rank issued at least
    ``ops[op]`` calls of each ``op`` (its communication log says so) and none of ``absent``."""

    require(run, f"the Run that launch returned (a launch on {_plural(world, 'rank')})")
    if not isinstance(run, Run):
        reject(f"expected the Run that launch returns (the check reads what every rank computed and "
               f"communicated), got {type(run).__name__}", "Pass launch's return value itself, not its results.")
    if run.world_size != world:
        reject(f"your launch ran on {_plural(run.world_size, 'rank')}; the exercise asks for {world}",
               f"Launch with world_size={world}.")
    for op, n in (ops or {}).items():
        for r in range(world):
            got = run.count(op, r)
            if got < n:
                reject(f"rank {r} issued {_plural(got, op + ' call')}; the exercise's method needs at least {n} on "
                       f"every rank", hint)
    for op in absent:
        for r in range(world):
            if run.count(op, r):
                reject(f"rank {r} issued {_plural(run.count(op, r), op + ' call')}; the exercise's method uses none", hint)


def check_parts(run, want: list, *, pair: str, wrong: str, hint: str = "", rtol: float = 1e-10, atol: float = 1e-12):
    """Every rank returned a pair whose first item, its own part of the work, equals ``want[rank]``:
    the partition the exercise asks for. ``pair`` names the two items; ``wrong`` (with ``{r}``)
    says what rank r's part is not."""
    import numpy as np

    if not all(isinstance(x, (list, tuple)) and len(x) == 2 for x in run.results):
        reject(f"every rank must return a pair ({pair})")
    for r, w in enumerate(want):
        got = np.asarray(run.results[r][0])
        if got.shape != np.shape(w) or not np.allclose(got, w, rtol=rtol, atol=atol):
            reject(wrong.format(r=r), hint)


def op_bytes(run, op: str, rank: int) -> list[int]:
    """Payload bytes of each ``op`` call rank ``rank`` issued, in order."""
    return [o.bytes for o in run.comm[rank] if o.op == op]


SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "zb-h1": "zero-bubble (ZB-H1)"}


def step_order(run, rank: int) -> str:
    """Rank ``rank``'s pipeline steps as it recorded them in its spans, e.g. ``"FFBB"``."""
    return "".join(s.name for s in run.spans[rank] if s.name in ("F", "B", "W"))


def simulated_order(schedule: str, p: int, m: int, device: int) -> str:
    """Device ``device``'s steps in the schedule simulator's timeline (:mod:`helpers.pipeline_schedule`)."""

    return "".join(o.kind for o in simulate(schedule, p, m).device_ops(device))


def check_pipeline_order(run, schedule: str, m: int, *, stage_of=None, repeats: int = 1) -> None:
    """Every rank's recorded F/B/W steps are ``schedule``'s order with ``m`` micro-batches (``repeats``
    times: one per training step). ``stage_of(rank)`` gives a rank's pipeline stage and the pipeline
    depth as ``(stage, p)``; default: stage = rank, p = world size."""
    for r in range(run.world_size):
        stage, p = stage_of(r) if stage_of else (r, run.world_size)
        got = step_order(run, r)
        if got == simulated_order(schedule, p, m, stage) * repeats:
            continue
        if got.count("F") != m * repeats:
            reject(f"rank {r} recorded {got.count('F')} forward (F) steps; the exercise asks for m = {m} "
                   f"micro-batches{f' in each of {repeats} steps' if repeats > 1 else ''}")
        like = [s for s in SCHEDULE_NAMES if got == simulated_order(s, p, m, stage) * repeats]
        found = f"is {SCHEDULE_NAMES[like[0]]}'s" if like else "matches none of GPipe, 1F1B and ZB-H1"
        reject(f"rank {r}'s order of F/B/W steps {found}, not {SCHEDULE_NAMES[schedule]}'s",
               f"Run the {SCHEDULE_NAMES[schedule]} schedule.")
