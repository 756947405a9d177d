"""Input checks shared by the helper modules: each raises ValueError naming the constraint."""
from __future__ import annotations

import math
import numbers


def positive_number(v, name: str, allow_zero: bool = False) -> float:
    """``v`` as a float; ValueError unless it is a finite number > 0 (>= 0 with ``allow_zero``)."""
    try:
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


def durations(values, name: str = "durations") -> list[float]:
    """Per-worker times as floats; ValueError unless a non-empty sequence of finite numbers >= 0."""
    try:
        xs = [float(x) for x in values]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of numbers, got {values!r}") from None
    if not xs:
        raise ValueError(f"{name} must hold at least one worker's time")
    if any(not math.isfinite(x) or x < 0 for x in xs):
        raise ValueError(f"{name} must be finite and >= 0 (no negative durations), got {values!r}")
    return xs


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
