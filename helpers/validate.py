"""Input checks shared by the helper modules: each raises ValueError naming the constraint.

The one place for the small checks every section needs: a positive (or non-negative) number, an
integer at least some minimum, an index in [0, n), a probability, per-worker durations, and
"split n into k equal parts" (:func:`equal_parts`, whose message the caller words in its
section's terms). A module
with a check of its own (a degree that must divide the heads, a rank in range...) builds it on
these rather than writing the test again.
"""
from __future__ import annotations

import math
import numbers


def positive_number(v, name: str, allow_zero: bool = False) -> float:
    """``v`` as a float; ValueError unless it is a finite number > 0 (>= 0 with ``allow_zero``)."""
    try:
        if isinstance(v, (str, bytes)):
            raise TypeError
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {v!r}") from None
    if isinstance(v, bool) or not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {v!r}")
    return x


def integer_at_least(v, name: str, minimum: int = 1) -> int:
    """``v`` as an int; ValueError unless it is an integer >= ``minimum`` (booleans refused)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def index_below(v, name: str, n: int) -> int:
    """``v`` as an int; ValueError unless it is an integer in [0, n) (a rank, a position)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v < n:
        raise ValueError(f"{name} must be an integer in [0, {n}), got {v!r}")
    return int(v)


def zero_stage(v, name: str = "zero_stage") -> int:
    """``v`` as an int; ValueError unless it is a ZeRO stage: 0 (plain data parallelism), 1, 2 or 3."""
    if isinstance(v, bool) or v not in (0, 1, 2, 3):
        raise ValueError(f"{name} must be 0, 1, 2 or 3 (a ZeRO stage), got {v!r}")
    return int(v)


def probability(v, name: str, below_one: bool = False) -> float:
    """``v`` as a float; ValueError unless 0 <= v <= 1 (0 <= v < 1 with ``below_one``, e.g. a
    dropout probability, where 1 would drop everything)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(v, (bool, str, bytes)) or not (0 <= x < 1 if below_one else 0 <= x <= 1):
        raise ValueError(f"{name} must be in [0, {'1)' if below_one else '1]'}, got {v!r}")
    return x


def equal_parts(n: int, k: int, message: str = "{k} parts do not divide {n} items evenly ({n} % {k} = {r})") -> list[range]:
    """Indices 0..n-1 cut into ``k`` contiguous equal parts: part i is ``range(i n/k, (i+1) n/k)``.

    The one "split n into k equal parts" of the workbook (a batch over ranks, keys into blocks,
    layers into stages, a width over tensor-parallel ranks...). ValueError unless ``k`` divides
    ``n``, with ``message`` naming the constraint in the caller's words: ``{n}``, ``{k}`` and the
    remainder ``{r}`` are filled in.
    """
    n = integer_at_least(n, "n (the number of items to split)", 0)
    k = integer_at_least(k, "k (the number of equal parts)")
    if n % k:
        raise ValueError(message.format(n=n, k=k, r=n % k))
    size = n // k
    return [range(i * size, (i + 1) * size) for i in range(k)]


def durations(values, name: str = "durations") -> list[float]:
    """Per-worker times as floats; ValueError unless a non-empty sequence of finite numbers >= 0."""
    try:
        items = None if isinstance(values, (str, bytes)) else list(values)
        if items is None or any(isinstance(x, (str, bytes)) for x in items):
            raise TypeError
        xs = [float(x) for x in items]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of numbers, got {values!r}") from None
    if not xs:
        raise ValueError(f"{name} must hold at least one worker's time")
    if any(not math.isfinite(x) or x < 0 for x in xs):
        raise ValueError(f"{name} must be finite and >= 0 (no negative durations), got {values!r}")
    return xs


def one_of(v, name: str, options) -> str:
    """``v`` itself; ValueError unless it is one of ``options`` (a policy, a schedule, a mode by name)."""
    options = tuple(options)
    if isinstance(v, bool) or not any(v == o and type(v) is type(o) for o in options):
        raise ValueError(f"{name} must be one of {options}, got {v!r}")
    return v


def divides(d: int, n: int, constraint: str) -> None:
    """ValueError naming ``constraint`` unless the positive integer ``d`` divides ``n``."""
    if n % d:
        raise ValueError(f"{constraint}: {d} does not divide {n} (remainder {n % d})")


def product_is(factors: dict, total: int, what: str) -> None:
    """ValueError unless the product of ``factors`` (name -> integer) is ``total``; the message
    writes the product out, e.g. ``DP x TP x PP x CP = 2x2x2x1 = 8, not the world size 16``."""
    prod = 1
    for v in factors.values():
        prod *= v
    if prod != total:
        names = " x ".join(factors)
        vals = "x".join(str(v) for v in factors.values())
        raise ValueError(f"{names} = {vals} = {prod}, not {what} {total}")
