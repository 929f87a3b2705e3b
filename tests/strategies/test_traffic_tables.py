"""Every strategy's traffic at awkward sizes, worked out by hand from the algorithms' definitions (never from
`traffic()`): bytes each rank sends and receives, and, where the algorithm alone fixes them, the rounds and the
bytes on the critical path. `traffic()` must agree with the tables, and so must the bytes a run on thread ranks
counts.

float32 (4 bytes) throughout; chunk_bounds splits n elements into balanced chunks, the larger ones first.

Priced by the cost model, see test_validation (the cost model against SimGrid; tests/experiments/test_simulate.py):
the critical path (rounds, path bytes) of reduce_broadcast, the parameter server and its variants, and the
node-aware strategies (ranks_per_node > 1) is a model of contention checked against the simulator, not a count
of the algorithm's steps: their tables below pin bytes and messages only (rounds: PRICED_BY_THE_COST_MODEL).
"""

from __future__ import annotations

import numpy as np
import pytest

import strategies
from strategies.testing import make_inputs, run_collective

MIB = 1 << 20
PRICED_BY_THE_COST_MODEL = None  # see the module docstring: rounds and path bytes not pinned here


# -- ring on 3 ranks, 7 elements --------------------------------------------------------------------------------
# chunks 3, 2, 2 elements = 12, 8, 8 B. Rank p's reduce-scatter sends chunks p, p-1 and receives p-1, p-2; it
# then owns chunk p+1, and its all-gather sends p+1, p and receives p, p-1 (mod 3).
#   rank 0 sends 0, 2 | 1, 0 = 12 + 8 + 8 + 12 = 40, receives 2, 1 | 0, 2 = 8 + 8 + 12 + 8 = 36
#   rank 1 sends 1, 0 | 2, 1 = 8 + 12 + 8 + 8 = 36, receives 0, 2 | 1, 0 = 12 + 8 + 8 + 12 = 40
#   rank 2 sends 2, 1 | 0, 2 = 8 + 8 + 12 + 8 = 36, receives 1, 0 | 2, 1 = 8 + 12 + 8 + 8 = 36
# 2 (n - 1) = 4 dependent rounds; each round waits for the largest chunk in flight (12 B): path 4 x 12 = 48 B.
RING_3_7 = {"sent": [40, 36, 36], "recv": [36, 40, 36], "msgs": 4, "rounds": 4, "path_bytes": 48}
# ring on 4 ranks, 10 elements: chunks 3, 3, 2, 2 (12, 12, 8, 8 B); rank p sends p, p-1, p-2 | p+1, p, p-1
#   rank 0: 0, 3, 2 | 1, 0, 3 = 12 + 8 + 8 + 12 + 12 + 8 = 60; rank 1: 1, 0, 3 | 2, 1, 0 = 12+12+8+8+12+12 = 64
#   rank 2: 2, 1, 0 | 3, 2, 1 = 8+12+12+8+8+12 = 60; rank 3: 3, 2, 1 | 0, 3, 2 = 8+8+12+12+8+8 = 56
# receives: rank p gets what rank p-1 sends: 56, 60, 64, 60. 6 rounds x 12 B = 72 B.
RING_4_10 = {"sent": [60, 64, 60, 56], "recv": [56, 60, 64, 60], "msgs": 6, "rounds": 6, "path_bytes": 72}

# -- halving-doubling: p = 4 ranks do Rabenseifner, ranks 4.. fold into rank - 4 first, 7 elements ----------------
# round 0: fold, 28 B from rank 4+i to rank i. Round 1 pairs p with p ^ 2 over [0, 7) split at 3: ranks 0, 1 keep
# [0, 3) and send [3, 7) (16 B), ranks 2, 3 keep [3, 7) and send [0, 3) (12 B). Round 2 pairs p with p ^ 1:
# [0, 3) split at 1: rank 0 keeps [0, 1) and sends [1, 3) (8 B), rank 1 keeps [1, 3) and sends [0, 1) (4 B);
# [3, 7) split at 5: 8 B each way. Rounds 3, 4 replay 2, 1 with the ranges swapped; round 5 unfolds (28 B back).
#   rank 0: sends 16 + 8 | 4 + 12 = 40, receives 12 + 4 | 8 + 16 = 40; ranks 2, 3: 12 + 8 | 8 + 16 = 44 each way
#   rank 1: sends 16 + 4 | 8 + 12 = 40, receives 12 + 8 | 4 + 16 = 40; a folded partner adds 28 each way
# rounds 0-5 = 6; the largest message per round: 28, 16, 8, 8, 16, 28 -> 104 B, except that round 0 carries more:
# an unfolded rank posts its first message to a folded rank at once, so it reaches that rank's NIC while the fold's
# 28 B does (measured on SimGrid alpha_beta: docs/validation.md). Into each folded rank, round 0:
#   n = 5 (folded: 0): 28 + rank 2's round-1 12 B + rank 1's round-2 4 B = 44 -> path 104 - 28 + 44 = 120
#   n = 6 (folded: 0, 1): rank 0 gets 28 + 12 (rank 2), rank 1 28 + 12 (rank 3) = 40 -> path 116
#   n = 7 (folded: 0, 1, 2): rank 1 gets 28 + 12 (rank 3; ranks 0 and 2 are folded too) = 40 -> 116, and the fold's
#   second-order chain: rank 3 waits for rank 1 (late by those 12 B) while rank 2, folded but with a folded round-1
#   partner (0), is done early and posts its round-2 message to rank 3 at once: it shares rank 3's download with rank
#   1's round-1 message, one round-2 message on the path (8 B): 124 (e = 3 extra ranks: round 2, eager_behind_fold)
HD = {n: {"sent": [40 + 28 * (n > 4), 40 + 28 * (n > 5), 44 + 28 * (n > 6), 44] + [28] * (n - 4),
          "rounds": 6, "path_bytes": {5: 120, 6: 116, 7: 124}[n]} for n in (5, 6, 7)}
for _n in HD:
    HD[_n]["recv"] = HD[_n]["sent"]
    HD[_n]["msgs"] = None  # folded ranks send more messages: bytes and the path are the point here

# -- double binary tree, 3 ranks, 7 elements, chunks = 2 -------------------------------------------------------
# tree 0 (NCCL btree): parent(1) = (1 ^ 1) | 2 = 2, parent(2) = 4 >= 3 so 2 ^ 2 = 0: the chain 1 -> 2 -> 0;
# tree 1 (odd n: rank r plays r - 1): 2 -> 0 -> 1 (root 1). Both trees have depth 2.
# halves: elements [0, 4) on tree 0 (chunks 2, 2 = 8, 8 B: 16 B), [4, 7) on tree 1 (chunks 2, 1 = 8, 4 B: 12 B);
# every tree edge carries its half up once and down once, so a rank moves its half once per edge it touches:
#   rank 0: tree 0 root, 1 edge (16) + tree 1 middle, 2 edges (2 x 12) = 40 each way
#   rank 1: tree 0 leaf (16) + tree 1 root with one child (12) = 28 each way
#   rank 2: tree 0 middle, 2 edges (2 x 16) + tree 1 leaf (12) = 44 each way
# messages: one per chunk per edge and direction: rank 0: 2 + 2 x 2 = 6, rank 1: 2 + 2 = 4, rank 2: 2 x 2 + 2 = 6.
# The pipeline: chunk c goes up from depth d in slot c + D - d and down in slot c + D + d; the last chunk (c = 1)
# reaches the deepest leaf in slot 1 + 2 + 1 = 4: 2 D + chunks - 1 = 5 rounds. Critical path: the busiest rank's
# bytes (rank 2: 44) streamed, plus the fill and drain, 2 D - 2 = 2 more largest chunks (8 B): 60 B.
DBT_3_7 = {"sent": [40, 28, 44], "recv": [40, 28, 44], "msgs": [6, 4, 6], "rounds": 5, "path_bytes": 60}

# -- all-to-all and the naive ring, 3 ranks, 7 elements (28 B) ---------------------------------------------------
# all-to-all: every rank sends its whole array to each of the 2 others at once: 56 B, 2 messages each way; the
# 2 sends serialize on the transmit side: 2 rounds, 56 B on the path.
A2A_3_7 = {"sent": [56] * 3, "recv": [56] * 3, "msgs": 2, "rounds": 2, "path_bytes": 56}
# naive ring: 2 dependent rounds, each forwarding one whole array: 56 B, 2 messages, path 2 x 28.
NAIVE_3_7 = {"sent": [56] * 3, "recv": [56] * 3, "msgs": 2, "rounds": 2, "path_bytes": 56}

# -- parameter server, 3 workers, 2 servers, 7 elements, partitions of at most 2 elements (8 B) -------------------
# shards [0, 4) and [4, 7); shard 0 in 2 partitions of 2, shard 1 (3 elements) in 2 + 1.
# dedicated: a worker pushes all 7 elements (28 B, 4 messages) and pulls them back; server 0 takes 3 x 16 B
# (6 messages) and answers as much, server 1 3 x 12 B.
PS_PART = 8 / MIB
PS_DEDICATED = {"sent": [28, 28, 28, 48, 36], "recv": [28, 28, 28, 48, 36], "msgs": [4, 4, 4, 6, 6],
                "rounds": PRICED_BY_THE_COST_MODEL}
# colocated: worker 0 runs server 0, worker 1 server 1; the own shard's push and pull move nothing.
#   worker 0: pushes shard 1 (12 B, 2 msgs), answers workers 1, 2 with shard 0 (2 x 16 B, 4 msgs): 44 B, 6 msgs
#   worker 1: pushes shard 0 (16 B, 2 msgs), answers 2 x 12 B (4 msgs): 40 B, 6 msgs
#   worker 2: pushes both shards (28 B, 4 msgs); what each sends, its peers receive: the same per rank.
PS_COLOCATED = {"sent": [44, 40, 28], "recv": [44, 40, 28], "msgs": [6, 6, 4], "rounds": PRICED_BY_THE_COST_MODEL}

# -- reduce + broadcast (flat), 3 ranks, 7 elements: everyone sends its 28 B to rank 0, rank 0 sends 28 B back ----
RB_FLAT_3_7 = {"sent": [56, 28, 28], "recv": [56, 28, 28], "msgs": [2, 1, 1], "rounds": PRICED_BY_THE_COST_MODEL}

# -- hierarchical, 2 nodes of 2 ranks (0, 1 | 2, 3), inner ring, 10 elements in 2 pieces of 5 -----------------------
# pipeline_mb = 6 B: a piece's across-node ring on 2 nodes moves its 5-element chunk's halves (3 + 2 elements), 12 B
# per round, so 2 pieces. Per piece, inside a node: chunks 3, 2 elements (12, 8 B); local position p's
# reduce-scatter sends chunk p and receives the other, it then owns chunk p + 1 and its all-gather sends that one
# and receives chunk p: 20 B each way, 2 messages. Across nodes: chunk 0 (3 elements) between the positions 1
# (ranks 1, 3), a ring of 2 on 3 elements (chunks 2, 1: 8 + 4 = 12 B each way, 2 messages); chunk 1 (2 elements)
# between the positions 0 (ranks 0, 2): 4 + 4 = 8 B each way. Per piece 28 B (ranks 0, 2) and 32 B (ranks 1, 3),
# 4 messages; 2 pieces double it. Through the NIC alone: 16 and 24 B.
HIER_PIPE = 6 / MIB
HIER_2X2 = {"sent": [56, 64, 56, 64], "recv": [56, 64, 56, 64], "msgs": 8, "nic": [16, 24, 16, 24], "pieces": 2,
            "rounds": PRICED_BY_THE_COST_MODEL}

# -- node-aware parameter server, 2 nodes of 2, 7 elements, one colocated server (the defaults) -------------------
# Inside a node: chunks 4, 3 elements (16, 12 B); a ring of 2 leaves position 0 owning chunk 1 and position 1
# chunk 0, each moving 16 + 12 = 28 B each way in 2 messages (reduce-scatter, all-gather). Across: chunk 0's owners
# are ranks 1 and 3, its server on node 0's owner (rank 1): rank 3 pushes 16 B and gets 16 B back; chunk 1's owners
# ranks 0 and 2, server on rank 0: 12 B each way. So ranks 0, 2: 40 B, ranks 1, 3: 44 B, 3 messages each way.
NODE_PS_2X2 = {"sent": [40, 44, 40, 44], "recv": [40, 44, 40, 44], "msgs": 3, "rounds": PRICED_BY_THE_COST_MODEL}

# -- decentralized on a ring of 3, 7 elements: each rank sends its 28 B to both neighbours and receives theirs, one
# message per receiver per slot: 2 slots of 28 B.
DECENTRALIZED_3_7 = {"sent": [56] * 3, "recv": [56] * 3, "msgs": 2, "rounds": 2, "path_bytes": 56}

TABLES = [
    ("ring", {}, 3, 7, RING_3_7),
    ("ring", {}, 4, 10, RING_4_10),
    *[("halving_doubling", {}, n, 7, HD[n]) for n in (5, 6, 7)],
    ("double_binary_tree", {"chunks": 2}, 3, 7, DBT_3_7),
    ("all_to_all", {}, 3, 7, A2A_3_7),
    ("naive_ring", {}, 3, 7, NAIVE_3_7),
    ("parameter_server", {"servers": 2, "partition_mb": PS_PART}, 3, 7, PS_DEDICATED),
    ("parameter_server", {"servers": 2, "partition_mb": PS_PART, "placement": "colocated", "mode": "summation"},
     3, 7, PS_COLOCATED),
    ("reduce_broadcast", {"tree": False}, 3, 7, RB_FLAT_3_7),
    ("hierarchical", {"ranks_per_node": 2, "inner": "ring", "pipeline_mb": HIER_PIPE}, 4, 10, HIER_2X2),
    ("node_parameter_server", {}, 4, 7, NODE_PS_2X2),
    ("decentralized", {"topology": "ring"}, 3, 7, DECENTRALIZED_3_7),
]
# registered strategies without a table here, and why
WITHOUT_TABLE = {
    "native": "its bytes move inside torch.distributed's own allreduce: nothing counted to compare",
    "ddp": "its bytes are its comm's: over gloo uncounted, through a strategy that strategy's (test_ddp_hook)",
    "chain": "the test plug-in (tests/plugin), a stand-in for a third-party strategy",
}
IDS = [f"{name}{''.join(f'[{k}={v:g}]' if isinstance(v, float) else f'[{k}={v}]' for k, v in params.items())}"
       f"-n{n}-numel{numel}" for name, params, n, numel, _ in TABLES]


def _per_rank(value, ranks: int) -> list:
    return list(value) if isinstance(value, list) else [value] * ranks


@pytest.mark.parametrize("name, params, workers, numel, table", TABLES, ids=IDS)
def test_traffic_is_the_hand_worked_table(name, params, workers, numel, table):
    t = strategies.make(name, **params).traffic(workers, numel, 4)
    assert [r.bytes_sent for r in t.ranks] == table["sent"]
    assert [r.bytes_recv for r in t.ranks] == table["recv"]
    if table.get("msgs") is not None:
        assert [r.msgs_sent for r in t.ranks] == _per_rank(table["msgs"], len(t.ranks))
        assert [r.msgs_recv for r in t.ranks] == _per_rank(table["msgs"], len(t.ranks))
    if table["rounds"] is not PRICED_BY_THE_COST_MODEL:
        assert (t.rounds, t.path_bytes) == (table["rounds"], table["path_bytes"])


@pytest.mark.parametrize("name, params, workers, numel, table", TABLES, ids=IDS)
def test_a_run_on_thread_ranks_moves_the_tables_bytes(name, params, workers, numel, table):
    """What the communicator counts per rank in a real sum, against the hand-worked table (not traffic())."""
    op = strategies.make(name, **params).ops[0]  # the bytes do not depend on the op; decentralized has mean only
    inputs = make_inputs(workers, numel, op, np.float32)
    _, counted = run_collective(name, inputs, op=op, timeout=20, **params)
    assert [r["bytes_sent"] for r in counted] == table["sent"]
    assert [r["bytes_recv"] for r in counted] == table["recv"]


def test_the_ring_prices_its_largest_chunk_not_its_smallest():
    """7 elements on 3 ranks: the 3-element chunk (12 B) paces every one of the 4 rounds, not the 2-element ones."""
    t = strategies.make("ring").traffic(3, 7, 4)
    assert t.path_bytes == 4 * 12 != 4 * 8


def test_the_double_binary_tree_path_grows_by_one_chunk_per_extra_chunk_only_in_rounds():
    """Same 3 ranks and 7 elements with chunks = 1: halves are single chunks (16 B and 12 B), 2 D + 1 - 1 = 4
    rounds (slots). The runtime's slots follow one another (a slot's sends leave when the slot before's have), so
    the path is each slot's busiest NIC, summed: every slot moves tree 0's 16 B chunk across one edge, and no rank
    sends both trees' chunks in one slot at one NIC here, so 4 x 16 = 64 B (SimGrid alpha_beta agrees:
    docs/validation.md; the earlier busiest-rank-plus-fill price, 76 B, was 1.07-1.14x off at 8-16 ranks)."""
    t = strategies.make("double_binary_tree", chunks=1).traffic(3, 7, 4)
    assert (t.rounds, t.path_bytes) == (4, 4 * 16)


def test_hierarchicals_pieces_and_what_crosses_the_nic():
    """The table's 2 pieces, and the bytes through the NIC alone (the across-node rings), from HIER_2X2."""
    config = strategies.make("hierarchical", ranks_per_node=2, inner="ring", pipeline_mb=HIER_PIPE)
    assert config.pieces(4, 10, 4) == HIER_2X2["pieces"]
    nic = config.levels(4, 10, 4)["nic"]
    assert [r.bytes_sent for r in nic] == [r.bytes_recv for r in nic] == HIER_2X2["nic"]


def test_every_registered_strategy_has_a_table_or_a_reason():
    """A newly registered strategy fails here until its traffic is worked out by hand above (or it says why not)."""
    assert set(strategies.names()) - set(WITHOUT_TABLE) <= {name for name, *_ in TABLES}
