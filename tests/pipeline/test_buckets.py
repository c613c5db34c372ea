"""Aspect-ratio buckets as an order (pure, no decoding): every batch one bucket, each epoch's
multiset exact, every rank the same steps, resume exact on the same and on another number of ranks,
and ``sync`` giving every step one bucket on all ranks."""

import numpy as np
import pytest

from stoker.errors import ArgumentError
from stoker.pipeline.order.buckets import BucketOrder, Buckets, auto_buckets, shape_for

SHAPES = Buckets.of([(16, 32), (24, 24), (32, 16)])


def _aspects(n: int, seed: int = 0) -> np.ndarray:
    """``(width, height)`` rows of three aspect families, uneven (a bucket's remainder waits)."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, n, p=[0.5, 0.3, 0.2])
    base = np.array([[64, 32], [48, 48], [30, 60]])
    return base[kind] + rng.integers(-3, 4, (n, 2))


def _order(bucket_of, *, rank=0, world=1, train=True, batch=4, sync=False):
    n = len(bucket_of)
    return BucketOrder(
        [n],
        buckets=SHAPES,
        bucket_of=bucket_of,
        sync=sync,
        rank=rank,
        world_size=world,
        train=train,
        batch_size=batch,
        drop_last=train,
    )


def _epoch(bucket_of, *, world, train=True, seed=3, epoch=1, sync=False, offset=0, start=0):
    """Each rank's batches, read as a Loader reads them."""
    out = []
    for r in range(world):
        o = _order(bucket_of, rank=r, world=world, train=train, sync=sync)
        batches = o.batches(seed, epoch, offset, start, o.stop(offset), lambda k: k)
        out.append([(batches.bucket(i), batches[i]) for i in range(len(batches))])
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
def test_train_epoch_is_exact_one_bucket_a_batch_equal_steps(world):
    bucket_of = SHAPES.assign(_aspects(203))
    ranks = _epoch(bucket_of, world=world)
    steps = {len(r) for r in ranks}
    assert len(steps) == 1 and steps.pop() > 0  # every rank the same steps
    seen = np.concatenate([b for r in ranks for _, b in r])
    assert len(np.unique(seen)) == len(seen)  # nobody twice
    for r in ranks:
        for bucket, ids in r:
            assert len(ids) == 4 and (bucket_of[ids] == bucket).all()  # one bucket a batch
    o = _order(bucket_of, world=world)
    assert len(seen) == 203 - o.waiting() and o.waiting() < 4 * 3 + 4 * world  # what waits is said
    other = np.concatenate([b for r in _epoch(bucket_of, world=world, epoch=2) for _, b in r])
    assert not np.array_equal(np.sort(seen), np.sort(other)) or o.waiting() == 0  # another few wait
    assert not np.array_equal(seen, other)  # a fresh order each epoch


@pytest.mark.parametrize("world", [1, 2, 3])
def test_val_sees_every_sample_once(world):
    bucket_of = SHAPES.assign(_aspects(101))
    ranks = _epoch(bucket_of, world=world, train=False)
    seen = np.concatenate([b for r in ranks for _, b in r])
    assert sorted(seen.tolist()) == list(range(101))
    assert max(map(len, ranks)) - min(map(len, ranks)) <= 1
    for r in ranks:
        for bucket, ids in r:
            assert (bucket_of[ids] == bucket).all()


def test_sync_gives_every_step_one_bucket_on_all_ranks():
    bucket_of = SHAPES.assign(_aspects(300))
    ranks = _epoch(bucket_of, world=3, sync=True)
    for step in zip(*ranks, strict=True):
        assert len({bucket for bucket, _ in step}) == 1
    seen = np.concatenate([b for r in ranks for _, b in r])
    assert len(np.unique(seen)) == len(seen) == 300 - _order(bucket_of, world=3, sync=True).waiting()


@pytest.mark.parametrize("world, new_world", [(4, 3), (2, 2), (3, 1)])
def test_resume_mid_epoch_is_exact_on_another_number_of_ranks(world, new_world):
    bucket_of = SHAPES.assign(_aspects(401, seed=1))
    p = 3  # batches each rank handed out before the stop
    first = [r[:p] for r in _epoch(bucket_of, world=world)]
    state = _order(bucket_of, rank=0, world=world).state(seed=3, epoch=1, position=p * 4, offset=0)
    rest = []
    for r in range(new_world):
        o = _order(bucket_of, rank=r, world=new_world)
        cur = o.restore(state, where="split")
        b = o.batches(cur.seed, cur.epoch, cur.offset, cur.position, o.stop(cur.offset), lambda k: k)
        rest.append([(b.bucket(i), b[i]) for i in range(len(b))])
    assert len({len(r) for r in rest}) == 1  # equal steps after the resume too
    handed = [ids for r in first + rest for _, ids in r]
    seen = np.concatenate(handed)
    assert len(np.unique(seen)) == len(seen)  # nothing twice
    # and what was handed out is the epoch's chunk sequence from its start, in order: the same
    # chunks an uninterrupted run on world ranks hands out first
    whole = _epoch(bucket_of, world=1)[0]
    total = len(handed)
    assert sorted(map(tuple, handed)) == sorted(tuple(ids) for _, ids in whole[:total])
    if world == new_world:  # the same ranks: bit-exact with the run that never stopped
        assert [ids.tolist() for r in rest for _, ids in r] == [
            ids.tolist() for r in _epoch(bucket_of, world=world) for _, ids in r[p:]
        ]


def test_a_state_of_other_buckets_or_a_sync_resume_on_other_ranks_is_one_line():
    bucket_of = SHAPES.assign(_aspects(200))
    state = _order(bucket_of).state(seed=0, epoch=0, position=8, offset=0)
    other = BucketOrder(
        [200],
        buckets=Buckets.of([(20, 20), (10, 40)]),
        bucket_of=np.zeros(200, np.uint8),
        rank=0,
        world_size=1,
        train=True,
        batch_size=4,
        drop_last=True,
    )
    with pytest.raises(ArgumentError, match="another sample order"):
        other.restore(state, where="split")
    synced = _order(bucket_of, world=2, sync=True).state(seed=0, epoch=0, position=8, offset=0)
    with pytest.raises(ArgumentError, match="resume it on 2 ranks"):
        _order(bucket_of, world=3, sync=True).restore(synced, where="split")


def test_buckets_assign_by_nearest_aspect_and_auto_picks_the_histogram():
    assert SHAPES.assign([[64, 32], [33, 31], [10, 40], [0, 0]]).tolist() == [2, 1, 0, 1]
    wh = _aspects(1000)
    auto = auto_buckets(wh, (24, 24), min_count=16)
    assert 2 <= len(auto.shapes) <= 7
    for h, w in auto.shapes:
        assert h % 8 == 0 and w % 8 == 0 and 0.6 < h * w / 576 < 1.5  # about the crop's area
    counts = np.bincount(auto.assign(wh), minlength=len(auto.shapes))
    assert (counts >= 16).all()
    assert shape_for(16 / 9, 224 * 224) == (168, 296)
    with pytest.raises(ArgumentError, match="two shapes of one aspect"):
        Buckets.of([(10, 20), (20, 40)])
    with pytest.raises(ArgumentError, match="must be 'auto' or a list"):
        Buckets.of("wide")
