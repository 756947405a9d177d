"""helpers.validate: the one set of input checks every helper module uses."""
from fractions import Fraction

import numpy as np
import pytest

from helpers import validate as V


def test_accepted_values_come_back_converted():
    assert V.positive_number(3, "x") == 3.0 and isinstance(V.positive_number(3, "x"), float)
    assert V.positive_number(0, "x", allow_zero=True) == 0.0
    assert V.positive_number(np.float32(0.5), "x") == 0.5 and V.positive_number(Fraction(1, 4), "x") == 0.25
    assert V.integer_at_least(np.int64(4), "n") == 4 and V.integer_at_least(0, "n", 0) == 0
    assert V.index_below(3, "rank", 4) == 3
    assert V.zero_stage(3) == 3 and V.zero_stage(0) == 0
    assert V.one_of("fp64", "precision", ("fp32", "fp64")) == "fp64"
    assert V.probability(1, "p") == 1.0 and V.probability(0, "p", below_one=True) == 0.0
    assert V.durations(x for x in (1, 2.5)) == [1.0, 2.5] and V.durations(np.array([0.0, 1.0])) == [0.0, 1.0]


def test_equal_parts_splits_and_names_the_constraint_in_the_callers_words():
    assert V.equal_parts(12, 3) == [range(0, 4), range(4, 8), range(8, 12)]
    assert V.equal_parts(0, 2) == [range(0, 0), range(0, 0)] and V.equal_parts(5, 1) == [range(0, 5)]
    with pytest.raises(ValueError, match=r"^3 parts do not divide 10 items evenly \(10 % 3 = 1\)$"):
        V.equal_parts(10, 3)
    with pytest.raises(ValueError, match="^world size 4 does not divide the batch 30$"):
        V.equal_parts(30, 4, "world size {k} does not divide the batch {n}")
    with pytest.raises(ValueError, match=r"k \(the number of equal parts\) must be an integer >= 1"):
        V.equal_parts(4, 0)
    with pytest.raises(ValueError, match=r"n \(the number of items to split\) must be an integer >= 0"):
        V.equal_parts(-4, 2)


@pytest.mark.parametrize("call, match", [
    (lambda: V.positive_number(0, "x"), "x must be a finite number > 0, got 0"),
    (lambda: V.positive_number(-1, "x", allow_zero=True), "x must be a finite number >= 0, got -1"),
    (lambda: V.positive_number(float("inf"), "x"), "x must be a finite number > 0"),
    (lambda: V.positive_number(float("nan"), "x"), "x must be a finite number > 0"),
    (lambda: V.positive_number(True, "x"), "x must be a finite number > 0, got True"),
    (lambda: V.positive_number("3", "x"), "x must be a number, got '3'"),
    (lambda: V.positive_number(None, "x"), "x must be a number, got None"),
    (lambda: V.integer_at_least(0, "n"), "n must be an integer >= 1, got 0"),
    (lambda: V.integer_at_least(2.0, "n"), "n must be an integer >= 1, got 2.0"),
    (lambda: V.integer_at_least(True, "n", 0), "n must be an integer >= 0, got True"),
    (lambda: V.integer_at_least(1, "n", 2), "n must be an integer >= 2, got 1"),
    (lambda: V.index_below(4, "rank", 4), r"rank must be an integer in \[0, 4\), got 4"),
    (lambda: V.index_below(-1, "rank", 4), r"rank must be an integer in \[0, 4\), got -1"),
    (lambda: V.zero_stage(4), r"zero_stage must be 0, 1, 2 or 3 \(a ZeRO stage\), got 4"),
    (lambda: V.zero_stage(True, "zero"), "zero must be 0, 1, 2 or 3"),
    (lambda: V.one_of("fp16", "precision", ["fp32", "fp64"]), r"precision must be one of \('fp32', 'fp64'\), got 'fp16'"),
    (lambda: V.probability(1.5, "p"), r"p must be in \[0, 1\], got 1.5"),
    (lambda: V.probability(1.0, "p", below_one=True), r"p must be in \[0, 1\), got 1.0"),
    (lambda: V.probability(-0.1, "p"), r"p must be in \[0, 1\]"),
    (lambda: V.probability("a", "p"), r"p must be in \[0, 1\], got 'a'"),
    (lambda: V.durations([]), "durations must hold at least one worker's time"),
    (lambda: V.durations("ab"), "durations must be a sequence of numbers"),
    (lambda: V.durations([1, "2"], "times"), "times must be a sequence of numbers"),
    (lambda: V.durations([1, -2]), r"durations must be finite and >= 0 \(no negative durations\)"),
])
def test_bad_values_name_the_constraint(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_one_of_names_the_choices():
    assert V.one_of("full", "policy", ("none", "full")) == "full"
    for bad in ("Full", None, True, 1):
        with pytest.raises(ValueError, match=r"^policy must be one of \('none', 'full'\), got "):
            V.one_of(bad, "policy", ("none", "full"))
    assert V.one_of(2, "n", (1, 2)) == 2
    with pytest.raises(ValueError):
        V.one_of(2.0, "n", (1, 2))  # the same value of another type is not the option
