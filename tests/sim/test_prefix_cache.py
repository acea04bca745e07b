import pytest

from servelens.sim.prefix_cache import PrefixCache, block_hashes


def test_block_hash_depends_on_whole_prefix() -> None:
    a = block_hashes(list(range(40)), 16)
    b = block_hashes([99, *range(1, 40)], 16)
    assert len(a) == 2  # the partial third block is not hashed
    assert a[0] != b[0] and a[1] != b[1]  # same second block tokens, different prefix
    assert block_hashes(list(range(40)), 16) == a


def test_match_counts_leading_blocks_and_always_leaves_one_token() -> None:
    c = PrefixCache(block_size=16, capacity_blocks=100)
    ids = list(range(64))
    h = block_hashes(ids, 16)
    assert c.match(h, 64) == 0
    c.insert(h)
    assert c.match(h, 64) == 48  # fully cached prompt: last block recomputed (>= 1 token computed)
    longer = ids + [7] * 10
    assert c.match(block_hashes(longer, 16), 74) == 64
    assert c.hit_tokens == 112 and c.query_tokens == 64 + 64 + 74


def test_lru_eviction_and_disabled_cache() -> None:
    c = PrefixCache(block_size=4, capacity_blocks=2)
    h1 = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    h2 = block_hashes([9, 9, 9, 9], 4)
    c.insert(h1)
    c.insert(h2)  # evicts h1's first block
    assert len(c) == 2
    assert c.match(h1, 9) == 0
    off = PrefixCache(block_size=4, capacity_blocks=0)
    off.insert(h1)
    assert off.match(h1, 9) == 0 and not off.enabled
    with pytest.raises(ValueError):
        PrefixCache(block_size=0)
