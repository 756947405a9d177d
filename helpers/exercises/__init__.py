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


# ---- exercises on the ranks ------------------------------------------------------------------------
# An exercise that asks for work on the ranks takes the Run that launch() returned, so its check can
# read what happened there: the world size, every rank's result, its communication log and its spans.

def reject(message: str, hint: str = ""):
    """Raise the check's rejection: what was found, against what the exercise asks."""
    raise AssertionError(f"not yet: {message}. {hint}".strip())


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def check_run(run, world: int, *, ops: dict | None = None, absent=(), hint: str = "") -> None:
    """``run`` is the Run of a launch on ``world`` ranks in which every rank issued at least
    ``ops[op]`` calls of each ``op`` (its communication log says so) and none of ``absent``."""
    from ..launcher import Run

    require(run, f"the Run that launch(..., world_size={world}) returned")
    if not isinstance(run, Run):
        reject(f"expected the Run that launch(...) returns (the check reads what every rank computed and "
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
    from ..pipeline_schedule import simulate

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
