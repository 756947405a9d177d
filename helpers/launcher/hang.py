"""Who a hung job waits for: the launcher's diagnosis of a timeout (P.14; PyTorch's flight recorder for NCCL).

When a job outlives its timeout, the launcher asks every rank that neither finished nor failed
where it is (a thread in each worker answers while the main thread is blocked in a collective)
and gets, per rank:

* ``phase``: ``"running"``, ``"starting the process group"``, ``"unpickling"``...;
* ``dist_call``: the ``torch.distributed`` function the rank is inside (``all_reduce``, ``recv``...),
  or None when it is running its own code;
* ``where``: the innermost line of the job's own code (``file.py:12 in worker``);
* from the communication log (:meth:`helpers.launcher.commlog.CommLog.status`): ``last_op``, the last call
  it issued, with its kind, its number ``seq`` on its group (or to/from its peer) and its group;
  ``counts`` of calls issued per group and per peer; ``groups``, each group's member ranks;
  ``span``, the innermost open span.

:func:`diagnose` turns that into one headline and one line per rank, e.g.
``ranks 0, 2, 3 waiting in all_reduce #5 (group of 4); rank 1 never entered it (last: span 'compute')``,
and the ranks to blame: those that never entered the call the others wait in, those that entered
a different collective at the same position (a mismatch), or, when nobody waits in a collective,
every stuck rank. A rank waiting on the handle of an asynchronous call (``work.wait()``) is not
inside a ``torch.distributed`` function: it shows as "not in a torch.distributed call", with
its last call issued.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# the torch.distributed functions a rank can wait in, by the name the communication log uses
_FAMILIES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
             "scatter", "send", "recv", "barrier")


@dataclass
class Diagnosis:
    """What a hung job's ranks were doing: a headline, one line per stuck rank, whom to blame."""

    headline: str
    lines: list[str]
    blamed: list[int]
    states: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return "\n".join([self.headline, *self.lines])


def call_family(dist_call: str | None) -> str | None:
    """The log's name for a ``torch.distributed`` function (``all_gather_into_tensor`` -> ``all_gather``)."""
    if not dist_call:
        return None
    name = dist_call.lstrip("_")
    if name.startswith("monitored_barrier"):
        return "barrier"
    if name in ("isend", "irecv"):
        return name[1:]
    return next((f for f in _FAMILIES if name.startswith(f)), None)


def _ranks(rs) -> str:
    rs = sorted(rs)
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def _op_name(op) -> str:
    return f"{op.op} #{op.seq}"


def _wait_key(st: dict | None):
    """The call a rank waits in: a collective (group, seq), a send/recv (group, kind, peer, seq), or a bare call."""
    if not st or st.get("phase") not in ("running", "starting the process group") or not st.get("dist_call"):
        return None
    op = st.get("last_op")
    if op is not None and call_family(st["dist_call"]) == op.op:
        if op.op in ("send", "recv"):
            return ("p2p", op.group, op.op, op.peer, op.seq)
        return ("coll", op.group, op.seq)
    return ("call", st["dist_call"])


def _last(st: dict | None) -> str:
    """A rank's last known activity, short: its open span, else its line, and its last call."""
    if not st:
        return "did not answer"
    if st.get("phase") not in ("running", None):
        return st["phase"]
    parts = []
    if st.get("span"):
        parts.append(f"span {st['span']!r}")
    elif st.get("where"):
        parts.append(f"at {st['where']}")
    if not parts and st.get("last_op") is not None:
        parts.append(f"{_op_name(st['last_op'])} done")
    return ", ".join(parts) or "no call issued yet"


def _rank_line(r: int, st: dict | None, key) -> str:
    if not st:
        return f"rank {r}: did not answer"
    if st.get("phase") not in ("running", "starting the process group"):
        return f"rank {r}: {st.get('phase')}"
    op = st.get("last_op")
    head = f"waiting in {_describe(key, st)}" if key else "not in a torch.distributed call"
    bits = [head]
    if st.get("span"):
        bits.append(f"in span {st['span']!r}")
    if st.get("where"):
        bits.append(f"at {st['where']}")
    if op is not None and (not key or key[0] == "call"):
        bits.append(f"last call {_op_name(op)} (group of {op.group_size})")
    return f"rank {r}: " + ", ".join(bits)


def _describe(key, st: dict) -> str:
    if key[0] == "coll":
        op = st["last_op"]
        return f"{_op_name(op)} (group of {op.group_size})"
    if key[0] == "p2p":
        _, _, kind, peer, seq = key
        return f"{kind} #{seq} {'to' if kind == 'send' else 'from'} rank {peer}"
    return key[1]


def diagnose(states: dict[int, dict | None], stuck, finished=(), failed=()) -> Diagnosis:
    """Explain a hang from each stuck rank's state (see the module docstring); pure, no torch.

    Three steps, each saying who waits where and whom that blames: the collectives, the
    send/recv pairs, the other calls; then the ranks in none of them.
    """
    stuck, finished, failed = sorted(stuck), set(finished), set(failed)
    keys = {r: _wait_key(states.get(r)) for r in stuck}
    phrases, blamed, mentioned = [], set(), set()
    steps = (_collectives(keys, states, finished, failed), _point_to_point(keys, states, stuck, finished),
             _other_calls(keys))
    for step_phrases, step_blamed, step_mentioned in steps:
        phrases += step_phrases
        blamed |= step_blamed
        mentioned |= step_mentioned

    rest = [r for r in stuck if r not in mentioned]
    for r in rest:
        phrases.append(f"rank {r} not in a torch.distributed call (last: {_last(states.get(r))})")
    if not blamed:  # nobody is obviously behind: suspect those outside the calls, else everyone
        outside = [r for r in stuck if keys[r] is None or keys[r][0] == "call"]
        blamed.update(rest or outside or stuck)
    lines = [_rank_line(r, states.get(r), keys[r]) for r in stuck]
    return Diagnosis("; ".join(phrases), lines, sorted(blamed), {r: states.get(r) for r in stuck})


def _collectives(keys: dict, states: dict, finished: set, failed: set) -> tuple[list[str], set[int], set[int]]:
    """Ranks at the same position on the same group, grouped by what they called: those in the
    most common call wait; those in another call are mismatched, members in none are behind.
    Returns the phrases, the ranks blamed and the ranks mentioned."""
    phrases, blamed, mentioned = [], set(), set()
    colls: dict[tuple, dict[str, list[int]]] = {}
    for r, k in keys.items():
        if k and k[0] == "coll":
            colls.setdefault(k[1:], {}).setdefault(states[r]["last_op"].op, []).append(r)
    for (group, seq), by_kind in sorted(colls.items(), key=lambda kv: -sum(map(len, kv[1].values()))):
        kinds = sorted(by_kind, key=lambda k: (-len(by_kind[k]), k))
        first = by_kind[kinds[0]]
        st0 = states[first[0]]
        phrases.append(f"{_ranks(first)} waiting in {_describe(keys[first[0]], st0)}")
        mentioned.update(first)
        for kind in kinds[1:]:
            phrases.append(f"{_ranks(by_kind[kind])} in {kind} #{seq} instead (mismatched collectives)")
            blamed.update(by_kind[kind])
            mentioned.update(by_kind[kind])
        members = st0.get("groups", {}).get(group, ())
        inside = {r for rs in by_kind.values() for r in rs}
        for m in members:
            if m in inside:
                continue
            st = states.get(m)
            if m in finished:
                phrases.append(f"rank {m} finished without entering it")
            elif m in failed:
                phrases.append(f"rank {m} failed")
                continue
            elif st is not None and st.get("counts", {}).get((group,), 0) >= seq:
                phrases.append(f"rank {m} passed it")
                continue
            elif keys.get(m) is not None:
                phrases.append(f"rank {m} never entered it (waiting in {_describe(keys[m], st)})")
            else:
                phrases.append(f"rank {m} never entered it (last: {_last(st)})")
            blamed.add(m)
            mentioned.add(m)
    return phrases, blamed, mentioned


def _point_to_point(keys: dict, states: dict, stuck: list[int],
                    finished: set) -> tuple[list[str], set[int], set[int]]:
    """Ranks waiting in a send or a recv, and the peer that never issued the matching call (blamed)."""
    phrases, blamed, mentioned = [], set(), set()
    for r, k in keys.items():
        if not k or k[0] != "p2p":
            continue
        _, group, kind, peer, seq = k
        phrases.append(f"rank {r} waiting in {_describe(k, states[r])}")
        mentioned.add(r)
        if peer is None or peer == r:
            continue
        other = "recv" if kind == "send" else "send"
        st = states.get(peer)
        if peer in finished:
            phrases.append(f"rank {peer} finished without a matching {other}")
        elif st is not None and st.get("counts", {}).get((group, other, r), 0) >= seq:
            continue
        elif peer in stuck:
            phrases.append(f"rank {peer} never issued its {other} (last: {_last(st)})")
        else:
            continue
        blamed.add(peer)
        mentioned.add(peer)
    return phrases, blamed, mentioned


def _other_calls(keys: dict) -> tuple[list[str], set[int], set[int]]:
    """Ranks in other calls (init_process_group, new_group...), one phrase per call. It blames
    nobody itself: when no step does, :func:`diagnose` suspects the ranks outside every call."""
    calls: dict[str, list[int]] = {}
    for r, k in keys.items():
        if k and k[0] == "call":
            calls.setdefault(k[1], []).append(r)
    phrases = [f"{_ranks(rs)} waiting in {call}" for call, rs in calls.items()]
    return phrases, set(), {r for rs in calls.values() for r in rs}
