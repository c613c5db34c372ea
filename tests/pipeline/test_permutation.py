"""The epoch order's bijection (pipeline/order/permutation.py) and the global order built on it:
exhaustive at small N (a permutation; ranks disjoint and covering; resume and elastic resume
exact), sampled at N = 2^31 and past it without allocating N."""

import tracemalloc

import numpy as np
import pytest

from stoker.pipeline.order import GlobalOrder, epoch_permutation, rank_indices
from stoker.pipeline.order.permutation import Permutation


@pytest.mark.parametrize("n", [*range(1, 70), 127, 128, 129, 1000, 4097])
def test_every_small_n_is_a_permutation_with_its_inverse(n):
    for seed, epoch in ((0, 0), (1, 0), (0, 5), (2**40 + 3, 7)):
        p = Permutation(n, seed=seed, epoch=epoch)
        out = p(np.arange(n))
        assert sorted(out.tolist()) == list(range(n))
        assert np.array_equal(p.inverse(out), np.arange(n))
        assert np.array_equal(out, epoch_permutation(n, seed, epoch))  # the same sequence, built


def test_it_depends_on_seed_and_epoch_and_looks_shuffled():
    n = 10_000
    a = epoch_permutation(n, 1, 0)
    assert not np.array_equal(a, epoch_permutation(n, 1, 1)) and not np.array_equal(a, epoch_permutation(n, 2, 0))
    assert np.array_equal(a, epoch_permutation(n, 1, 0))
    # no trace of the stored order: position and sample uncorrelated, neighbours a third of n apart
    assert abs(np.corrcoef(np.arange(n), a)[0, 1]) < 0.05
    assert abs(np.abs(np.diff(a)).mean() / n - 1 / 3) < 0.02
    # two epochs are unrelated orders
    assert abs(np.corrcoef(a, epoch_permutation(n, 1, 1))[0, 1]) < 0.05


def test_out_of_range_positions_are_refused():
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        Permutation(10, seed=0, epoch=0)(np.array([10]))
    with pytest.raises(ValueError, match="n >= 1"):
        Permutation(0, seed=0, epoch=0)


@pytest.mark.parametrize("n", [1, 2, 7, 30, 61])
def test_ranks_are_disjoint_and_cover_the_epoch_from_any_offset(n):
    for world in range(1, 6):
        for offset in sorted({0, 1, n // 3, n}):
            parts = [
                rank_indices(n, seed=4, epoch=2, rank=r, world_size=world, train=True, offset=offset)
                for r in range(world)
            ]
            per = (n - offset) // world
            assert all(len(p) == per for p in parts)
            seq = epoch_permutation(n, 4, 2)
            # rank r reads sequence positions offset + r + k * world: together the next world * per of them
            assert sorted(np.concatenate(parts).tolist()) == sorted(seq[offset : offset + per * world].tolist())


def _order(n, rank, world, train=True, batch=1):
    return GlobalOrder([n], rank=rank, world_size=world, train=train, batch_size=batch, drop_last=train)


@pytest.mark.parametrize("n", [23, 60])
def test_elastic_resume_hands_out_every_unseen_sample_once(n):
    """W ranks read p samples each, then W' ranks continue from rank 0's state: the epoch's
    sequence is handed out in order, each sample once, to its end (less < W' samples)."""
    for old in range(1, 5):
        for new in range(1, 5):
            for p in range(0, n // old + 1, 3):
                cut = [_order(n, r, old) for r in range(old)]
                seen = [x for o in cut for x in o.positions(9, 1)[:p].tolist()]
                state = cut[0].state(seed=9, epoch=1, position=p, offset=0)
                rest = []
                for r in range(new):
                    o = _order(n, r, new)
                    cursor = o.restore(state, where="split")
                    assert cursor.position == (p if new == old else 0)
                    rest += o.positions(cursor.seed, cursor.epoch, cursor.offset)[cursor.position :].tolist()
                assert len(set(seen + rest)) == len(seen) + len(rest)  # nothing twice
                seq = epoch_permutation(n, 9, 1).tolist()
                done = old * p if new != old else 0
                expected = seq[: done + ((n - done) // new) * new] if new != old else seq[: (n // old) * old]
                assert sorted(seen + rest) == sorted(expected)


N_BIG = [2**31, 2**31 + 12_345, 2**40 + 1]


@pytest.mark.parametrize("n", N_BIG)
def test_at_two_to_the_31_and_past_it_sampled_without_allocating_n(n):
    tracemalloc.start()
    try:
        p = Permutation(n, seed=7, epoch=3)
        i = np.unique(np.random.default_rng(0).integers(0, n, 200_000))
        i = np.concatenate([i, [0, n - 1]])
        out = p(i)
        assert out.min() >= 0 and out.max() < n
        assert len(np.unique(out)) == len(i)  # no two positions share a sample
        assert np.array_equal(p.inverse(out), i)  # and each is that sample's only position
        assert not np.array_equal(out, Permutation(n, seed=7, epoch=4)(i))
        # a rank's share, its resume and an elastic continuation, at a world size that keeps shares small
        world = max(2**17, n >> 14)  # shares of at most 2^14
        rank = world - 1
        share = rank_indices(n, seed=7, epoch=3, rank=rank, world_size=world, train=True)
        assert len(share) == n // world
        assert np.array_equal(share[:5], p(rank + world * np.arange(5)))
        o = _order(n, rank, world)
        state = o.state(seed=7, epoch=3, position=1000, offset=0)
        cursor = o.restore(state, where="split")
        assert np.array_equal(o.positions(7, 3, cursor.offset)[cursor.position :][:3], share[1000:1003])
        wider = _order(n, 5, 3 * world)
        cursor = wider.restore(state, where="split")  # W -> 3W ranks: from sequence position 1000 * W on
        assert cursor.offset == 1000 * world and cursor.position == 0
        after = wider.positions(7, 3, cursor.offset)[:1000]
        before = p(np.linspace(0, 1000 * world - 1, 100_000).astype(np.int64))  # some the old ranks handed out
        assert not set(after.tolist()) & set(before.tolist())
        assert np.array_equal(p.inverse(after), cursor.offset + 5 + 3 * world * np.arange(1000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200 << 20, f"{peak:,} bytes: something allocated on the order of n"


def test_a_state_of_the_older_train_permutation_resumes_at_an_epoch_boundary_only():
    o = _order(60, 0, 1)
    assert o.state(seed=1, epoch=2, position=5, offset=0)["permutation"] == 2
    old = {"seed": 1, "epoch": 2, "position": 0, "world_size": 1, "num_samples": 60, "batch_size": 1}
    assert o.restore(old, where="split") == (1, 2, 0, 0)  # an epoch boundary: nothing to lose
    with pytest.raises(ValueError, match="mid-epoch 2 of a train order this stoker no longer makes"):
        o.restore({**old, "position": 5}, where="split")
    val = GlobalOrder([60], rank=0, world_size=1, train=False, batch_size=1, drop_last=False)
    assert "permutation" not in val.state(seed=1, epoch=2, position=5, offset=0)  # val's order never changed
    assert val.restore({**old, "position": 5}, where="split").position == 5
