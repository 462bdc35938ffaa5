"""PyTorch's CUDA caching allocator, replayed: the allocator itself, without the requests.

Pure arithmetic, no torch. `CachingAllocator` is the default (fixed-segment) allocator of
c10/cuda/CUDACachingAllocator.cpp (torch 2.11), for the large pool of one stream: requests
rounded up to 512 bytes; a request over 1 MiB is served by the smallest free cached block that
holds it (best fit, `get_free_block`; of equal ones the lowest address, which the newest
segment usually has: `_key_of`), split when more than 1 MiB would remain (`should_split`);
when no cached block holds it a new segment is cudaMalloc'ed: 20 MiB for requests under 10 MiB,
else the request rounded up to 2 MiB (`get_allocation_size`). A freed block merges with free
neighbours of its own segment. Segments are returned by `empty_cache` (ZeRO-3's defragment at
initialize) and, on a card that fills (`Device`), by the retry after a failed cudaMalloc.
`Pools` and `replay` serve an event list stream by stream. The requests a training step makes
are `allocator_sim`'s.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

MiB = 2**20
DEFAULT_STREAM = 0  # the compute stream (allocator_sim names DeepSpeed's others)
SMALL_SIZE = 1 * MiB  # kSmallSize: requests up to this go to the small pool
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
LARGE_BUFFER = 20 * MiB  # kLargeBuffer
ROUND_LARGE = 2 * MiB  # kRoundLarge


def round_size(size: int) -> int:
    return 512 if size < 512 else 512 * -(-size // 512)


def allocation_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return 2 * MiB
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


class _Block:
    # `key`: the block's place in its allocator's free index while it is free (`_key_of`), None
    # while it is in use; `base`: that key less the size, fixed for the block's life (a block
    # keeps its segment and offset: a split makes a new block after it, a merge keeps the first)
    __slots__ = ("segment", "offset", "size", "key", "base", "prev", "next", "pool")

    def __init__(self, segment: int, offset: int, size: int, pool: "CachingAllocator | None" = None) -> None:
        self.segment, self.offset, self.size, self.key = segment, offset, size, None
        self.base = _key_of(0, segment, offset)
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.pool = pool  # the allocator whose segment holds it (a replay frees it there)


_new_block = object.__new__


# A free block's place in the best-fit order as one int (ints compare faster than tuples):
# size, then address. The allocator's BlockComparatorSize orders free blocks by (stream, size,
# pointer), and the CUDA driver mostly places a new segment below the one made before it (the
# 15 H200 traces: 882 of 995 consecutive segments over 20 MiB), so among free blocks of one
# size the newest segment's comes first, then the lowest offset. (Oldest first, two measured
# hf rows lost a step segment that the GPU made: -9% and -14% reserved.)
# Offsets are multiples of 512 bytes.
_SEG_SHIFT, _SIZE_SHIFT = 48, 72
_SEG_MAX = (1 << (_SIZE_SHIFT - _SEG_SHIFT)) - 1


def _key_of(size: int, segment: int, offset: int) -> int:
    return (size << _SIZE_SHIFT) | ((_SEG_MAX - segment) << _SEG_SHIFT) | (offset >> 9)


@dataclass
class CachingAllocator:
    """The large pool of the default caching allocator on one stream. Blocks of a segment are
    a doubly linked list, as in the allocator; free blocks are kept sorted by (size, newest
    segment, offset), the address order `get_free_block`'s best fit searches (`_key_of`)."""

    free_index: list[int] = field(default_factory=list)
    free_blocks: dict[int, _Block] = field(default_factory=dict)
    segment_sizes: list[int] = field(default_factory=list)
    reserved: int = 0
    allocated: int = 0
    peak_reserved: int = 0
    device: "Device | None" = None  # the card the pools share (replay_at_capacity), or unbounded

    # malloc and free run once per request of a replay (tens of thousands per plan): the
    # free-index updates are written out in place, the hot attributes read into locals, and a
    # free block's key is kept on it (`_Block.key`) rather than computed again. The peak
    # allocated is `replay`'s to follow, from `allocated` after each request: planning reads
    # only the reserve.
    def malloc(self, size: int) -> _Block | None:
        """The block that serves `size` bytes (its handle for `free`); requests of 1 MiB or
        less are not replayed (None)."""
        if size <= SMALL_SIZE:
            return None
        size = (size + 511) & ~511
        index = self.free_index
        i = bisect_left(index, size << _SIZE_SHIFT)
        if i < len(index):
            block = self.free_blocks.pop(index.pop(i))
            block.key = None
        else:
            seg_size = allocation_size(size)
            if self.device is not None:
                self.device.reserve(seg_size)  # may free the cache and retry, or raise OutOfMemory
            block = _Block(len(self.segment_sizes), 0, seg_size, self)
            self.segment_sizes.append(seg_size)
            self.reserved += seg_size
            if self.reserved > self.peak_reserved:
                self.peak_reserved = self.reserved
        remaining = block.size - size
        if remaining > SMALL_SIZE:  # should_split (large pool)
            # the rest, a free block after this one: made field by field (about a third of
            # _Block()'s cost; one per split, the replay's commonest request)
            rest = _new_block(_Block)
            rest.segment, rest.offset, rest.size, rest.pool = block.segment, block.offset + size, remaining, self
            rest.base = block.base + (size >> 9)  # same segment, `size` further on
            nxt = rest.next = block.next
            rest.prev = block
            if nxt is not None:
                nxt.prev = rest
            block.next = rest
            block.size = size
            key = rest.key = (remaining << _SIZE_SHIFT) | rest.base
            insort(index, key)
            self.free_blocks[key] = rest
        else:
            size = block.size
        self.allocated += size
        return block

    def transient(self, size: int) -> None:
        """`free(malloc(size))`, for a tensor freed before the next request (planning: its peak
        allocated is not followed). Served by a cached block, the cache ends as it began: free
        blocks are always merged with their free neighbours, so the block split off is merged
        back whole under the same key. A new segment is made and cached as `malloc` makes it."""
        if size <= SMALL_SIZE:
            return
        index = self.free_index
        if not index or index[-1] < ((size + 511) & ~511) << _SIZE_SHIFT:  # no cached block holds it
            self.free(self.malloc(size))

    def free(self, block: _Block | None) -> None:
        if block is None:
            return
        size = block.size
        self.allocated -= size
        index, blocks = self.free_index, self.free_blocks
        nxt, prev = block.next, block.prev
        if nxt is not None and nxt.key is not None:  # merge with the free neighbours of its segment
            key = nxt.key
            del index[bisect_left(index, key)]
            del blocks[key]
            size += nxt.size
            nxt = block.next = nxt.next
            if nxt is not None:
                nxt.prev = block
        if prev is not None and prev.key is not None:
            key = prev.key
            del index[bisect_left(index, key)]
            del blocks[key]
            size += prev.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            block = prev
        block.size = size
        key = block.key = (size << _SIZE_SHIFT) | block.base
        insort(index, key)
        blocks[key] = block

    def empty_cache(self) -> int:
        """torch.cuda.empty_cache (`release_cached_blocks`): every segment with no block in use
        is returned to the device (`segment_sizes` keeps what was ever made). Returns the bytes
        returned."""
        freed = 0
        for key in [k for k, b in self.free_blocks.items() if b.prev is None and b.next is None]:
            block = self.free_blocks.pop(key)
            del self.free_index[bisect_left(self.free_index, key)]
            self.reserved -= block.size
            freed += block.size
        return freed

    @property
    def segments(self) -> list[int]:
        return self.segment_sizes


class OutOfMemory(Exception):
    """A segment the card cannot hold even after the cache was freed: the run's out-of-memory."""

    def __init__(self, reserved: int, request: int) -> None:
        super().__init__(f"{reserved} bytes reserved after freeing the cache, {request} more asked for")
        self.reserved, self.request = reserved, request


@dataclass
class Device:
    """The card the pools of one replay share, as c10/cuda/CUDACachingAllocator.cpp's malloc
    meets its limit (torch 2.11, DeviceCachingAllocator::malloc): no cached block holds the
    request and cudaMalloc of a new segment fails -> release_available_cached_blocks (a no-op
    unless max_split_size_mb is set: it returns false at once) -> release_cached_blocks (after
    synchronizing the device, every cached segment no tensor uses, in every stream's pool, is
    cudaFree'd) -> alloc_block(isRetry=true), which counts `num_alloc_retries`; only a retry
    that still fails is an out-of-memory error. garbage_collection_threshold acts only under a
    per-process memory fraction (set_fraction), which zlayout's launchers do not set.
    `capacity`: what cudaMalloc can hand the large pools (the card less the CUDA context, NCCL
    and the small pool)."""

    capacity: int
    pools: list[CachingAllocator] = field(default_factory=list)
    retries: int = 0
    freed: int = 0  # bytes the retries gave back to the driver
    peak: int = 0  # the most the pools reserved at once
    needed: int = 0  # the most a retry needed: reserved after the cache was freed + its segment

    def reserve(self, seg_size: int) -> None:
        total = sum(pool.reserved for pool in self.pools)
        if total + seg_size > self.capacity:
            self.freed += sum(pool.empty_cache() for pool in self.pools)
            self.retries += 1
            total = sum(pool.reserved for pool in self.pools)
            self.needed = max(self.needed, total + seg_size)
            if total + seg_size > self.capacity:
                raise OutOfMemory(total, seg_size)
        self.peak = max(self.peak, total + seg_size)


@dataclass
class Pools:
    """One `CachingAllocator` per CUDA stream: a freed block is cached for the stream that
    allocated it (`Block.stream`; `get_free_block` looks only in the pool of the requesting
    stream), so what one stream frees another cannot reuse. Segments are never released, so
    peak reserved is the sum of the pools' reserved bytes at the end."""

    pools: dict[int, CachingAllocator] = field(default_factory=dict)
    allocated: int = 0
    peak_allocated: int = 0
    released_peak: int = 0  # reserved just before the last empty_cache, if one ran

    @property
    def peak_reserved(self) -> int:
        return max(self.released_peak, sum(pool.reserved for pool in self.pools.values()))

    def empty_cache(self) -> None:
        self.released_peak = max(self.released_peak, self.peak_reserved)
        for pool in self.pools.values():
            pool.empty_cache()

    @property
    def segments(self) -> list[int]:
        return [size for pool in self.pools.values() for size in pool.segment_sizes]


def replay(events: list[tuple[str, object, int]], track_allocated: bool = True) -> Pools:
    """events: ("a", name, bytes) allocates a tensor called name on the default stream,
    ("a", name, bytes, stream) on another stream; ("f", name, 0) frees it; ("d", name, 0) counts
    it freed while its block stays in use to its "f" (a block `record_stream` holds for another
    stream, `_Seq.drop`); ("e", None, 0) empties every pool's cache (`CachingAllocator.empty_cache`).
    `track_allocated=False` skips the peak allocated (planning reads only reserved)."""
    out = Pools()
    pools = out.pools
    default = pools[DEFAULT_STREAM] = CachingAllocator()
    handles: dict[object, tuple[CachingAllocator, _Block | None]] = {}
    several = any(len(event) > 3 for event in events)
    peak = 0
    dropped: dict[object, int] = {}  # names counted freed whose blocks are still held ("d")
    held_dropped = 0
    for event in events:
        if event[0] == "a":
            if len(event) > 3:
                pool = pools.get(event[3])
                if pool is None:
                    pool = pools[event[3]] = CachingAllocator()
            else:
                pool = default
            handles[event[1]] = (pool, pool.malloc(event[2]))
            if track_allocated:
                allocated = sum(p.allocated for p in pools.values()) if several else default.allocated
                if allocated - held_dropped > peak:
                    peak = allocated - held_dropped
        elif event[0] == "f":
            pool, handle = handles.pop(event[1])
            pool.free(handle)
            held_dropped -= dropped.pop(event[1], 0)
        elif event[0] == "d":
            pool, handle = handles[event[1]]
            dropped[event[1]] = handle.size if handle is not None else 0
            held_dropped += dropped[event[1]]
        else:
            out.empty_cache()
    out.allocated = sum(p.allocated for p in pools.values()) - held_dropped
    out.peak_allocated = peak
    return out

