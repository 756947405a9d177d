"""helpers.launcher.commlog's "operations since a point" (mark / ops_since / as_tuples)."""
from helpers import commlog
from helpers.launcher import launch


def test_mark_and_ops_since_on_a_log():
    assert commlog.active_log() is None
    outside = commlog.mark()
    assert outside.log is None and commlog.ops_since(outside) == []
    with commlog.CommLog(record_comm=False) as log:
        log.ops.append(commlog.CommOp("broadcast", 8, 2, 0.0))
        m0 = commlog.mark()
        log.ops += [commlog.CommOp("all_reduce", 64, 4, 0.1), commlog.CommOp("send", 16, 2, 0.2)]
        m1 = commlog.mark()
        log.ops.append(commlog.CommOp("all_gather", 32, 4, 0.3))
        assert (m0.index, m1.index) == (1, 3)
        assert commlog.as_tuples(commlog.ops_since(m0, m1)) == [("all_reduce", 64, 4), ("send", 16, 2)]
        assert commlog.as_tuples(commlog.ops_since(m1)) == [("all_gather", 32, 4)]
        assert commlog.ops_since(commlog.mark()) == []
    assert commlog.active_log() is None


def _two_phases():
    import torch
    import torch.distributed as dist

    from helpers.launcher.commlog import as_tuples, mark, ops_since

    x = torch.ones(8)
    m0 = mark()
    dist.all_reduce(x)
    m1 = mark()
    dist.broadcast(x, 0)
    dist.all_reduce(x)
    return as_tuples(ops_since(m0, m1)), as_tuples(ops_since(m1))


def test_marks_split_what_a_rank_recorded():
    run = launch(_two_phases, world_size=2, quiet=True)
    for first, rest in run.results:
        assert first == [("all_reduce", 32, 2)]
        assert rest == [("broadcast", 32, 2), ("all_reduce", 32, 2)]


def _in_a_subgroup():
    import torch
    import torch.distributed as dist

    from helpers.launcher.commlog import mark, ops_since

    sub = dist.new_group([0, 2])  # every rank creates it; ranks 0 and 2 use it
    x = torch.ones(4)
    m0 = mark()
    if dist.get_rank() in (0, 2):
        dist.all_reduce(x, group=sub)
    dist.all_reduce(x)
    return [(o.op, o.group_size, o.group_ranks) for o in ops_since(m0)]


def test_the_log_names_each_call_s_group():
    run = launch(_in_a_subgroup, world_size=3, quiet=True)
    assert run.results[0] == run.results[2] == [("all_reduce", 2, (0, 2)), ("all_reduce", 3, (0, 1, 2))]
    assert run.results[1] == [("all_reduce", 3, (0, 1, 2))]
