"""The split's binary sample table (stoker.index): a round trip against the .idx files, read
lazily (opening a split reads no per-sample data), built on first use for a split without one
(an older pack), rebuilt when the manifest or an .idx changes, and the skips folded into it."""

import io
import json
import os
import tarfile

import numpy as np
import pytest

from helpers import write_split
from stoker.pipeline import Loader
from stoker.pipeline.shards import table as table_mod
from stoker.pipeline.shards.manifest import INLINE_SKIPS, SKIP_FILE, Manifest, idx_path, iter_skips, write_skips
from stoker.pipeline.shards.samples import SampleIndex, open_split
from stoker.pipeline.shards.table import RECORD, TABLE_NAME, read_records, write_split_table


@pytest.fixture
def split(tmp_path):
    path = tmp_path / "train"
    write_split(path, num_samples=40, samples_per_shard=16)
    return path


def test_table_round_trips_the_idx_files(split):
    (split / TABLE_NAME).unlink(missing_ok=True)
    idx = open_split(split, with_json=True)
    assert (split / TABLE_NAME).exists()  # built on first use
    m = Manifest.load(split)
    rows = np.concatenate([read_records(idx_path(split / s.name), b"cls")[0] for s in m.shards])
    for field in ("img_off", "img_size", "tgt_off", "tgt_size", "kind"):
        assert np.array_equal(getattr(idx, field), rows[field]), field
    assert list(idx.shard_start) == [0, 16, 32, 40] and idx.num_valid == 40 and idx.num_skipped == 0
    assert json.loads(idx.meta(17))["path"].endswith("/17.jpg")  # the json member, located when asked
    assert idx.valid_at(np.array([0, 39])).tolist() == [0, 39]


def test_the_column_reader_equals_the_line_reader_on_every_layout(tmp_path):
    """The fast path takes a uniform .idx; anything else falls back; both give the same rows."""
    lines = {
        "uniform": ["jpg 512 10 a.jpg cls 1536 1 a.cls"] * 3,
        "json first": ["json 512 5 a.json JPG 1536 10 a.JPG cls 2560 1 a.cls"] * 2,
        "uneven": ["jpg 512 10 a.jpg cls 1536 1 a.cls", "jpg 2560 10 b.jpg", "png 3584 9 c.png cls 4608 1 c.cls"],
        "repeated": ["jpg 512 10 a.jpg cls 1536 1 a.cls jpg 2560 3 a.jpg"] * 2,
        "tabs": ["jpg\t512 10 a.jpg cls 1536 1 a.cls"] * 2,
        "no image": ["cls 512 1 a.cls txt 1536 4 a.txt"] * 2,
    }
    for name, body in lines.items():
        path = tmp_path / f"{name}.idx"
        path.write_text(f"v1.2 {len(body)}\n" + "\n".join(body) + "\n")
        fast = table_mod._parse_uniform(path.read_bytes(), b"cls", True)
        slow = table_mod._parse_lines(path, b"cls", True)
        got = read_records(path, b"cls", True)
        assert got[0].tobytes() == slow[0].tobytes() and np.array_equal(got[1], slow[1]), name
        assert (fast is not None) == (name in ("uniform", "json first", "no image")), name
        if fast is not None:
            assert fast[0].tobytes() == slow[0].tobytes() and np.array_equal(fast[1], slow[1]), name


def test_opening_a_split_reads_no_sample_of_the_table(split, monkeypatch):
    write_split_table(split)
    monkeypatch.setattr(table_mod, "read_records", lambda *a, **k: pytest.fail("the .idx files were parsed"))
    touched = []
    real = np.frombuffer

    def spy(buf, dtype=float, count=-1, offset=0):
        arr = real(buf, dtype, count, offset)
        touched.append((np.dtype(dtype), count))
        return arr

    monkeypatch.setattr(table_mod.np, "frombuffer", spy)
    idx = SampleIndex(split)
    # views of the map are made, and only the shard starts are copied into memory
    assert (RECORD, 40) in touched and idx.nbytes == 8 * 4
    with Loader(split, batch_size=8, crop=16, backend="pil", threads=0) as loader:
        assert len(loader) == 5 and loader.num_samples == 40


def test_a_split_without_a_table_loads_and_a_changed_one_is_rebuilt(split):
    (split / TABLE_NAME).unlink(missing_ok=True)
    with Loader(split, batch_size=8, train=False, crop=16, backend="pil", threads=0) as loader:
        labels = [y for _, ys in loader for y in ys.tolist()]
    assert labels == [i % 6 for i in range(40)] and (split / TABLE_NAME).exists()
    first = (split / TABLE_NAME).read_bytes()
    m = Manifest.load(split)
    m.pack["skip"] = [["shard-000001.tar", 2, "left out here"], 39]
    m.save(split)  # another manifest: the table is made again for it
    idx = open_split(split)
    assert idx.num_valid == 38 and 18 not in idx.valid.tolist() and 39 not in idx.valid.tolist()
    assert (split / TABLE_NAME).read_bytes() != first
    assert idx.valid_at(np.arange(38)).tolist() == idx.valid.tolist()
    assert idx.valid_counts().tolist() == [16, 15, 7]


def test_a_read_only_split_gets_its_table_in_memory(split, monkeypatch):
    (split / TABLE_NAME).unlink(missing_ok=True)
    real = os.open

    def refuse(path, *a, **k):
        if str(path).endswith(".lock"):
            raise PermissionError(13, "Read-only file system", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(table_mod.os, "open", refuse)
    idx = open_split(split)
    assert idx.num_valid == 40 and not (split / TABLE_NAME).exists()
    assert isinstance(idx._table.buf, bytes)


def test_skips_past_the_inline_limit_go_to_their_own_file(split, monkeypatch):
    m = Manifest.load(split)
    skip = [["shard-000000.tar", i, "reason"] for i in range(0, 16, 3)]
    monkeypatch.setattr("stoker.pipeline.shards.manifest.INLINE_SKIPS", 4)
    write_skips(split, m.pack, skip)
    m.save(split)
    assert "skip" not in m.pack and m.pack["skip_file"] == SKIP_FILE and m.pack["skipped_count"] == 6
    again = Manifest.load(split)
    assert again.format == 3 and json.loads((split / "stoker.json").read_text())["format"] == 3
    assert list(iter_skips(split, again)) == skip
    idx = open_split(split)
    assert idx.num_skipped == 6 and not set(range(0, 16, 3)) & set(idx.valid.tolist())
    # back under the limit: inline again, the file gone
    write_skips(split, again.pack, skip[:2])
    assert again.pack["skip"] == skip[:2] and "skip_file" not in again.pack and not (split / SKIP_FILE).exists()
    assert INLINE_SKIPS == 10_000


def test_a_damaged_table_is_rebuilt(split):
    write_split_table(split)
    path = split / TABLE_NAME
    path.write_bytes(path.read_bytes()[:-100])  # a partial copy
    assert open_split(split).num_valid == 40
    assert path.stat().st_size == 128 + 8 * 7 + 40 * RECORD.itemsize


def test_key_skips_and_samples_without_a_target_are_left_out(tmp_path):
    split = tmp_path / "s"
    split.mkdir()
    with tarfile.open(split / "a.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for k in range(6):
            for ext, data in (("jpg", b"\xff\xd8" + b"x" * 30 + b"\xff\xd9"), ("cls", b"1")):
                if k == 2 and ext == "cls":
                    continue
                info = tarfile.TarInfo(f"k{k}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    from stoker.tools.verify.indexing import index

    index(split, check=False, workers=1)
    m = Manifest.load(split)
    m.pack["skip"] = ["k4"]  # a key, as some tools write
    m.save(split)
    idx = open_split(split)
    assert idx.valid.tolist() == [0, 1, 3, 5] and idx.num_skipped == 2


def test_shard_maps_are_bounded_and_reopened(tmp_path):
    split = tmp_path / "many"
    write_split(split, num_samples=40, samples_per_shard=4)  # 10 shards
    idx = open_split(split)
    assert idx.max_maps == 4096  # a global order reaches every shard: a process may hold only so many maps
    everything = [bytes(v) for v in idx.images(np.arange(40))[0]]
    few = open_split(split)
    few.max_maps = 3
    again = [bytes(v) for v in few.images(np.random.default_rng(0).permutation(40))[0]]
    assert len(few._maps) <= 3 and sorted(again) == sorted(everything)
