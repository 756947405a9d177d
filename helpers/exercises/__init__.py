"""Checks for the exercises that end every notebook.

Each notebook's exercises live in a module of this package named after the notebook
(``helpers.exercises.p06`` for P.6). A check prints a short confirmation when the answer is
right; when it is wrong it raises ``AssertionError`` with a message that says what kind of answer
was expected and a hint, never the answer itself. An answer still ``None`` (the student edition's
starting point) gets "not answered yet".
"""
from __future__ import annotations

import math
import numbers


class NotAnswered(AssertionError):
    """The exercise's answer variable is still None."""


def require(answer, what: str):
    if answer is None:
        raise NotAnswered(f"not answered yet: set the answer variable to {what}, then run this cell again")


def check_number(answer, expected: float, *, what: str, rel: float = 1e-3, hint: str = "") -> None:
    """A real number within ``rel`` relative tolerance of ``expected``."""
    require(answer, what)
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real) or math.isnan(float(answer)):
        raise AssertionError(f"expected {what} (a real number), got {type(answer).__name__} {answer!r}")
    if not math.isclose(float(answer), float(expected), rel_tol=rel, abs_tol=1e-12):
        raise AssertionError(f"not quite: {what} is off by more than {rel:.1%}. {hint}".strip())
    print(f"correct: {what}")


def check_int(answer, expected: int, *, what: str, hint: str = "") -> None:
    """An integer equal to ``expected``."""
    require(answer, what)
    if isinstance(answer, bool) or not isinstance(answer, numbers.Integral):
        raise AssertionError(f"expected {what} as an integer, got {type(answer).__name__} {answer!r}")
    if int(answer) != int(expected):
        raise AssertionError(f"not quite: that is not {what}. {hint}".strip())
    print(f"correct: {what}")


def check_choice(answer, expected, *, what: str, options, hint: str = "") -> None:
    """One of ``options``, equal to ``expected``."""
    require(answer, f"one of {list(options)}")
    if answer not in options:
        raise AssertionError(f"expected {what}: one of {list(options)}, got {answer!r}")
    if answer != expected:
        raise AssertionError(f"not quite: {answer!r} is not {what}. {hint}".strip())
    print(f"correct: {what}")


def check_true(ok: bool, *, what: str, hint: str = "") -> None:
    """A property of the student's own code or data holds (for open-ended exercises)."""
    if not ok:
        raise AssertionError(f"not yet: {what}. {hint}".strip())
    print(f"correct: {what}")
