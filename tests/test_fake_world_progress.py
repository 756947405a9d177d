"""``simulate(progress=...)``: a line at each trace, micro-batch, direction and layer, and the same
figures as without it (issue 26, "any run over about a second shows progress")."""
import re

import pytest

from helpers import fake_world as fw
from helpers.planner import Layout, Model

SMALL = Model("small", layers=24, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)
LAYOUT = Layout(dp=2, tp=2, zero=1)
LINE = re.compile(r"trace (\d) of (\d) \((\d) of the stage's 24 layers\): (?:building the stage|micro-batch (\d) of "
                  r"the (\d) traced, (forward|backward)(?:, layer (\d))?)$")


def _figures(step):
    return step.memory, step.held, step.comm, step.flops, step.peak_reserved, step.per_layer, step.timing


def test_progress_names_each_trace_micro_batch_direction_and_layer_and_changes_no_figure():
    lines = []
    with_ = fw.simulate(SMALL, LAYOUT, micro_batches=2, trace_layers=2, progress=lines.append)
    without = fw.simulate(SMALL, LAYOUT, micro_batches=2, trace_layers=2)
    assert _figures(with_) == _figures(without)
    parsed = [LINE.match(x) for x in lines]
    assert all(parsed), [x for x, p in zip(lines, parsed) if not p]
    seen = {(int(p[1]), int(p[3])) for p in parsed}
    assert seen == {(1, 2), (2, 3), (3, 4)} and all(p[2] == "3" and p[5] in (None, "2") for p in parsed)  # 2, 3 and 4 layers traced
    for t in (1, 2, 3):
        steps = [(int(p[4]), p[6]) for p in parsed if int(p[1]) == t and p[4]]
        # every traced micro-batch, forward then its backward, in order, each named when it starts
        assert list(dict.fromkeys(steps)) == [(1, "forward"), (1, "backward"), (2, "forward"), (2, "backward")]
    # layers are named (the first of each pass at once, the others throttled to one line per 0.2 s)
    assert any(p[7] is not None and p[6] == "forward" for p in parsed)
    assert any(p[7] is not None and p[6] == "backward" for p in parsed)


def test_progress_that_is_not_callable_is_refused_by_name_before_tracing():
    with pytest.raises(ValueError, match="progress must be None or a callable"):
        fw.simulate(SMALL, LAYOUT, micro_batches=2, trace_layers=2, progress="yes")
