"""Rank coordinates and process groups of a hybrid layout: DP x PP x TP (x CP ...) (P.11, 12.4.1, 12.4.2).

A layout is a list of named dimensions, **outermost first**, with their sizes. Ranks are numbered
row-major, the last (innermost) dimension varying fastest, exactly like
``torch.arange(world).view(*sizes)`` and like PyTorch's ``init_device_mesh``:

* P.11's 16 devices as DP2 x PP2 x TP4: ``Mesh(("dp", "pp", "tp"), (2, 2, 4))``, so that
  rank = 8 dp + 4 pp + tp (the section's formula);
* Llama 3 orders its dimensions [TP, CP, PP, DP] from innermost to outermost, i.e.
  ``Mesh(("dp", "pp", "cp", "tp"), ...)``.

The group of a dimension ``d`` that a rank belongs to holds the ranks whose coordinates agree with
it on every *other* dimension (a TP group shares (dp, pp); a DP group shares (pp, tp)).

Servers ("nodes") hold consecutive ranks: rank r lives on node ``r // devices_per_node``. Putting
the innermost dimension inside a node is how TP gets the fastest links (P.7, P.11, 12.4.1);
:func:`placement` says which dimensions' groups span servers and :func:`stage_hops` which
pipeline hand-offs cross them (12.2.2).

On the ranks: :func:`hand_groups_worker` builds every group with ``dist.new_group`` and sums the
ranks inside each with an all-reduce (so the groups are real, not just lists);
:func:`device_mesh_worker` asks PyTorch's ``init_device_mesh`` for the same shape and returns the
coordinate and group members it reports, to compare with :class:`Mesh`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .launcher.worker import device
from .validate import index_below, integer_at_least


@dataclass(frozen=True)
class Mesh:
    """A named grid of ranks, outermost dimension first (row-major, like ``init_device_mesh``)."""

    names: tuple
    sizes: tuple

    def __post_init__(self):
        names, sizes = tuple(self.names), tuple(self.sizes)
        if not names or len(names) != len(sizes):
            raise ValueError(f"need one size per dimension name, got names={names}, sizes={sizes}")
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"dimension names must be distinct non-empty strings, got {names}")
        sizes = tuple(integer_at_least(s, f"the size of dimension {n!r}") for n, s in zip(names, sizes))
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "sizes", sizes)

    @classmethod
    def of(cls, **degrees):
        """``Mesh.of(dp=2, pp=2, tp=4)``: keyword order is the nesting order, outermost first."""
        return cls(tuple(degrees), tuple(degrees.values()))

    @property
    def world(self) -> int:
        return math.prod(self.sizes)

    @property
    def strides(self) -> tuple:
        out, step = [], 1
        for s in reversed(self.sizes):
            out.append(step)
            step *= s
        return tuple(reversed(out))

    def size(self, name: str) -> int:
        return self.sizes[self._dim(name)]

    def _dim(self, name: str) -> int:
        if name not in self.names:
            raise ValueError(f"unknown dimension {name!r}: this mesh has {self.names}")
        return self.names.index(name)

    def _check_rank(self, rank) -> int:
        index_below(rank, "rank", self.world)
        return int(rank)

    def coord(self, rank: int) -> dict:
        """``{name: index}`` of ``rank`` (P.11: rank 13 of DP2 x PP2 x TP4 is dp=1, pp=1, tp=1)."""
        rank = self._check_rank(rank)
        return {n: (rank // st) % s for n, st, s in zip(self.names, self.strides, self.sizes)}

    def rank(self, **coord) -> int:
        """The rank at a coordinate; every dimension must be given, each index within its size."""
        if set(coord) != set(self.names):
            raise ValueError(f"give an index for exactly the dimensions {self.names}, got {sorted(coord)}")
        r = 0
        for n, st, s in zip(self.names, self.strides, self.sizes):
            i = coord[n]
            index_below(i, f"index of {n!r}", s)
            r += int(i) * st
        return r

    def group_of(self, rank: int, name: str) -> list:
        """The ranks that share every coordinate of ``rank`` except ``name`` (its ``name`` group)."""
        c = self.coord(rank)
        return [self.rank(**{**c, name: i}) for i in range(self.size(name))]

    def groups(self, name: str) -> list:
        """Every ``name`` group, ordered by its first rank: world / size(name) groups of size(name)."""
        self._dim(name)
        seen, out = set(), []
        for r in range(self.world):
            if r not in seen:
                g = self.group_of(r, name)
                seen.update(g)
                out.append(g)
        return out

    def grid(self):
        """``numpy.arange(world).reshape(sizes)``: the same array as ``torch.arange(world).view(*sizes)``."""
        import numpy as np

        return np.arange(self.world).reshape(self.sizes)

    def table(self) -> list:
        """One row per rank: ``(rank, index of each dimension...)``."""
        return [(r, *self.coord(r).values()) for r in range(self.world)]


# ---- placement over servers ----------------------------------------------------------------------

def node_of(rank: int, devices_per_node: int) -> int:
    """The server of ``rank`` when every server holds ``devices_per_node`` consecutive ranks."""
    devices_per_node = integer_at_least(devices_per_node, "devices_per_node")
    integer_at_least(rank, "rank", 0)
    return int(rank) // devices_per_node


def placement(mesh: Mesh, devices_per_node: int) -> dict:
    """Per dimension: group size, number of groups, and how many servers the widest group spans.

    ``"intra-node"`` is True when every group of the dimension lives inside one server (its
    collectives use the fast links only). The world must fill whole servers.
    """
    devices_per_node = integer_at_least(devices_per_node, "devices_per_node")
    if mesh.world % devices_per_node:
        raise ValueError(f"{mesh.world} ranks do not fill servers of {devices_per_node} devices")
    out = {}
    for name in mesh.names:
        gs = mesh.groups(name)
        spans = [len({node_of(r, devices_per_node) for r in g}) for g in gs]
        out[name] = {"group size": mesh.size(name), "groups": len(gs), "max servers per group": max(spans),
                     "intra-node": max(spans) == 1}
    return out


def stage_hops(mesh: Mesh, devices_per_node: int, name: str = "pp") -> list:
    """Every point-to-point link between consecutive indices of dimension ``name`` (12.2.2): for a
    pipeline, the hand-off from stage k to stage k+1 of each pipeline, as ``(src, dst, crosses)``
    where ``crosses`` says whether the two ranks sit in different servers."""
    devices_per_node = integer_at_least(devices_per_node, "devices_per_node")
    out = []
    for g in mesh.groups(name):
        for a, b in zip(g, g[1:]):
            out.append((a, b, node_of(a, devices_per_node) != node_of(b, devices_per_node)))
    return out


def draw(mesh: Mesh, devices_per_node: int, highlight: dict | None = None, ax=None, title: str | None = None):
    """Draw the servers as boxes of devices, each labelled with its rank and coordinate.

    ``highlight`` maps a dimension name to a color and draws every group of that dimension as a
    line through its members (TP groups inside a box, PP and DP groups across boxes). Drawn by
    :func:`helpers.plots.servers`.
    """
    from .plots import servers

    placement(mesh, devices_per_node)  # validates the fit
    return servers(mesh, devices_per_node, highlight, ax, title=title)


# ---- on the ranks ----------------------------------------------------------------------------------

def build_groups(mesh: Mesh) -> dict:
    """``{name: this rank's process group}`` for every dimension, built with ``dist.new_group``.

    Every rank must create every group, in the same order (a torch.distributed rule), even the
    groups it is not in; each rank keeps the one it belongs to.
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if world != mesh.world:
        raise ValueError(f"the mesh has {mesh.world} ranks but the job has {world}")
    mine = {}
    for name in mesh.names:
        for g in mesh.groups(name):
            pg = dist.new_group(g)
            if rank in g:
                mine[name] = pg
    return mine


def hand_groups_worker(names, sizes) -> dict:
    """Build the groups of ``Mesh(names, sizes)`` by hand and all-reduce each rank's id in each.

    Returns this rank's coordinate, the members of its groups (as torch.distributed reports them)
    and, per dimension, the sum of the ranks in its group computed by an all-reduce over that group.
    """
    import torch
    import torch.distributed as dist

    mesh = Mesh(tuple(names), tuple(sizes))
    rank = dist.get_rank()
    groups = build_groups(mesh)
    sums = {}
    for name, pg in groups.items():
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=pg)
        sums[name] = int(t.item())
    return {"rank": rank, "coord": mesh.coord(rank),
            "groups": {n: sorted(dist.get_process_group_ranks(pg)) for n, pg in groups.items()}, "sums": sums}


def device_mesh_worker(names, sizes) -> dict:
    """PyTorch's view of the same layout: ``init_device_mesh(device, sizes, mesh_dim_names=names)``.

    Returns this rank's coordinate (``mesh.get_coordinate()``), the members of its group along
    every dimension (``mesh.get_group(name)``) and the mesh's rank array. Runs on CPU with gloo
    (FACTS.md) and on GPUs with NCCL.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dm = init_device_mesh(device().type, tuple(sizes), mesh_dim_names=tuple(names))
    return {"rank": dist.get_rank(), "coord": dict(zip(names, dm.get_coordinate())),
            "groups": {n: sorted(dist.get_process_group_ranks(dm.get_group(n))) for n in names},
            "mesh": dm.mesh.tolist()}
