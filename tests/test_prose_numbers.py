"""Issue 29, point 1: every figure a notebook's text states is supported by its stored outputs, or
marked as the chapter's (with its ledger row), as an input the code holds, or as a sourced fact
(helpers/course/prose.py says how). A changed output that leaves a sentence stale fails here."""
import json

import pytest

from helpers import prose

NOTEBOOKS = prose.notebooks()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_figure_in_the_text_is_supported(path):
    problems = prose.check(path)
    assert not problems, "figures the text states that nothing supports:\n" + "\n".join(problems)


def _notebook(tmp_path, markdown, outputs=(), code="x = 1", stem="nb"):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": markdown},
             {"cell_type": "code", "metadata": {}, "execution_count": 1, "source": code,
              "outputs": [{"output_type": "stream", "name": "stdout", "text": t} for t in outputs]}]
    path = tmp_path / f"{stem}.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


@pytest.mark.parametrize("text, output, ok", [
    ("peak 83.9 GB", "peak: 83.92 GB", True),
    ("peak 83.9 GB", "peak: 83.97 GB", False),   # 83.97 rounds to 84.0, not 83.9
    ("about 84 GB", "78.2 GiB", True),             # 78.2 GiB = 83.97 GB
    ("about 84 GB", "84 GiB", False),               # 84 GiB = 90.2 GB
    ("it took 263 ms", "0.263 s", True),
    ("it took 263 ms", "263 MB", False),            # a size is not a time
    ("a 42% drop", "0.42", False),                  # a bare number has no unit
    ("15x fewer", "15.2x", True),
])
def test_a_figure_is_supported_by_an_output_at_the_texts_precision(tmp_path, text, output, ok):
    assert (prose.check(_notebook(tmp_path, text, [output])) == []) is ok


def test_a_changed_output_leaves_the_sentence_stale_and_fails(tmp_path):
    assert prose.check(_notebook(tmp_path, "The peak is 62.3 GB.", ["peak 62.3 GB"])) == []
    problems = prose.check(_notebook(tmp_path, "The peak is 62.3 GB.", ["peak 83.9 GB"]))
    assert len(problems) == 1 and "'62.3 GB' is in no output and not marked" in problems[0]
    assert "cell 0" in problems[0] and "nb.ipynb" in problems[0]


def test_what_is_not_a_figure(tmp_path):
    text = "`bytes_sent` of a 32 x 32 matrix, a 70B model, 4h wide, at 2 ranks"
    assert prose.figures(text) == []
    assert [f.text for f in prose.figures("1,024 MiB and 3e9 FLOPs in 2.5 ms, 95%")] == \
        ["1,024 MiB", "3e9 FLOPs", "2.5 ms", "95%"]


def test_book_marks_are_checked_against_the_ledger(tmp_path, monkeypatch):
    ledger = tmp_path / "claims"
    ledger.mkdir()
    (ledger / "nb.csv").write_text("id,section,claim,book_value,our_value,verdict,where,found_by,why\n"
                                   "P.6-4,P.6,the step takes 470 ms,470 ms,470 ms,correct,x,first,\n"
                                   "P.6-5,P.6,something else,3 GB,3 GB,correct,x,first,\n")
    monkeypatch.setattr(prose, "CLAIMS", ledger)
    ok = "The book's step is 470 ms. <!-- figures: 470 ms = book P.6-4 -->"
    assert prose.check(_notebook(tmp_path, ok)) == []
    wrong_row = prose.check(_notebook(tmp_path, ok.replace("P.6-4", "P.6-5")))
    assert len(wrong_row) == 1 and "does not state it" in wrong_row[0]
    missing = prose.check(_notebook(tmp_path, ok.replace("P.6-4", "P.6-9")))
    assert len(missing) == 1 and "not a row of the ledger" in missing[0]


def test_input_and_fact_marks_are_checked(tmp_path):
    text = "Each task sleeps 50 ms. <!-- figures: 50 ms = input -->"
    assert prose.check(_notebook(tmp_path, text, code="time.sleep(0.05)")) == []
    problems = prose.check(_notebook(tmp_path, text, code="time.sleep(0.5)"))
    assert len(problems) == 1 and "no code cell holds it" in problems[0]
    fact = "An H100 peaks at 989 TFLOP/s. <!-- figures: 989 TFLOP/s = fact data/hardware.json -->"
    assert prose.check(_notebook(tmp_path, fact)) == []
    wrong_file = prose.check(_notebook(tmp_path, fact.replace("989", "1234")))
    assert len(wrong_file) == 1 and "does not hold that number" in wrong_file[0]
    unsourced = prose.check(_notebook(tmp_path, "A BF16 value is 2 bytes. <!-- figures: 2 bytes = fact -->"))
    assert len(unsourced) == 1 and "without a source" in unsourced[0]


def test_a_mark_must_name_a_figure_of_its_cell_and_be_well_formed(tmp_path):
    stale = prose.check(_notebook(tmp_path, "No figure here. <!-- figures: 50 ms = input -->", code="0.05"))
    assert len(stale) == 1 and "names a figure the cell does not state" in stale[0]
    with pytest.raises(ValueError, match="FIGURE = book ID"):
        prose.check(_notebook(tmp_path, "Wait 50 ms. <!-- figures: 50 ms is an input -->"))


@pytest.mark.parametrize("text, output, ok", [
    ("about 5 ms", "0.006 s", False),     # touching rounding intervals are not agreement
    ("under 0.2 s", "0 s", False),         # a zero supports only a zero
    ("40-65% slower", "65%", False),       # a range is two figures: 40% needs support too
    ("40-65% slower", "40% and 65%", True),
    ("12 GB/GPU", "12.0 GB", True),
    ("400 Gb/s", "50 GB/s", True),          # gigabits
])
def test_agreement_edges(tmp_path, text, output, ok):
    assert (prose.check(_notebook(tmp_path, text, [output])) == []) is ok


def test_counts_and_intensities_are_not_figures():
    assert prose.figures("each setting is repeated 3 times; 1 FLOP per byte") == []
    assert [f.text for f in prose.figures("17 times fewer bytes")] == ["17 times"]


def test_a_percentage_input_may_be_written_as_a_fraction(tmp_path):
    text = "Take p = 95%. <!-- figures: 95% = input -->"
    assert prose.check(_notebook(tmp_path, text, code="p = 0.95")) == []


def test_code_is_not_prose():
    assert prose.figures("```\ntime.sleep(0.05)  # 50 ms\n```\nand ``x = 2 GB`` and `3 s`") == []
