"""PyTorch's CUDA caching allocator, modelled: what a run *reserves*, not only what it allocates
(issue 26, "Reserved, not only allocated").

A GPU runs out of memory when the caching allocator cannot get another segment from the device,
and ``torch.cuda.max_memory_reserved`` (what torchtitan logs, and what published runs quote) is
the most it held at once: the bytes of its segments. The fake world traces which tensors live
when (``MemTracker``: peak *allocated*); :func:`replay` runs those allocations and frees through
the allocator's rules and reports both peaks.

The rules, each from ``c10/cuda/CUDACachingAllocator.cpp`` (read at pytorch/pytorch commit
001074d, the version the search library stores; the constants and the functions named below
have been the same since torch 2.1):

* **rounding** (``round_size``): every request is rounded up to a multiple of
  ``kMinBlockSize`` = 512 bytes (a 1-byte tensor takes 512);
* **two pools** (``get_pool``): requests of at most ``kSmallSize`` = 1 MiB come from the small
  pool, larger ones from the large pool; a free block of one pool never serves the other;
* **segment sizes** (``get_allocation_size``): when no cached block fits, one segment is taken
  from the device (``cudaMalloc``): ``kSmallBuffer`` = 2 MiB for a small request,
  ``kLargeBuffer`` = 20 MiB for a request under ``kMinLargeAlloc`` = 10 MiB, else the request
  rounded up to ``kRoundLarge`` = 2 MiB;
* **best fit** (``get_free_block``): the free block chosen is the smallest one of the pool that is
  large enough (the pool is a set ordered by size, then address: ``BlockComparatorSize``);
* **splitting** (``should_split``, ``alloc_found_block``): the block is cut in two when the rest
  is worth keeping: in the small pool when at least 512 bytes remain, in the large pool when more
  than 1 MiB remains; otherwise the whole block is handed out (and counted as allocated);
* **coalescing** (``free_block``, ``try_merge_blocks``): a freed block merges with its free
  neighbours of the same segment;
* **nothing goes back** to the device during a run: a segment is released (``release_block``,
  only a segment that is one whole free block) by ``torch.cuda.empty_cache()`` or when
  ``cudaMalloc`` fails (``release_cached_blocks``, then one retry). Reserved memory therefore
  only grows; with a ``capacity`` this model does the release-and-retry, else it never releases.

Allocated bytes are counted as the allocator counts them (``stats.allocated_bytes``: the size of
each block handed out, rounding and unsplit remainders included); ``requested`` is the sum of
the sizes asked for (what ``MemTracker`` counts on the CPU).

**Left out**, each of which makes the real reserve larger (or, for the last two, can):

* one stream: the real allocator keeps a pool per stream (a block freed by FSDP2's all-gather
  or reduce-scatter stream is reused only there) and delays the reuse of a block recorded on
  another stream (``record_stream``) until that stream's work is done;
* ``expandable_segments``, ``max_split_size_mb``, ``roundup_power2_divisions``,
  ``garbage_collection_threshold`` (``PYTORCH_CUDA_ALLOC_CONF``): their defaults (off, unlimited,
  none, off) are modelled;
* CUDA graph pools, IPC, the memory of NCCL and the CUDA context (outside the allocator);
* segment addresses: ``cudaMalloc``'s addresses are not known; segments here get increasing
  addresses, which only break ties between free blocks of equal size.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: every size is rounded up to a multiple of 512 bytes
K_SMALL_SIZE = 1 << 20  # kSmallSize: the largest "small" request, 1 MiB
K_SMALL_BUFFER = 2 << 20  # kSmallBuffer: small requests are packed in 2 MiB segments
K_LARGE_BUFFER = 20 << 20  # kLargeBuffer: requests of 1-10 MiB are packed in 20 MiB segments
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: from 10 MiB a request gets a segment of its own
K_ROUND_LARGE = 2 << 20  # kRoundLarge: ... rounded up to 2 MiB


def round_size(nbytes: int) -> int:
    """``round_size``: the block size a request of ``nbytes`` needs (a multiple of 512, at least 512)."""
    return max(K_MIN_BLOCK_SIZE, -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)


def segment_size(size: int) -> int:
    """``get_allocation_size``: the segment taken from the device for a rounded request ``size``
    that no cached block fits."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


class OutOfMemory(RuntimeError):
    """A request that even a device without cached free segments cannot hold (``capacity``)."""


@dataclass(eq=False)
class Block:
    """A piece of a segment: ``addr`` (virtual), ``size``, in use or free, its neighbours in the
    segment (``prev``, ``next``: None at the segment's ends), its pool (``small``)."""

    addr: int
    size: int
    small: bool
    allocated: bool = False
    requested: int = 0
    prev: Block | None = None
    next: Block | None = None


class CachingAllocator:
    """The rules of the module docstring on one device and one stream. ``malloc(nbytes)`` returns
    a :class:`Block`, ``free(block)`` gives it back; the counters (bytes) are ``allocated``,
    ``requested``, ``reserved`` and ``segments`` now, and their ``peak_*``. ``capacity``: the
    device's bytes; a segment that would exceed it first releases every cached segment that is
    wholly free, then raises :class:`OutOfMemory` (None: a device without limit)."""

    def __init__(self, capacity: int | None = None):
        if capacity is not None and (not isinstance(capacity, int) or capacity <= 0):
            raise ValueError(f"capacity must be a positive number of bytes or None, got {capacity!r}")
        self.capacity = capacity
        self._free = {True: [], False: []}  # pool (small?) -> sorted [(size, addr)] of free blocks
        self._blocks = {}  # addr -> free Block, for the sorted lists
        self._next_addr = 0
        self.allocated = self.requested = self.reserved = self.segments = 0
        self.peak_allocated = self.peak_requested = self.peak_reserved = self.peak_segments = 0

    # ---- the pools of free blocks (BlockPool::blocks, ordered by size then address) ----

    def _insert_free(self, block: Block) -> None:
        insort(self._free[block.small], (block.size, block.addr))
        self._blocks[block.addr] = block

    def _remove_free(self, block: Block) -> None:
        pool = self._free[block.small]
        del pool[bisect_left(pool, (block.size, block.addr))]
        del self._blocks[block.addr]

    def _best_fit(self, small: bool, size: int) -> Block | None:
        """``get_free_block``: the smallest free block of the pool with at least ``size`` bytes."""
        pool = self._free[small]
        i = bisect_left(pool, (size, -1))
        if i == len(pool):
            return None
        block = self._blocks[pool[i][1]]
        self._remove_free(block)
        return block

    # ---- segments (alloc_block, release_cached_blocks) ----

    def _new_segment(self, small: bool, nbytes: int) -> Block:
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            self.empty_cache()  # release_cached_blocks, then alloc_block once more
            if self.reserved + nbytes > self.capacity:
                raise OutOfMemory(f"a {nbytes}-byte segment does not fit: {self.reserved} of {self.capacity} bytes "
                                  f"reserved ({self.allocated} allocated)")
        block = Block(self._next_addr, nbytes, small)
        self._next_addr += nbytes
        self.reserved += nbytes
        self.segments += 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.peak_segments = max(self.peak_segments, self.segments)
        return block

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()`` (``release_blocks``): every free block that is a whole
        segment goes back to the device."""
        for small in (True, False):
            for size, addr in list(self._free[small]):
                block = self._blocks[addr]
                if block.prev is None and block.next is None:
                    self._remove_free(block)
                    self.reserved -= block.size
                    self.segments -= 1

    # ---- malloc and free ----

    def malloc(self, nbytes: int) -> Block:
        """``DeviceCachingAllocator::malloc``: round, pick the pool, reuse the best-fitting cached
        block or take a new segment, split off the rest when it is worth keeping."""
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"nbytes must be a positive int (torch allocates nothing for 0 bytes), got {nbytes!r}")
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        block = self._best_fit(small, size)
        if block is None:
            block = self._new_segment(small, segment_size(size))
        rest = block.size - size
        if (rest >= K_MIN_BLOCK_SIZE) if small else (rest > K_SMALL_SIZE):  # should_split
            remaining = Block(block.addr + size, rest, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = remaining
            block.next, block.size = remaining, size
            self._insert_free(remaining)
        block.allocated, block.requested = True, nbytes
        self.allocated += block.size
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)
        return block

    def free(self, block: Block) -> None:
        """``free_block``: the block goes back to its pool, merged with its free neighbours."""
        if not block.allocated:
            raise ValueError("this block is not allocated (freed twice?)")
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        for nb in (block.prev, block.next):  # try_merge_blocks
            if nb is None or nb.allocated:
                continue
            self._remove_free(nb)
            if nb is block.prev:
                block.addr, block.prev = nb.addr, nb.prev
                if nb.prev is not None:
                    nb.prev.next = block
            else:
                block.next = nb.next
                if nb.next is not None:
                    nb.next.prev = block
            block.size += nb.size
        self._insert_free(block)


@dataclass(frozen=True)
class Replay:
    """What :func:`replay` found (bytes): the peaks of allocated (block sizes, as
    ``torch.cuda.max_memory_allocated``), requested (the bytes asked for) and reserved (segments,
    as ``torch.cuda.max_memory_reserved``), the most segments held at once, and the reserve and
    allocated bytes at the end."""

    peak_allocated: int
    peak_requested: int
    peak_reserved: int
    segments: int
    reserved: int
    allocated: int

    def as_dict(self) -> dict:
        return {"peak_allocated": self.peak_allocated, "peak_requested": self.peak_requested,
                "peak_reserved": self.peak_reserved, "segments": self.segments}


def replay(events, capacity: int | None = None) -> Replay:
    """Run a sequence of ``("alloc", id, nbytes)`` and ``("free", id)`` events through a fresh
    :class:`CachingAllocator`. An ``alloc`` of 0 bytes is skipped (torch hands out no block for
    an empty tensor), and so is the ``free`` of its id; an id allocated twice while alive, or
    freed without being allocated, is an error."""
    a = CachingAllocator(capacity)
    live, empty = {}, set()
    for ev in events:
        if ev[0] == "alloc":
            _, key, nbytes = ev
            if key in live or key in empty:
                raise ValueError(f"id {key!r} allocated again while alive")
            if nbytes == 0:
                empty.add(key)
            else:
                live[key] = a.malloc(nbytes)
        elif ev[0] == "free":
            key = ev[1]
            if key in empty:
                empty.discard(key)
            elif key in live:
                a.free(live.pop(key))
            else:
                raise ValueError(f"id {key!r} freed but not allocated")
        else:
            raise ValueError(f"an event is ('alloc', id, nbytes) or ('free', id), got {ev!r}")
    return Replay(a.peak_allocated, a.peak_requested, a.peak_reserved, a.peak_segments, a.reserved, a.allocated)
