"""``Loader(split, buckets=...)`` on every backend that runs here: each batch one shape, the bucket
nearest its images' aspect; each epoch's samples exact (read back from the pixels: each picture is
one colour that names it); every rank the same steps; a resume exact on the same and on another
number of ranks; boxes follow a bucketed resize; what does not apply is one line."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from stoker.errors import IdxFormatError, StokerError
from stoker.pipeline import Loader
from stoker.pipeline.deps import HAS_DALI
from stoker.pipeline.order.buckets import Buckets
from stoker.pipeline.shards.boxes import encode_boxes
from stoker.pipeline.shards.kinds import Target
from stoker.pipeline.shards.manifest import Manifest
from stoker.pipeline.shards.table import write_split_table
from stoker.pipeline.shards.writer import ShardWriter

SIZES = [(64, 32), (32, 64), (48, 48), (60, 40), (40, 60), (72, 36)]  # (width, height)
SHAPES = [(16, 32), (24, 24), (32, 16)]  # (height, width): wide, square, tall
BACKENDS = ["pil", "pixels"] + (["dali"] if HAS_DALI else [])
N = 61


def _colour(k: int) -> tuple[int, int, int]:
    return (4 * k) % 256, 255 - (4 * k) % 256, 40 + 8 * (k // 64)


def _write(split, n: int, seed: int) -> None:
    """A class split of ``n`` lossless solid pictures, sample ``k`` coloured :func:`_colour` ``(k)``,
    the table written with the images' sizes (as pack and index write it)."""
    split.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    with ShardWriter(split / "shard-000000.tar") as w:
        for k in range(n):
            size = SIZES[int(rng.integers(len(SIZES)))]
            buf = io.BytesIO()
            Image.new("RGB", size, _colour(k)).save(buf, "PNG")
            w.write(f"{k:09d}", {"png": buf.getvalue(), "cls": str(k % 3).encode()})
    Manifest(num_samples=n, classes=["a", "b", "c"], shards=[w.info]).save(split)
    write_split_table(split)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("buckets")
    _write(root / "train", N, 0)
    _write(root / "val", 23, 1)
    return root


def _ids(images: torch.Tensor) -> list[int]:
    """Which samples a batch holds, read from the pixels (each picture one colour)."""
    red = images[:, 0].float().mean(dim=(1, 2)).round().int().tolist()
    return [r // 4 for r in red]


def _loader(split, backend: str, tmp_path, **kw) -> Loader:
    if backend == "pixels":
        kw["pixel_cache"] = tmp_path / f"px-{kw.get('rank', 0)}-{kw.get('world_size', 1)}"
    name = "pil" if backend == "pixels" else backend
    return Loader(split, batch_size=4, crop=24, backend=name, threads=0 if name == "pil" else 1, seed=7, **kw)


def _epoch(loader: Loader, epoch: int) -> list[tuple[tuple, list[int]]]:
    loader.set_epoch(epoch)
    return [(tuple(images.shape[-2:]), _ids(images)) for images, _ in loader]


def _aspect_bucket(split, ids: list[int]) -> set:
    """The bucket shape each sample's stored aspect is nearest to."""
    from stoker.pipeline.shards.samples import open_split

    idx = open_split(split)
    chosen = Buckets.of(SHAPES)
    return {chosen.shapes[b] for b in chosen.assign(idx.stored_sizes(np.array(ids)))}


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_epochs_are_exact_one_shape_a_batch_equal_steps(data, tmp_path, backend):
    worlds = [1, 2, 3] if backend == "pil" else [2]
    for world in worlds:
        loaders = [
            _loader(data / "train", backend, tmp_path, buckets=SHAPES, rank=r, world_size=world) for r in range(world)
        ]
        try:
            for epoch in (0, 1):
                ranks = [_epoch(L, epoch) for L in loaders]
                assert len({len(r) for r in ranks}) == 1, "every rank the same steps"
                ids = [i for r in ranks for _, batch in r for i in batch]
                assert len(ids) == len(set(ids)) == N - loaders[0].order.waiting()
                for r in ranks:
                    for shape, batch in r:
                        assert _aspect_bucket(data / "train", batch) == {shape}  # the images' own bucket
        finally:
            for L in loaders:
                L.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_val_sees_every_sample_once_at_its_bucket(data, tmp_path, backend):
    loaders = [
        _loader(data / "val", backend, tmp_path, buckets=SHAPES, rank=r, world_size=2, train=False) for r in range(2)
    ]
    got = [b for L in loaders for b in _epoch(L, 0)]
    for L in loaders:
        L.close()
    assert sorted(i for _, batch in got for i in batch) == list(range(23))
    for shape, batch in got:
        assert _aspect_bucket(data / "val", batch) == {shape}


def test_resume_is_bit_exact_on_the_same_ranks_and_exact_on_others(data, tmp_path):
    whole = [_loader(data / "train", "pil", tmp_path, buckets=SHAPES, rank=r, world_size=2) for r in range(2)]
    reference = [[(x.clone(), y.clone()) for x, y in L] for L in whole]
    stopped = [_loader(data / "train", "pil", tmp_path, buckets=SHAPES, rank=r, world_size=2) for r in range(2)]
    states = []
    for L in stopped:
        it = iter(L)
        next(it), next(it)
        states.append(L.state_dict())
    for r in range(2):  # the same ranks: the rest of the epoch bit for bit
        again = _loader(data / "train", "pil", tmp_path, buckets=SHAPES, rank=r, world_size=2)
        again.load_state_dict(states[r])
        rest = list(again)
        assert len(rest) == len(reference[r]) - 2
        for (x, y), (rx, ry) in zip(rest, reference[r][2:], strict=True):
            assert torch.equal(x, rx) and torch.equal(y, ry)

    four = [_loader(data / "train", "pil", tmp_path, buckets=SHAPES, rank=r, world_size=4) for r in range(4)]
    first = []
    for L in four:
        it = iter(L)
        first += [_ids(next(it)[0]) for _ in range(2)]
    state = four[0].state_dict()
    rest = []
    for r in range(3):  # W=4 -> W'=3
        L = _loader(data / "train", "pil", tmp_path, buckets=SHAPES, rank=r, world_size=3)
        L.load_state_dict(state)
        rest.append([_ids(x) for x, _ in L])
    assert len({len(r) for r in rest}) == 1
    ids = [i for b in first for i in b] + [i for r in rest for b in r for i in b]
    assert len(ids) == len(set(ids))  # nothing twice
    assert len(ids) >= N - 4 * 3 - 4 * 3  # and nothing lost but what waits (a bucket's part batch, a part step)


def test_a_box_follows_a_bucketed_resize(tmp_path):
    split = tmp_path / "val"
    split.mkdir()
    with ShardWriter(split / "shard-000000.tar") as w:
        for k, (size, box) in enumerate([((64, 32), (16, 8, 48, 24)), ((32, 64), (4, 12, 20, 44))]):
            image = np.full((size[1], size[0], 3), 120, np.uint8)
            buf = io.BytesIO()
            Image.fromarray(image).save(buf, "PNG")
            rows = [(*box, 0, 0)]
            meta = {"width": size[0], "height": size[1]}
            w.write(
                f"{k:09d}", {"png": buf.getvalue(), "boxes.npy": encode_boxes(rows), "json": json.dumps(meta).encode()}
            )
    Manifest(num_samples=2, classes=["thing"], shards=[w.info], target=Target.of("boxes")).save(split)
    write_split_table(split)
    with Loader(split, batch_size=1, crop=24, backend="pil", threads=0, train=False, buckets=SHAPES) as L:
        got = [(tuple(x.shape[-2:]), t.boxes[0, : int(t.counts[0])].tolist()) for x, t in L]
    # 64x32 -> the wide bucket 32x16 (w x h): half size; 32x64 -> the tall one 16x32: half size
    assert sorted(got) == sorted([((16, 32), [[8.0, 4.0, 24.0, 12.0]]), ((32, 16), [[2.0, 6.0, 10.0, 22.0]])])


def test_what_does_not_apply_is_one_line(data, tmp_path):
    with pytest.raises(StokerError, match="shuffle='global'"):
        Loader(data / "train", batch_size=4, buckets="auto", backend="pil", threads=0, shuffle="block")
    with pytest.raises(StokerError, match="must be 'auto' or a list"):
        Loader(data / "train", batch_size=4, buckets="wide", backend="pil", threads=0)
    with pytest.raises(StokerError, match="no bucket holds a whole batch"):
        Loader(data / "train", batch_size=40, buckets=SHAPES, backend="pil", threads=0)
    with Loader(data / "train", batch_size=4, crop=24, buckets="auto", backend="pil", threads=0) as L:
        assert 1 <= len(L.order.buckets.shapes) <= 7
        with pytest.raises(StokerError, match="set_crop"):
            L.set_crop(32)
    import shutil

    old = tmp_path / "old"
    shutil.copytree(data / "train", old)
    write_split_table(old, sizes=False)  # as an older stoker left it
    with pytest.raises(IdxFormatError, match="records no image sizes.*stoker index"):
        Loader(old, batch_size=4, buckets="auto", backend="pil", threads=0)


def test_bucket_sync_gives_a_step_one_shape_on_every_rank(data, tmp_path):
    loaders = [
        _loader(data / "train", "pil", tmp_path, buckets=SHAPES, bucket_sync=True, rank=r, world_size=2)
        for r in range(2)
    ]
    ranks = [_epoch(L, 1) for L in loaders]
    assert len(ranks[0]) == len(ranks[1]) > 0
    assert all(a == b for (a, _), (b, _) in zip(*ranks, strict=True))
    ids = [i for r in ranks for _, batch in r for i in batch]
    assert len(ids) == len(set(ids)) == N - loaders[0].order.waiting()


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("how", ["mix", "balance"])
def test_a_mix_and_a_balance_are_bucketed_from_their_own_draws(data, tmp_path, how, world):
    """The policy's epoch (a mix's quotas, a balance's) is what gets bucketed: every batch one shape,
    every rank the same steps, and what is handed out is drawn from that epoch's draws (each sample
    no more often than they hold it), all but fewer than a batch in each bucket."""
    if how == "mix":
        path, kw = [data / "train", data / "val"], {"weights": [0.7, 0.3]}
    else:
        path, kw = data / "train", {"balance": "classes"}
    loaders = [
        Loader(path, batch_size=4, crop=24, backend="pil", threads=0, seed=7, train=True, buckets=SHAPES,
               rank=r, world_size=world, **kw)
        for r in range(world)
    ]  # fmt: skip
    reference = Loader(path, batch_size=4 * world, crop=24, backend="pil", threads=0, seed=7, train=True, **kw)
    for epoch in (0, 1):
        draws = {}
        reference.set_epoch(epoch)
        for g in reference.order.positions(7, epoch):
            draws[int(g)] = draws.get(int(g), 0) + 1
        got = {}
        steps = set()
        for L in loaders:
            L.set_epoch(epoch)
            batches = L.epoch_batches()
            steps.add(len(batches))
            for i in range(len(batches)):
                ids = batches[i]
                assert len(set(Buckets.of(SHAPES).assign(L.index.stored_sizes(ids)).tolist())) == 1
                for g in ids.tolist():
                    got[g] = got.get(g, 0) + 1
        assert len(steps) == 1 and steps.pop() > 0
        loadable = {int(reference.index.valid_at(np.array([k]))[0]): n for k, n in draws.items()}
        assert all(n <= loadable.get(g, 0) for g, n in got.items())  # drawn by the policy, no more often
        assert sum(draws.values()) - sum(got.values()) == loaders[0].order.waiting()
        for L in loaders:  # and the pixels: one shape a batch
            for images, _ in L:
                assert tuple(images.shape[-2:]) in SHAPES
    for L in [*loaders, reference]:
        L.close()


def test_a_bucketed_mix_resumes_bit_exact_on_its_ranks_and_says_so_on_others(data, tmp_path):
    def make(rank, world):
        return Loader([data / "train", data / "val"], weights=[0.6, 0.4], batch_size=4, crop=24, backend="pil",
                      threads=0, seed=5, buckets=SHAPES, rank=rank, world_size=world)  # fmt: skip

    reference = [[(x.clone(), y.clone()) for x, y in make(r, 2)] for r in range(2)]
    for r in range(2):
        stopped = make(r, 2)
        it = iter(stopped)
        next(it), next(it)
        state = stopped.state_dict()
        again = make(r, 2)
        again.load_state_dict(state)
        rest = list(again)
        assert len(rest) == len(reference[r]) - 2
        for (x, y), (rx, ry) in zip(rest, reference[r][2:], strict=True):
            assert torch.equal(x, rx) and torch.equal(y, ry)
    with pytest.raises(StokerError, match="resume it on 2 ranks"):
        make(0, 3).load_state_dict(state)
