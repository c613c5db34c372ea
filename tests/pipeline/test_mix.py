"""Mixes and balance (pipeline/order/mix.py, pipeline/mixsource.py): exact quotas per split and
per class every epoch on every rank count, draws without replacement, resume on another number
of ranks, the state's checks, and the Loader over several generated splits."""

import collections
import json
import tracemalloc

import numpy as np
import pytest

from helpers import write_split
from stoker.pipeline import Loader
from stoker.pipeline.balance_tables import ClassSlots
from stoker.pipeline.order.mix import MixOrder, MixPlan, largest_remainder
from stoker.pipeline.shards.samples import open_split


def _orders(plan, world, members=None, batch=1):
    members = members or [None] * len(plan.sizes)
    offsets = np.cumsum([0, *plan.sizes[:-1]])
    return [
        MixOrder(plan, members, offsets, rank=r, world_size=world, train=True, batch_size=batch, drop_last=True)
        for r in range(world)
    ]


def _epoch(orders, seed, epoch, offset=0, start=0):
    return np.concatenate([o.positions(seed, epoch, offset)[start:] for o in orders])


def _split_counts(plan, positions):
    return np.bincount(np.searchsorted(np.cumsum(plan.sizes), positions, side="right"), minlength=len(plan.sizes))


def test_largest_remainder_sums_to_the_total_and_rounds_each_share_to_a_neighbour():
    rng = np.random.default_rng(0)
    for _ in range(200):
        w = rng.random(rng.integers(1, 12)) * rng.integers(0, 2, 1)[0] + rng.random(1)[0] * 0.01
        total = int(rng.integers(0, 5000))
        parts = largest_remainder(total, w.tolist())
        assert parts.sum() == total
        exact = total * w / w.sum()
        assert np.all(np.abs(parts - exact) < 1)
    assert largest_remainder(10, [0.7, 0.3]).tolist() == [7, 3]
    assert largest_remainder(10, [1, 1, 1]).tolist() == [4, 3, 3]  # ties go to the earlier


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_each_split_gets_exactly_its_quota_every_epoch_on_every_rank_count(world):
    plan = MixPlan([1000, 20], [0.7, 0.3], length=480)
    assert plan.split_quota.tolist() == [336, 144]
    orders = _orders(plan, world)
    assert len({o.share() for o in orders}) == 1  # every rank the same steps
    for epoch in range(4):
        got = _epoch(orders, 5, epoch)
        assert len(got) == 480
        assert _split_counts(plan, got).tolist() == [336, 144]


def test_a_slot_is_drawn_without_replacement_cycle_after_cycle():
    """The small split (20 samples, 144 draws an epoch) and the large one (1000, 336 an epoch):
    after E epochs every sample was drawn floor or ceil of E * quota / size times."""
    plan = MixPlan([1000, 20], [0.7, 0.3], length=480)
    orders = _orders(plan, 3)
    seen = np.concatenate([_epoch(orders, 1, e) for e in range(5)])
    for s, (lo, n) in enumerate(((0, 1000), (1000, 20))):
        counts = np.bincount(seen[(seen >= lo) & (seen < lo + n)] - lo, minlength=n)
        total = 5 * plan.split_quota[s]
        assert set(counts.tolist()) <= {total // n, -(-total // n)}
    first = _epoch(orders, 1, 0)
    big = first[first < 1000]
    assert len(np.unique(big)) == len(big)  # sub-sampled: no sample twice before all are drawn
    assert not np.array_equal(np.sort(big), np.sort(_epoch(orders, 1, 1)[_epoch(orders, 1, 1) < 1000]))


def test_a_three_source_mix_with_a_source_fifty_times_smaller_is_exact():
    plan = MixPlan([5000, 800, 100], [0.5, 0.3, 0.2], length=2400)
    for world in (1, 3, 8):
        orders = _orders(plan, world)
        for epoch in range(3):
            got = _epoch(orders, 2, epoch)
            assert _split_counts(plan, got).tolist() == plan.split_quota.tolist() == [1200, 720, 480]
        small = np.concatenate([_epoch(orders, 2, e) for e in range(3)])
        small = small[small >= 5800] - 5800  # 3 x 480 draws of 100 samples, cycle after cycle
        assert set(np.bincount(small, minlength=100).tolist()) == {14, 15}


def _class_slots(labels, num_classes):
    members = np.argsort(labels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=num_classes))])
    return ClassSlots(starts, members)


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_balanced_classes_get_exactly_their_quota_every_epoch(world):
    """A 100:1 long tail over 10 classes, balanced: each class 48 of 480 draws, on every rank count;
    with dict weights, classes in those proportions."""
    rng = np.random.default_rng(3)
    sizes = np.round(1000 * 100 ** (-np.arange(10) / 9)).astype(int)  # 1000 .. 10
    labels = rng.permutation(np.repeat(np.arange(10), sizes))
    slots = _class_slots(labels, 10)
    plan = MixPlan([len(labels)], [1], length=480, class_counts=[slots.counts()], class_weights=[None])
    orders = _orders(plan, world, [slots])
    for epoch in range(3):
        got = _epoch(orders, 7, epoch)
        assert np.bincount(labels[got], minlength=10).tolist() == [48] * 10
    weights = np.array([3.0] + [1.0] * 9)
    plan = MixPlan([len(labels)], [1], length=480, class_counts=[slots.counts()], class_weights=[weights])
    got = _epoch(_orders(plan, world, [slots]), 7, 0)
    assert np.bincount(labels[got], minlength=10).tolist() == [120] + [40] * 9


def test_a_two_split_mix_with_one_split_balanced():
    labels = np.repeat(np.arange(4), [300, 60, 30, 10])
    slots = _class_slots(labels, 4)
    plan = MixPlan([400, 50], [3, 1], length=480, class_counts=[slots.counts(), None], class_weights=[None, None])
    assert plan.split_quota.tolist() == [360, 120]
    got = _epoch(_orders(plan, 8, [slots, None]), 0, 2)
    assert _split_counts(plan, got).tolist() == [360, 120]
    assert np.bincount(labels[got[got < 400]], minlength=4).tolist() == [90] * 4


def test_resume_mid_epoch_from_four_ranks_on_three_is_exact():
    """4 ranks read 30 samples each; 3 ranks continue from rank 0's state: seen + rest is exactly
    the epoch's multiset (360 draws: 120 + 240 split 80 a rank)."""
    plan = MixPlan([1000, 20], [0.7, 0.3], length=360)
    four = _orders(plan, 4)
    seen = np.concatenate([o.positions(4, 2)[:30] for o in four])
    state = four[0].state(seed=4, epoch=2, position=30, offset=0)
    rest = []
    for o in _orders(plan, 3):
        cursor = o.restore(state, where="mix")
        assert (cursor.offset, cursor.position) == (120, 0)
        rest.append(o.positions(cursor.seed, cursor.epoch, cursor.offset)[cursor.position :])
    assert len({len(r) for r in rest}) == 1
    whole = collections.Counter(_epoch(_orders(plan, 1), 4, 2).tolist())
    assert collections.Counter(np.concatenate([seen, *rest]).tolist()) == whole


def test_resume_on_another_rank_count_whose_default_length_differs_finishes_the_saved_epoch():
    """The default length follows the ranks (a multiple of batch x W): the resumed epoch keeps the
    saved length, its multiset exact; the next epoch is this loader's length."""
    saved_plan, plan = MixPlan([500, 50], [0.5, 0.5], length=544), MixPlan([500, 50], [0.5, 0.5], length=528)
    four = _orders(saved_plan, 4, batch=2)  # 544 = 68 x (2 x 4)
    seen = np.concatenate([o.positions(1, 0)[:20] for o in four])
    state = four[0].state(seed=1, epoch=0, position=20, offset=0)
    eight = _orders(plan, 8, batch=2)  # 528 = 33 x (2 x 8)
    rest = []
    for o in eight:
        cursor = o.restore(state, where="mix")
        assert (cursor.offset, cursor.position, o.stop(cursor.offset)) == (80, 0, 58)
        rest.append(o.positions(cursor.seed, cursor.epoch, cursor.offset))
    whole = collections.Counter(_epoch(_orders(saved_plan, 1), 1, 0).tolist())
    assert collections.Counter(np.concatenate([seen, *rest]).tolist()) == whole  # 80 + 8 x 58
    assert len(eight[0].positions(1, 1)) == 528 // 8  # the next epoch: this loader's length


def test_a_state_of_another_mix_or_of_one_split_is_refused_in_one_line():
    a = _orders(MixPlan([100, 20], [0.7, 0.3], length=60), 1)[0]
    b = _orders(MixPlan([100, 20], [0.6, 0.4], length=60), 1)[0]
    state = a.state(seed=0, epoch=1, position=10, offset=0)
    assert set(state) >= {"mix", "epoch_length"} and all(not isinstance(v, (list, dict)) for v in state.values())
    with pytest.raises(ValueError, match=r"^state was saved with mix \w+, this loader has mix \w+ \(other splits"):
        b.restore(state, where="mix")
    with pytest.raises(ValueError, match="saved by a loader of one split"):
        a.restore({"seed": 0, "epoch": 1, "position": 3, "world_size": 1, "num_samples": 120}, where="mix")
    assert a.restore(state, where="mix").position == 10


def test_a_rank_of_a_ten_million_sample_mix_holds_its_share_only(tmp_path):
    """A 2-split mix of 10 M samples at W=512, its 9 M split balanced over 900 classes whose members
    are a memory-mapped file: a rank's whole epoch allocates on the order of its share."""
    members = np.lib.format.open_memmap(tmp_path / "members.npy", mode="w+", dtype=np.int32, shape=(9_000_000,))
    members[:] = np.arange(9_000_000, dtype=np.int32)  # sorted by class already: class c is c * 10,000 ..
    members.flush()
    slots = ClassSlots(np.arange(0, 9_000_001, 10_000), np.load(tmp_path / "members.npy", mmap_mode="r"))
    tracemalloc.start()
    try:
        plan = MixPlan(
            [9_000_000, 1_000_000],
            [0.5, 0.5],
            length=10_000_000,
            class_counts=[slots.counts(), None],
            class_weights=[None, None],
        )
        got = _orders(plan, 512, [slots, None])[511].positions(0, 3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(got) == 10_000_000 // 512
    assert np.bincount(got[got < 9_000_000] // 10_000, minlength=900).max() < 40  # spread over the classes
    assert peak < 40 * len(got) + (8 << 20), f"{peak:,} bytes for a share of {len(got):,}"


# ---- the Loader over generated splits -------------------------------------------------------
@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    write_split(root / "big", num_samples=60, samples_per_shard=20)
    write_split(root / "small", num_samples=12, samples_per_shard=12, seed=1)
    return root


def _loader(paths, **kw):
    return Loader(paths, **{"batch_size": 8, "crop": 32, "backend": "pil", "threads": 0, **kw})


def test_a_loader_of_two_splits_reads_each_its_quota_and_says_so(splits, capsys):
    loader = _loader([splits / "big", splits / "small"], weights=[0.7, 0.3])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "50 of 72 an epoch from 60 samples" in err[0] and "repeats" in err[1]
    assert loader.mix.quotas == [50, 22] and len(loader) == 9
    for epoch in range(2):
        loader.set_epoch(epoch)
        ids = np.concatenate(list(loader.epoch_batches()))
        assert np.bincount(loader.mix.split_of(ids)).tolist() == [50, 22]
    images, targets = next(iter(loader))
    assert images.shape == (8, 3, 32, 32) and targets.dtype.is_floating_point is False
    assert "big:0.7" in loader.mix.describe() and "small:0.3" in loader.mix.describe()


def test_a_loader_resumed_mid_epoch_on_another_rank_count_is_exact(splits):
    paths = [splits / "big", splits / "small"]
    kw = {"weights": [0.5, 0.5], "epoch_length": 48, "batch_size": 2}
    two = [_loader(paths, rank=r, world_size=2, **kw) for r in range(2)]
    seen = [b for ld in two for b in list(ld.epoch_batches())[:3]]
    state = {**two[0].state_dict(), "position": 6}
    rest = []
    for r in range(3):
        ld = _loader(paths, rank=r, world_size=3, **kw)
        ld.load_state_dict(state)
        rest += list(ld.epoch_batches())
    whole = collections.Counter(np.concatenate(list(_loader(paths, **kw).epoch_batches())).tolist())
    assert collections.Counter(np.concatenate(seen + rest).tolist()) == whole


def test_balance_classes_gives_each_class_its_share(splits):
    loader = _loader(splits / "big", balance="classes", epoch_length=48)
    ids = np.concatenate(list(loader.epoch_batches()))
    assert np.bincount(loader.index.labels(ids)).tolist() == [8] * 6
    loader = _loader(splits / "big", balance={0: 3, 1: 1}, epoch_length=48)
    ids = np.concatenate(list(loader.epoch_batches()))
    assert np.bincount(loader.index.labels(ids), minlength=6).tolist() == [36, 12, 0, 0, 0, 0]


def test_val_of_a_mix_reads_every_sample_of_each_split_once(splits):
    val = _loader([splits / "big", splits / "small"], train=False)
    ids = np.concatenate([val.indices()])
    assert sorted(ids.tolist()) == list(range(72))
    assert sum(len(t) for _, t in val) == 72


def test_a_mix_of_splits_with_other_targets_is_one_line_naming_both(splits, tmp_path):
    write_split(tmp_path / "three", num_samples=6, samples_per_shard=6, classes=["circles", "squares", "rings"])
    with pytest.raises(
        ValueError, match=r"a mix needs splits of one target: .*big has 6 classes .*three has 3 classes"
    ):
        _loader([splits / "big", tmp_path / "three"])


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"weights": [1]}, r"weights=\[1\] has 1 values for 2 splits"),
        ({"weights": [1, -1]}, r"each must be a finite number >= 0"),
        ({"weights": 0.7}, r"weights=0.7 must be a list of numbers, one per split"),
        ({"weights": [0, 0]}, "at least one must be above 0"),
        ({"epoch_length": 0}, "epoch_length=0 must be a positive integer"),
        ({"balance": "labels"}, "balance='labels' must be one of"),
        ({"balance": {9: 1}}, "a class index of"),
        ({"shuffle": "block"}, "a mix reads shuffle='global' only"),
    ],
)
def test_bad_mix_arguments_are_one_line(splits, kw, message):
    with pytest.raises(ValueError, match=message):
        _loader([splits / "big", splits / "small"], **kw)


def test_class_members_file_is_built_once_beside_the_table(splits):
    _loader(splits / "big", balance="classes")
    files = list((splits / "big").glob("stoker.classes.*.npy"))
    assert len(files) == 1
    table = np.load(files[0])
    assert table[:7].tolist() == [0, 10, 20, 30, 40, 50, 60]
    assert json.loads((splits / "big" / "stoker.json").read_text())["num_samples"] == 60


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 4097])
def test_many_bijections_at_once_are_the_permutations_rounds_with_their_own_keys(n):
    from stoker.pipeline.order.permutation import ROUNDS, Permutation, permute_many, stream_keys

    p, i = Permutation(n, seed=3, epoch=2), np.arange(n)
    assert np.array_equal(permute_many(i, n, np.broadcast_to(p._keys, (n, ROUNDS))), p(i))
    sizes = np.array([n, 7, 1, 300])
    t = np.concatenate([np.arange(s) for s in sizes])
    size = np.repeat(sizes, sizes)
    out = permute_many(t, size, stream_keys(5, np.repeat(np.arange(4), sizes)))
    for k, s in enumerate(np.split(out, np.cumsum(sizes)[:-1])):
        assert sorted(s.tolist()) == list(range(sizes[k]))  # each a bijection of its own domain
    again = permute_many(t, size, stream_keys(6, np.repeat(np.arange(4), sizes)))
    assert not np.array_equal(out[n + 8 :], again[n + 8 :])  # another seed, another order


def test_url_splits_mix_like_their_local_copies(splits, tmp_path):
    """Two splits over HTTP (the same shard names, one cache_dir) and their local copies: the
    same batches, image for image."""
    import torch

    from storage_servers import http_server

    kw = {"weights": [0.7, 0.3], "epoch_length": 24, "seed": 3}
    local = _loader([splits / "big", splits / "small"], **kw)
    with http_server(splits) as base:
        remote = _loader([f"{base}/big", f"{base}/small"], cache_dir=tmp_path / "cache", **kw)
        for e in range(2):
            local.set_epoch(e), remote.set_epoch(e)
            for (li, lt), (ri, rt) in zip(local, remote, strict=True):
                assert torch.equal(li, ri) and torch.equal(lt, rt)
    assert len(list((tmp_path / "cache").iterdir())) == 2  # a cache folder per URL split


def test_balance_of_a_float_split_and_a_float_split_in_a_class_mix_are_one_line(splits, tmp_path):
    from stoker.tools.common.synth import make_regression_csv
    from stoker.tools.pack.api import pack

    pack(make_regression_csv(tmp_path / "src", n=12, seed=1), tmp_path / "reg", workers=1)
    with pytest.raises(
        ValueError,
        match=r"balances a split of class or multilabel targets; .*reg/train is a float split \(balance=.weights.",
    ):
        _loader(tmp_path / "reg" / "train", balance="classes")
    with pytest.raises(ValueError, match=r"big has 6 classes .*, .*reg/train has float targets"):
        _loader([splits / "big", tmp_path / "reg" / "train"])


def test_the_class_members_read_fast_are_the_splits_labels(tmp_path):
    """Digit members are parsed in one pass a shard; a shard with a member that is not only digits
    (a stray space or newline) falls back to the split's decoder: the same classes either way."""
    from stoker.pipeline.balance_tables import _build, _digit_labels
    from stoker.pipeline.shards.manifest import Manifest
    from stoker.pipeline.shards.samples import open_split
    from stoker.pipeline.shards.writer import ShardWriter
    from stoker.tools.common.synth import CLASSES

    classes = list(CLASSES) * 2  # 12 classes: two-digit members
    write_split(tmp_path / "a", num_samples=40, samples_per_shard=20, classes=classes)
    jpg = open_split(tmp_path / "a").image(0).tobytes()
    with ShardWriter(tmp_path / "a" / "shard-000001.tar") as w:  # padding in the second shard
        for i, cls in enumerate([b"11", b" 3", b"10", b"0", b"7\n"]):
            w.write(f"{i:09d}", {"jpg": jpg, "cls": cls})
    m = Manifest.load(tmp_path / "a")
    m.shards, m.num_samples = [m.shards[0], w.info], 25
    m.save(tmp_path / "a")
    index = open_split(tmp_path / "a")
    labels = index.labels(index.valid_at(np.arange(index.num_valid)))
    assert labels[20:].tolist() == [11, 3, 10, 0, 7] and labels[:20].max() == 11
    assert _digit_labels(index, 0, index.valid_at(np.arange(20)), 12).tolist() == labels[:20].tolist()
    assert _digit_labels(index, 1, index.valid_at(np.arange(20, 25)), 12) is None  # the decoder reads it
    table = _build(index, 12)
    assert table[:13].tolist() == np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=12))]).tolist()
    assert np.array_equal(labels[table[13:]], np.sort(labels))  # grouped by class


def test_without_weights_a_mix_reads_each_sample_once_an_epoch(splits):
    loader = _loader([splits / "big", splits / "small"])  # 60 + 12 = 72, 9 batches of 8
    assert loader.mix.quotas == [60, 12]
    for epoch in range(2):
        loader.set_epoch(epoch)
        ids = np.concatenate(list(loader.epoch_batches()))
        assert sorted(ids.tolist()) == list(range(72))


def test_a_mix_over_the_pixel_tier_reads_the_same_batches_with_a_store_per_split(splits, tmp_path):
    """The first epoch fills each split's store, the next crops from them: the same samples and
    labels as the JPEG path, pixels within one grey level, each split its quota."""
    import torch

    from helpers import run_epoch

    kw = {"weights": [0.7, 0.3], "epoch_length": 40, "seed": 5, "crop": 48}  # no JPEG draft at 48 (test_pixels)
    paths = [splits / "big", splits / "small"]
    jpeg, tier = _loader(paths, **kw), _loader(paths, pixel_cache=tmp_path / "px", **kw)
    for epoch in (0, 1):
        a, ya = run_epoch(tier, epoch)
        b, yb = run_epoch(jpeg, epoch)
        assert torch.equal(torch.cat(ya), torch.cat(yb))
        assert max(int((x.int() - y.int()).abs().max()) for x, y in zip(a, b, strict=True)) <= 1
        assert np.bincount(tier.mix.split_of(np.concatenate(list(tier.epoch_batches())))).tolist() == [28, 12]
    store = tier.pixel_store
    assert [s.split_dir.name.split("-")[0] for s in store.stores] == ["big", "small"]
    filled = [s.stats()["filled"] for s in store.stores]
    assert filled == [56, 12]  # big: 28 an epoch, none twice in its cycle of 60; small: whole each epoch
    assert store.stats()["filled"] == 68 and tier.runner.from_store == 12  # epoch 1: small's from its store


def test_url_splits_in_a_mix_fill_the_pixel_tier_once_fetched(splits, tmp_path):
    """Over HTTP, each URL split's store is laid out at the first batch (its shards fetched by
    then): the same labels as the local JPEG path, pixels within one grey level."""
    import torch

    from helpers import run_epoch
    from storage_servers import http_server

    kw = {"weights": [0.5, 0.5], "epoch_length": 16, "seed": 2, "crop": 48}
    local = _loader([splits / "big", splits / "small"], **kw)
    with http_server(splits) as base:
        remote = _loader(
            [f"{base}/big", f"{base}/small"], cache_dir=tmp_path / "cache", pixel_cache=tmp_path / "px", **kw
        )
        a, ya = run_epoch(remote, 0)
    b, yb = run_epoch(local, 0)
    assert torch.equal(torch.cat(ya), torch.cat(yb))
    assert max(int((x.int() - y.int()).abs().max()) for x, y in zip(a, b, strict=True)) <= 1
    assert [s.stats()["filled"] for s in remote.pixel_store.stores] == [8, 8]


@pytest.fixture(scope="module")
def weighted(tmp_path_factory):
    """A CSV split packed with ``--weight-column w``: weights 0..5 and a row whose weight is bad."""
    from stoker.tools.common.synth import make_regression_csv
    from stoker.tools.pack import Reading, pack

    root = tmp_path_factory.mktemp("weighted")
    csv = make_regression_csv(root / "src", n=13, seed=2)
    lines = csv.read_text().splitlines()
    weights = {f"images/{k:05d}.jpg": [0, 1, 2, 3, 5, 0.5][k % 6] for k in range(12)}
    rows = [f"{lines[0]},w"] + [f"{ln},{weights.get(ln.split(',')[0], 'heavy')}" for ln in lines[1:]]
    csv.write_text("\n".join(rows) + "\n")
    pack(csv, root / "out", workers=1, reading=Reading(weight_column="w"))
    return root / "out" / "train", weights


def test_balance_weights_reads_each_sample_its_exact_share_of_the_packed_weights(weighted):
    split, weights = weighted
    rejects = "".join(p.read_text() for p in split.parent.rglob("rejects.jsonl"))
    assert "weight 'w' is not a finite number >= 0: 'heavy'" in rejects
    index = open_split(split, with_json=True)
    w = [weights[json.loads(index.meta(i))["path"]] for i in range(len(index))]
    for world, length in ((1, 50), (2, 52), (3, 51)):
        expected = largest_remainder(length, w)  # Hamilton's method, in exact integers
        for epoch in range(2):
            got = np.zeros(len(w), np.int64)
            for r in range(world):
                ld = _loader(split, balance="weights", epoch_length=length, rank=r, world_size=world, batch_size=1)
                ld.set_epoch(epoch)
                got += np.bincount(ld.indices(), minlength=len(w))
            assert got.tolist() == expected.tolist() and got[np.asarray(w) == 0].sum() == 0


def test_weights_of_a_split_packed_without_them_and_a_bad_weight_column_are_one_line(splits, weighted, tmp_path):
    from stoker.errors import UsageError
    from stoker.tools.pack import Reading, pack

    with pytest.raises(ValueError, match=r"balance='weights' draws by the weights `stoker pack --weight-column`"):
        _loader(splits / "big", balance="weights")
    csv = weighted[0].parent.parent / "src" / "targets.csv"
    named = r"weight.column 'weight' is not a column of .*targets.csv \(its header names path, temperature, w\)"
    with pytest.raises(UsageError, match=named):
        pack(csv, tmp_path / "o", workers=1, reading=Reading(weight_column="weight"))


def test_a_weighted_state_resumes_at_its_epoch_length_only(weighted):
    """Each sample's count is cut from the epoch length: a state resumes mid-epoch exactly at the
    same length on another number of ranks; at another length, one line naming the length."""
    split = weighted[0]
    kw = {"balance": "weights", "epoch_length": 48, "batch_size": 2}
    two = [_loader(split, rank=r, world_size=2, **kw) for r in range(2)]
    seen = [b for ld in two for b in list(ld.epoch_batches())[:3]]
    state = {**two[0].state_dict(), "position": 6}
    rest = []
    for r in range(3):
        ld = _loader(split, rank=r, world_size=3, **kw)
        ld.load_state_dict(state)
        rest += list(ld.epoch_batches())
    whole = collections.Counter(np.concatenate(list(_loader(split, **kw).epoch_batches())).tolist())
    assert collections.Counter(np.concatenate(seen + rest).tolist()) == whole
    other = _loader(split, **{**kw, "epoch_length": 40})
    with pytest.raises(ValueError, match=r"epoch_length=48, this loader's 40: .*give epoch_length=48"):
        other.load_state_dict(state)


def test_balance_classes_of_a_multilabel_split_gives_each_rarest_label_its_share(tmp_path):
    """Each sample counts for its rarest label: a (on all 12), b (on 4), c (on 2) each a third."""
    from stoker.tools.common.synth import make_regression_csv
    from stoker.tools.pack import Reading, pack

    csv = make_regression_csv(tmp_path / "src", n=12, seed=3)
    lines = csv.read_text().splitlines()
    cells = ["a|c" if k in (1, 2) else "a|b" if k % 3 == 0 else "a" for k in range(12)]
    rows = [f"{ln.split(',')[0]},{c}" for ln, c in zip(lines[1:], cells, strict=True)]
    csv.write_text("\n".join(["path,label", *rows]) + "\n")
    pack(csv, tmp_path / "out", workers=1, reading=Reading(targets="multilabel"))
    split = tmp_path / "out" / "train"
    for world in (1, 2, 3):
        got = []
        for r in range(world):
            ld = _loader(split, balance="classes", epoch_length=30, rank=r, world_size=world, batch_size=1)
            got += ld.indices().tolist()
        hot = ld.index.targets(np.asarray(got)) > 0
        rarest = np.where(hot, np.array([12, 4, 2]), 99).argmin(1)  # the samples each label is on
        assert np.bincount(rarest, minlength=3).tolist() == [10, 10, 10]
        assert len(set(np.asarray(got)[rarest == 2].tolist())) == 2  # c's two samples, 5 times each
    only_c = _loader(split, balance={2: 1}, epoch_length=8, batch_size=1).indices()
    assert (_loader(split, train=False).index.targets(only_c)[:, 2] > 0).all()


@pytest.mark.parametrize("slots", [2, 40])
def test_the_draws_of_few_streams_are_those_of_the_vectorized_pass(slots):
    """A batch of draws from few (slot, cycle) bijections is evaluated a bijection at a time with
    scalar keys: the same members as the one vectorized pass with keys per element, bit for bit."""
    from stoker.pipeline.order.permutation import permute_many, stream_keys

    counts = np.arange(1, slots + 1) * 7
    plan = MixPlan([int(counts.sum()), 9], [0.8, 0.2], length=3000, class_counts=[counts, None])
    for epoch in (0, 3):
        m = np.random.default_rng(epoch).permutation(plan.length)
        slot, member = plan.draws(5, epoch, m)
        d = epoch * plan.slot_quota[slot] + (m - plan.slot_start[slot])
        size = plan.slot_size[slot]
        stream = (slot.astype(np.uint64) << np.uint64(40)) ^ (d // size).astype(np.uint64)
        streams, which = np.unique(stream, return_inverse=True)
        assert np.array_equal(member, permute_many(d % size, size, stream_keys(5, streams), which.reshape(-1)))
