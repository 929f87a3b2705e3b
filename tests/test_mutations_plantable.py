"""Every planted bug of tests/mutations.py (`make mutations`) can still be planted: its line is in its file exactly
once. A refactor that moves or rewrites a line leaves its mutation stale, and `make mutations` would then report a
bug it never planted (three report mutations and the double binary tree's had gone stale that way)."""

from pathlib import Path

import pytest

from tests import mutations

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mutation", mutations.MUTATIONS, ids=lambda m: m.name)
def test_the_mutation_can_be_planted(mutation):
    path = ROOT / mutation.path
    assert path.exists(), f"{mutation.name}: {mutation.path} is gone"
    assert path.read_text().count(mutation.old) == 1, \
        f"{mutation.name}: {mutation.old!r} is not in {mutation.path} exactly once"
