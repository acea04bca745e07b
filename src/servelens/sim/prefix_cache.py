"""Block-level prefix cache of the simulated engine (pure; modelled on vLLM's automatic prefix caching).

A prompt's token ids are split into full blocks of ``block_size`` tokens (the partial last block is
never cached). Block ``i`` is identified by the hash of the whole prefix up to and including it,
computed as a chain ``h_i = hash((h_{i-1}, tokens of block i))`` (vLLM: ``hash_block_tokens``), so
two prompts share block ``i`` only if they share every token before it.

The cache is an LRU of block hashes with a capacity in blocks. A lookup matches the longest run of
leading blocks present; like vLLM, at least one prompt token is always computed, so a prompt that
is entirely cached reports ``(isl - 1) // block_size * block_size`` cached tokens. Blocks of a
prompt are inserted when its prefill completes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (``len(token_ids) // block_size`` of them).

    Raises ValueError if ``block_size < 1``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    out: list[int] = []
    h = 0
    ids = tuple(token_ids)
    for start in range(0, len(ids) - block_size + 1, block_size):
        h = hash((h, ids[start : start + block_size]))
        out.append(h)
    return out


class PrefixCache:
    """LRU of prompt blocks.

    Args:
        block_size: tokens per block (vLLM's default is 16).
        capacity_blocks: how many blocks the cache holds; 0 disables caching.

    Raises ValueError for ``block_size < 1`` or ``capacity_blocks < 0``.
    """

    __slots__ = ("_lru", "block_size", "capacity_blocks", "hit_tokens", "query_tokens")

    def __init__(self, block_size: int = 16, capacity_blocks: int = 16384) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.query_tokens = 0  # prompt tokens looked up (vllm:prefix_cache_queries_total)
        self.hit_tokens = 0  # of which cached (vllm:prefix_cache_hits_total)

    @property
    def enabled(self) -> bool:
        """Whether the cache can hold anything."""
        return self.capacity_blocks > 0

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, hashes: Sequence[int], isl: int) -> int:
        """Cached tokens for a prompt of ``isl`` tokens with these block hashes (touches hits).

        Returns a multiple of ``block_size``, at most ``isl - 1``.
        """
        self.query_tokens += isl
        if not self.enabled:
            return 0
        lru = self._lru
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        max_blocks = max(isl - 1, 0) // self.block_size
        n = min(n, max_blocks)
        for h in hashes[:n]:
            lru.move_to_end(h)
        cached = n * self.block_size
        self.hit_tokens += cached
        return cached

    def insert(self, hashes: Sequence[int]) -> None:
        """Add (or refresh) the blocks of a prefilled prompt, evicting least recently used ones."""
        if not self.enabled:
            return
        lru = self._lru
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > self.capacity_blocks:
            lru.popitem(last=False)

    def clear(self) -> None:
        """Drop every block."""
        self._lru.clear()
