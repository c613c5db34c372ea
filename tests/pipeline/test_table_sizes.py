"""Each stored image's width and height in the split's sample table: recorded by pack and index from
the image headers, in bytes the record had reserved (no larger table), read without touching a
shard; a table without them (an older stoker's, or one rebuilt on first use) says to re-index."""

import io

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.errors import IdxFormatError
from stoker.pipeline.shards.samples import BYTES_PER_SAMPLE, open_split
from stoker.pipeline.shards.table import TABLE_NAME, write_split_table

SIZES = [(64, 32), (32, 64), (48, 48), (80, 45), (45, 80), (60, 40)]  # (width, height), all aspects


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("sizes")
    for k, (w, h) in enumerate(SIZES * 2):
        folder = root / "src" / f"c{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (w, h), (20 * k, 90, 160)).save(folder / f"{k}.jpg", quality=90)
    stoker.pack(root / "src", root / "out", shards=stoker.Shards(samples=5), workers=1)
    return root / "out" / "train"


def _decoded(idx, i: int) -> tuple[int, int]:
    return Image.open(io.BytesIO(idx.image(i).tobytes())).size


def test_pack_records_every_stored_size_in_the_reserved_bytes(packed):
    idx = open_split(packed)
    assert idx.has_sizes and BYTES_PER_SAMPLE == 32  # the sizes cost the table no byte
    positions = np.arange(len(idx))
    wh = idx.stored_sizes(positions)
    assert [tuple(r) for r in wh.tolist()] == [_decoded(idx, i) for i in positions]
    assert sorted(map(tuple, wh.tolist())) == sorted(SIZES * 2)


def test_reading_sizes_opens_no_shard(packed, monkeypatch):
    idx = open_split(packed)
    monkeypatch.setattr(type(idx), "_map", lambda *_: pytest.fail("a shard was mapped"))
    assert idx.stored_sizes(np.array([3, 0, 7])).shape == (3, 2)


def test_a_table_without_sizes_says_to_reindex_and_index_records_them(packed, tmp_path):
    import shutil

    split = tmp_path / "train"
    shutil.copytree(packed, split)
    write_split_table(split, sizes=False)  # what an older stoker, or a rebuild on first use, leaves
    idx = open_split(split)
    assert not idx.has_sizes
    with pytest.raises(IdxFormatError, match=r"records no image sizes .*rerun `stoker index .*train`"):
        idx.stored_sizes(np.arange(2))
    stoker.index(split)
    again = open_split(split)
    assert again.has_sizes and (again.stored_sizes(np.arange(len(again))) > 0).all()


def test_a_table_rebuilt_on_first_use_keeps_loading(packed, tmp_path):
    import shutil

    split = tmp_path / "train"
    shutil.copytree(packed, split)
    (split / TABLE_NAME).unlink()
    idx = open_split(split)  # rebuilt from the .idx files alone: quick, no image header read
    assert (split / TABLE_NAME).exists() and not idx.has_sizes and idx.num_valid == len(SIZES) * 2
