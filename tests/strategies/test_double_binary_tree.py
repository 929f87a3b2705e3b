"""The double binary tree: NCCL's two trees (the btree, its mirror for even n and its shift for odd n), each a
binary tree over every rank with one root; per-rank traffic about 2S whatever n; pipelining changes messages, not
bytes. (Results, bitwise agreement and traffic on every world size and op: test_strategy_matrix.)"""

from __future__ import annotations

import pytest

import strategies
from strategies.double_binary_tree import tree_children, tree_parents
from strategies.testing import check_strategy


def test_the_trees_are_nccls():
    # trees.cc's pictures: 12 ranks (mirror, root 11 above 3) and 13 ranks (shift, root 1 above 9)
    assert tree_parents(12, 0)[8] == 0 and tree_parents(12, 0)[4] == 8 and tree_parents(12, 0)[10] == 8
    assert tree_parents(12, 1)[3] == 11 and tree_parents(12, 1)[7] == 3 and tree_parents(12, 1)[0] == 1
    shifted = tree_parents(13, 1)
    assert shifted[9] == 1 and shifted[0] == 9 and shifted[11] == 0 and shifted[5] == 9
    for n in range(2, 17):
        for tree in (0, 1):
            parents = tree_parents(n, tree)
            assert sum(p is None for p in parents) == 1, (n, tree)
            assert max(len(c) for c in tree_children(parents)) <= 2, (n, tree)
        # complementary: no rank has two children in both trees
        both = [r for r in range(n) if len(tree_children(tree_parents(n, 0))[r]) == 2
                and len(tree_children(tree_parents(n, 1))[r]) == 2]
        assert not both, (n, both)


@pytest.mark.parametrize("workers", [2, 5, 8, 16])
def test_every_rank_moves_about_twice_the_array(workers):
    numel = 4000
    traffic = strategies.make("double_binary_tree", chunks=4).traffic(workers, numel)
    for rank in traffic.ranks:
        assert rank.bytes_sent <= 3 * numel * 4 and rank.bytes_recv <= 3 * numel * 4
    # 2 trees x 2 phases (up, down) x (n - 1) edges x half the array
    assert sum(r.bytes_sent for r in traffic.ranks) == 2 * 2 * (workers - 1) * (numel * 4 // 2)


def test_pipelining_changes_messages_not_bytes():
    one, four = (strategies.make("double_binary_tree", chunks=c).traffic(7, 1000) for c in (1, 4))
    assert [r.bytes_sent for r in one.ranks] == [r.bytes_sent for r in four.ranks]
    assert [4 * r.msgs_sent for r in one.ranks] == [r.msgs_sent for r in four.ranks]
    assert four.rounds == one.rounds + 3


def test_bad_chunks_refused_by_value():
    with pytest.raises(ValueError, match="chunks = 0"):
        strategies.make("double_binary_tree", chunks=0)


def test_as_hierarchical_inner_strategy():
    assert check_strategy("hierarchical", world_sizes=(5, 8), numels=(7, 1000), ops=("sum", "mean"),
                          ranks_per_node=2, inner="double_binary_tree") == 8
