import shutil
import subprocess

import numpy as np
import pytest

from stoker.errors import ManifestError
from stoker.pipeline.order import epoch_permutation, rank_indices
from stoker.pipeline.shards.idx import index_tar, read_idx
from stoker.pipeline.shards.manifest import Manifest, check_shards


def test_fixture_shards_roundtrip_index_and_manifest(tiny_shards):
    root = tiny_shards(n=20, per_shard=8)
    m = Manifest.load(root / "train")
    assert m.num_samples == 20 and [s.num_samples for s in m.shards] == [8, 8, 4]
    check_shards(root / "train", m, sha256=True)
    for s in m.shards:
        tar = root / "train" / s.name
        assert read_idx(tar.with_suffix(".idx")) == index_tar(tar)


@pytest.mark.skipif(
    shutil.which("wds2idx") is None and not shutil.os.path.exists(".venv/bin/wds2idx"),
    reason="DALI's wds2idx not installed",
)
def test_idx_equals_dali_wds2idx(tiny_shards, tmp_path):
    root = tiny_shards(n=10, per_shard=10)
    tar = root / "train" / "shard-000000.tar"
    exe = shutil.which("wds2idx") or ".venv/bin/wds2idx"
    subprocess.run([exe, str(tar), str(tmp_path / "dali.idx")], check=True, capture_output=True)
    assert (tmp_path / "dali.idx").read_text() == tar.with_suffix(".idx").read_text()


def test_check_shards_names_truncated_and_missing(tiny_shards):
    root = tiny_shards(n=20, per_shard=8)
    m = Manifest.load(root / "train")
    shard = root / "train" / m.shards[1].name
    shard.write_bytes(shard.read_bytes()[:-512])
    with pytest.raises(ManifestError, match=m.shards[1].name):
        check_shards(root / "train", m)
    shard.unlink()
    with pytest.raises(ManifestError, match="missing"):
        check_shards(root / "train", m)


def test_manifest_missing_gives_hint(tiny_shards):
    root = tiny_shards(n=4, per_shard=4)
    with pytest.raises(ManifestError, match="did you mean"):
        Manifest.load(root)


def test_epoch_permutation_is_deterministic_and_fresh():
    a = epoch_permutation(1000, seed=1, epoch=0)
    assert sorted(a.tolist()) == list(range(1000))
    assert np.array_equal(a, epoch_permutation(1000, seed=1, epoch=0))
    assert not np.array_equal(a, epoch_permutation(1000, seed=1, epoch=1))
    assert not np.array_equal(a, epoch_permutation(1000, seed=2, epoch=0))


@pytest.mark.parametrize("n,world", [(10, 3), (101, 4), (7, 1)])
def test_rank_slices_disjoint_equal_train_exact_val(n, world):
    train = [rank_indices(n, seed=0, epoch=3, rank=r, world_size=world, train=True) for r in range(world)]
    assert len({len(t) for t in train}) == 1
    flat = np.concatenate(train)
    assert len(set(flat.tolist())) == len(flat) == (n // world) * world
    val = [rank_indices(n, seed=0, epoch=3, rank=r, world_size=world, train=False) for r in range(world)]
    assert sorted(np.concatenate(val).tolist()) == list(range(n))


@pytest.mark.parametrize("n,world", [(10, 3), (101, 4), (7, 1), (2, 3)])
def test_samples_per_rank_matches_rank_indices(n, world):
    from stoker.pipeline.order import samples_per_rank

    for train in (True, False):
        for r in range(world):
            idx = rank_indices(n, seed=0, epoch=0, rank=r, world_size=world, train=train)
            assert samples_per_rank(n, rank=r, world_size=world, train=train) == len(idx)


@pytest.mark.parametrize(
    "name",
    [
        "plain/000001.jpg",
        "a b.jpg",
        "c\nd.cls",
        "e%41f.jpg",
        "tab\t.x",
        "ü ñ.jpg",
        "caf\udce9.jpg",
        "\u3000wide space.jpg",
    ],
)
def test_idx_names_escape_to_one_field_and_back(name, tmp_path):
    from stoker.pipeline.shards.idx import Component, escape_name, unescape_name, write_idx

    field = escape_name(name)
    assert len(field.split()) == 1 and unescape_name(field) == name
    if not any(c.isspace() or c == "%" or "\udc80" <= c <= "\udcff" for c in name):
        assert field == name  # what DALI's wds2idx writes for ordinary names
    samples = [[Component("jpg", 512, 10, name), Component("cls", 1536, 1, name)]]
    write_idx(tmp_path / "x.idx", samples)
    assert read_idx(tmp_path / "x.idx") == samples


def test_scan_tar_reads_non_utf8_member_names(tmp_path):
    import io
    import tarfile

    from stoker.pipeline.shards.idx import scan_tar

    with tarfile.open(tmp_path / "t.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in (("caf\udce9.jpg", b"x" * 10), ("caf\udce9.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    scan = scan_tar(tmp_path / "t.tar")
    assert [[c.ext for c in s] for s in scan.samples] == [["jpg", "cls"]] and not scan.problems
    assert scan.samples[0][0].name == "caf\udce9.jpg"
