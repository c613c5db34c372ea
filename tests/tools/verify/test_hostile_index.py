"""Hostile foreign tars through `stoker index`, `stoker verify` and the Loader: every input ends
packed with its own label, skipped with a reason in pack.skip / pack.ignored_members, or as a
one-line error naming the file and the fix. Tars are written here with Python's tarfile."""

import bz2
import gzip
import io
import lzma
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stoker.errors import TargetError
from stoker.pipeline.deps import HAS_DALI
from stoker.pipeline.shards.idx import MAX_CLASSES, parse_label, read_idx, scan_tar
from stoker.pipeline.shards.manifest import Manifest
from stoker.pipeline.shards.samples import SampleIndex, open_split
from stoker.tools.cli import main as cli


def red(label: int) -> int:
    return 30 + 60 * label


def jpeg(label: int = 0, size=(24, 16)) -> bytes:
    """A solid image whose red channel says which label it belongs to."""
    buf = io.BytesIO()
    Image.new("RGB", size, (red(label), 0, 0)).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def make_tar(path: Path, members: list) -> Path:
    """``members``: ``(name, bytes)`` regular files, or ``(name, tarfile type, linkname)``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m[0])
            if len(m) == 2:
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))
            else:
                info.type, info.linkname = m[1], m[2]
                tar.addfile(info)
    return path


def sample(key: str, label, image: bytes = None) -> list:
    if image is None:
        image = jpeg(int(label) if str(label).strip().isdigit() else 0)
    return [(f"{key}.jpg", image), (f"{key}.cls", str(label).encode())]


def loaded(split: Path) -> list[tuple[int, int]]:
    """``(label, red channel)`` of every sample the Loader yields (val, pil, in order)."""
    from stoker.pipeline import Loader

    out = []
    for images, labels in Loader(split, batch_size=4, train=False, crop=8, backend="pil", threads=0):
        reds = images[:, 0].float().mean(dim=(1, 2)).round().int().tolist()
        out += list(zip(labels.tolist(), reds, strict=True))
    return out


def assert_right_labels(pairs: list[tuple[int, int]]) -> None:
    for label, r in pairs:
        assert abs(r - red(label)) <= 4, f"image of label {round((r - 30) / 60)} loaded as label {label}"


def last_err(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and "Traceback" not in "\n".join(lines)
    return lines[-1]


# ---- foreign tars: keys, repeated components, names, member kinds ------------------------------


@pytest.mark.parametrize(
    "order",
    [
        ["a.jpg", "a.cls", "a.jpg", "a.cls"],
        ["a.jpg", "a.jpg", "a.cls"],
        ["a.jpg", "a.cls", "a.cls"],
        ["a.jpg", "a.JPG", "a.cls"],
    ],
)
def test_repeated_component_is_skipped_never_mispaired(tmp_path, capsys, order):
    data = {"jpg": [jpeg(1), jpeg(2)], "JPG": [jpeg(2)], "cls": [b"1", b"2"]}
    members = [(name, data[name.split(".")[1]].pop(0)) for name in order]
    tar = make_tar(tmp_path / "s" / "t.tar", sample("before", 0) + members + sample("z", 2))
    assert cli(["index", str(tar), "-q"]) == 0
    out = capsys.readouterr().out
    assert "1 sample(s) marked to skip (1 repeated component)" in out
    m = Manifest.load(tmp_path / "s")
    assert m.num_samples == 3 and m.classes == ["0", "1", "2"]
    [[shard, index, why]] = m.pack["skip"]
    assert (shard, index) == ("t.tar", 1) and why.startswith("repeated component:") and "'a'" in why
    assert sorted(loaded(tmp_path / "s")) == [(0, red(0)), (2, red(2))]
    assert cli(["verify", str(tmp_path / "s"), "-q"]) == 0  # known and skipped


def test_verify_catches_repeated_component_the_manifest_does_not_skip(tmp_path, capsys):
    tar = make_tar(tmp_path / "s" / "t.tar", sample("a", 0) + sample("a", 1) + sample("b", 1))
    assert cli(["index", str(tar), "-q"]) == 0
    m = Manifest.load(tmp_path / "s")
    m.pack["skip"] = []
    m.save(tmp_path / "s")
    capsys.readouterr()
    assert cli(["verify", str(tmp_path / "s"), "-q"]) == 1
    assert last_err(capsys) == (
        "stoker verify: 1 problem(s) in 1 shard(s); first: s/t.tar sample 0 (key a): "
        "repeated component: 4 members with key 'a' repeat cls, jpg"
    )


def test_interleaved_keys_pair_nothing(tmp_path, capsys):
    """a.jpg b.jpg a.cls b.cls: WebDataset groups consecutive members only, so no image has a label."""
    tar = make_tar(tmp_path / "s" / "t.tar", [("a.jpg", jpeg(0)), ("b.jpg", jpeg(1)), ("a.cls", b"0"), ("b.cls", b"1")])
    assert cli(["index", str(tar), "-q"]) == 1
    assert last_err(capsys) == (
        f"stoker index: no loadable samples in {tmp_path / 's'}: 2 no cls label, "
        "2 no image; nothing written to stoker.json"
    )


def test_names_with_spaces_newlines_percent_and_long_names_load(tmp_path, capsys):
    keys = ["a b", "c\nd", "e%41f", "tab\there", "x" * 150, "dir with space/ü ñ", "caf\udce9 (latin-1)"]
    members = [m for k, key in enumerate(keys) for m in sample(key, k % 3)]
    tar = make_tar(tmp_path / "s" / "t.tar", members)
    assert cli(["index", str(tar), "-q"]) == 0
    assert "0 sample(s) marked to skip" in capsys.readouterr().out
    text = (tmp_path / "s" / "t.idx").read_text()
    assert "a%20b.jpg" in text and "c%0Ad.cls" in text and "e%2541f.jpg" in text
    assert "dir%20with%20space/ü%20ñ.jpg" in text
    assert all(len(line.split()) == 8 for line in text.splitlines()[1:])
    assert read_idx(tmp_path / "s" / "t.idx") == scan_tar(tar).samples
    idx = open_split(tmp_path / "s")
    assert [idx.key(i) for i in range(len(idx))] == keys
    pairs = loaded(tmp_path / "s")
    assert len(pairs) == 7
    assert_right_labels(pairs)
    assert cli(["verify", str(tmp_path / "s"), "-q"]) == 0


@pytest.mark.skipif(not HAS_DALI, reason="needs nvidia-dali")
def test_dali_reader_reads_escaped_names(tmp_path, capsys):
    from nvidia.dali import fn, pipeline_def, types

    keys = ["a b", "c\nd", "plain"]
    tar = make_tar(tmp_path / "s" / "t.tar", [m for k, key in enumerate(keys) for m in sample(key, k)])
    assert cli(["index", str(tar), "-q"]) == 0

    @pipeline_def(batch_size=3, num_threads=1, device_id=None)
    def reader():
        jpg, cls = fn.readers.webdataset(
            paths=[str(tar)],
            index_paths=[str(tar.with_suffix(".idx"))],
            ext=["jpg", "cls"],
            dtypes=[types.UINT8, types.UINT8],
        )
        return fn.decoders.image(jpg, device="cpu", output_type=types.RGB), cls

    pipe = reader()
    pipe.build()
    images, labels = pipe.run()
    got = [(int(bytes(labels.at(i))), int(np.asarray(images.at(i))[..., 0].mean().round())) for i in range(3)]
    assert sorted(got) == [(0, red(0)), (1, red(1)), (2, red(2))]


def test_non_regular_members_are_listed_with_a_reason(tmp_path, capsys):
    members = (
        sample("a", 0)
        + [
            ("dir", tarfile.DIRTYPE, ""),
            ("b.jpg", jpeg(1)),
            ("b.cls", tarfile.SYMTYPE, "a.cls"),
            ("c.jpg", tarfile.LNKTYPE, "a.jpg"),
            ("c.cls", b"1"),
            ("fifo.jpg", tarfile.FIFOTYPE, ""),
            ("README", b"hello"),
            (".hidden.jpg", jpeg(0)),
        ]
        + sample("d", 1)
    )
    tar = make_tar(tmp_path / "s" / "t.tar", members)
    assert cli(["index", str(tar), "-q"]) == 0
    out = capsys.readouterr().out
    m = Manifest.load(tmp_path / "s")
    assert m.pack["ignored_members"] == [
        ["t.tar", "dir", "directory"],
        ["t.tar", "b.cls", "symbolic link"],
        ["t.tar", "c.jpg", "hard link"],
        ["t.tar", "fifo.jpg", "not a regular file"],
        ["t.tar", "README", "no extension"],
        ["t.tar", ".hidden.jpg", "no sample key (name starts with a dot)"],
    ]
    assert m.pack["skip"] == [["t.tar", 1, "no cls label"], ["t.tar", 2, "no image: has cls"]]
    assert "2 sample(s) marked to skip (1 no cls label, 1 no image)" in out
    assert "6 tar member(s) in no sample" in out
    assert sorted(loaded(tmp_path / "s")) == [(0, red(0)), (1, red(1))]


# ---- damaged and compressed tars: one line, exit 1 ---------------------------------------------


@pytest.mark.parametrize(
    "kind,compress,tool",
    [
        ("gzip", gzip.compress, "gunzip"),
        ("bzip2", bz2.compress, "bunzip2"),
        ("xz", lzma.compress, "unxz"),
        ("zstd", lambda b: b"\x28\xb5\x2f\xfd" + b, "unzstd"),
    ],
)
def test_compressed_tar_says_decompress_first(tmp_path, capsys, kind, compress, tool):
    plain = make_tar(tmp_path / "plain.tar", sample("a", 0))
    tar = tmp_path / "s" / "t.tar.gz"
    tar.parent.mkdir()
    tar.write_bytes(compress(plain.read_bytes()))
    assert cli(["index", str(tar), "-q"]) == 1
    assert last_err(capsys) == (
        f"stoker index: {tar} is a compressed tar ({kind}): decompress it first "
        f"(e.g. {tool} {tar}), then index the .tar"
    )
    assert not (tmp_path / "s" / "stoker.json").exists()


def test_folder_of_compressed_tars_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "t.tar.gz").write_bytes(gzip.compress(make_tar(tmp_path / "p.tar", sample("a", 0)).read_bytes()))
    assert cli(["index", str(tmp_path / "s")]) == 2
    assert last_err(capsys) == (
        f"stoker index: error: no .tar files in {tmp_path / 's'} (found 1 compressed: "
        f"decompress them first, e.g. gunzip {tmp_path / 's' / 't.tar.gz'})"
    )


def _damaged(tmp_path: Path, how: str) -> Path:
    tar = make_tar(tmp_path / "s" / "t.tar", sample("a", 0) + sample("b", 1) + sample("c", 2))
    data = tar.read_bytes()
    b_header = data.index(b"b.jpg")
    if how == "truncated":
        data = data[: b_header + 700]
    elif how == "header":
        data = data[:b_header] + b"\x07" * 512 + data[b_header + 512 :]
    elif how == "concatenated":
        data = data + make_tar(tmp_path / "more.tar", sample("d", 0)).read_bytes()
    elif how == "empty":
        data = b""
    elif how == "junk":
        data = b"not a tar at all " * 100
    tar.write_bytes(data)
    return tar


@pytest.mark.parametrize(
    "how,message",
    [
        ("truncated", "is truncated: member 'b.jpg' ends past the end of the file (copy or download it again)"),
        (
            "header",
            "has unreadable data at byte 2,560 (a damaged member header, or tars joined with cat): the samples "
            "after it cannot be read; copy or rebuild it",
        ),
        (
            "concatenated",
            "has unreadable data at byte 10,240 (a damaged member header, or tars joined with cat): the "
            "samples after it cannot be read; copy or rebuild it",
        ),
        ("empty", "is not a readable tar (empty file): copy or download it again"),
        ("junk", "is not a readable tar (invalid header): copy or download it again"),
    ],
)
def test_damaged_tar_is_one_line_naming_it(tmp_path, capsys, how, message):
    tar = _damaged(tmp_path, how)
    assert cli(["index", str(tar), "-q"]) == 1
    assert last_err(capsys) == f"stoker index: {tar} {message}"
    assert not (tmp_path / "s" / "stoker.json").exists()


# ---- labels --------------------------------------------------------------------------------------


def test_parse_label_rules():
    assert parse_label(b"0") == 0 and parse_label(b" 7\n") == 7 and parse_label(b"007") == 7
    assert parse_label(str(MAX_CLASSES - 1).encode()) == MAX_CLASSES - 1
    assert parse_label(str(MAX_CLASSES).encode()) == "cls is above the limit of 999,999 (MAX_CLASSES): 1000000"
    assert parse_label(b"-1") == "cls is negative: -1"
    assert parse_label("²".encode()) == "cls is not an integer: '²'"
    assert parse_label(b"1.0") == "cls is not an integer: '1.0'"
    assert parse_label(b"1_0") == "cls is not an integer: '1_0'"
    assert parse_label(b"") == "cls is not an integer: ''"
    assert parse_label(b"9" * 40) == "cls is not an integer: 40 bytes"
    assert parse_label(b"3", 3) == "cls is outside the 3 classes of the manifest: 3"


def test_bad_labels_are_skipped_with_reasons_and_never_loaded(tmp_path, capsys):
    bad = [b"2000000000", b"-1", b"abc", "²".encode(), b"1.5", b"7" * 100, b"\xff\xfe"]
    members = sample("ok0", 0) + sample("ok1", " 1\n") + sample("ok2", 2)
    for k, raw in enumerate(bad):
        members += [(f"bad{k}.jpg", jpeg(0)), (f"bad{k}.cls", raw)]
    tar = make_tar(tmp_path / "s" / "t.tar", members)
    # fast: a huge cls does not size anything; 7 of 10 marked to skip is written, but exit 1
    assert cli(["index", str(tar), "-q"]) == 1
    out, err = capsys.readouterr()
    assert "7 of 10 samples of" in err and "are marked to skip" in err
    m = Manifest.load(tmp_path / "s")
    assert m.classes == ["0", "1", "2"]
    assert [why for _, _, why in m.pack["skip"]] == [
        "cls is above the limit of 999,999 (MAX_CLASSES): 2000000000",
        "cls is negative: -1",
        "cls is not an integer: 'abc'",
        "cls is not an integer: '²'",
        "cls is not an integer: '1.5'",
        "cls is not an integer: 100 bytes",
        "cls is not an integer: '\ufffd\ufffd'",
    ]
    assert (
        "7 sample(s) marked to skip (1 cls is above the limit of 999,999 (MAX_CLASSES), 1 cls is negative, "
        "5 cls is not an integer)" in out
    )
    pairs = loaded(tmp_path / "s")
    assert sorted(p[0] for p in pairs) == [0, 1, 2]
    assert_right_labels(pairs)
    assert cli(["verify", str(tmp_path / "s"), "-q"]) == 0


def test_explicit_classes_shorter_than_the_labels_is_a_usage_error(tmp_path, capsys):
    tar = make_tar(tmp_path / "s" / "t.tar", sample("a", 0) + sample("b", 2))
    assert cli(["index", str(tar), "--classes", "cat,dog", "-q"]) == 2
    assert last_err(capsys) == f"stoker index: error: {tar} has a cls of 2 but --classes names only 2 classes"
    assert cli(["index", str(tar), "--classes", "cat,cat,dog", "-q"]) == 2
    assert last_err(capsys) == "stoker index: error: --classes names a class twice"


def test_reindex_keeps_class_names_and_skips_labels_outside_them(tmp_path, capsys):
    folder = tmp_path / "s"
    make_tar(folder / "t.tar", sample("a", 0) + sample("b", 1))
    assert cli(["index", str(folder), "--classes", "cat,dog", "-q"]) == 0
    make_tar(folder / "t.tar", sample("a", 0) + sample("b", 1) + sample("c", 2))  # the tar gained a label
    assert cli(["index", str(folder), "-q"]) == 0
    m = Manifest.load(folder)
    assert m.classes == ["cat", "dog"]
    assert m.pack["skip"] == [["t.tar", 2, "cls is outside the 2 classes of the manifest: 2"]]
    assert sorted(loaded(folder)) == [(0, red(0)), (1, red(1))]


def test_reindex_grows_made_up_class_names_with_the_data(tmp_path, capsys):
    folder = tmp_path / "s"
    make_tar(folder / "t.tar", sample("a", 0) + sample("b", 1))
    assert cli(["index", str(folder), "-q"]) == 0
    make_tar(folder / "u.tar", sample("c", 3))
    assert cli(["index", str(folder), "-q"]) == 0
    m = Manifest.load(folder)
    assert m.classes == ["0", "1", "2", "3"] and m.pack["skip"] == []
    (folder / "u.tar").unlink()
    assert cli(["index", str(folder), "-q"]) == 0  # labels keep their meaning: classes never shrink
    assert Manifest.load(folder).classes == ["0", "1", "2", "3"]
    assert "1 shard(s) listed in the old manifest are gone and left out: u.tar" in capsys.readouterr().err


def test_all_samples_bad_writes_no_manifest(tmp_path, capsys):
    tar = make_tar(tmp_path / "s" / "t.tar", [("a.jpg", jpeg(0)), ("a.cls", b"-3"), ("b.txt", b"x")])
    assert cli(["index", str(tar), "-q"]) == 1
    assert last_err(capsys) == (
        f"stoker index: no loadable samples in {tmp_path / 's'}: 1 cls is negative, "
        "1 no image; nothing written to stoker.json"
    )
    assert not (tmp_path / "s" / "stoker.json").exists()


def test_bad_cls_at_read_time_names_shard_and_key(tmp_path):
    """A hand-made split whose manifest does not skip a bad cls: a StokerError naming shard and key."""
    tar = make_tar(tmp_path / "s" / "t.tar", sample("a", 0) + sample("b", "x1") + sample("c", 5))
    assert cli(["index", str(tar), "-q", "--no-check"]) == 0
    m = Manifest.load(tmp_path / "s")
    m.pack["skip"], m.classes = [], ["zero", "one"]
    m.save(tmp_path / "s")
    idx = SampleIndex(tmp_path / "s")
    assert idx.label(0) == 0
    with pytest.raises(
        TargetError,
        match=r"^" + str(tar) + r" key b: cls 'x1' is not a class index below 2 "
        r"\(run `stoker index .*` to skip such samples\)$",
    ):
        idx.labels(np.array([0, 1]))
    with pytest.raises(TargetError, match=r"key c: cls '5' is not a class index below 2"):
        idx.label(2)


# ---- re-indexing a split `stoker pack` wrote ----------------------------------------------------


def _packed(tmp_path: Path) -> Path:
    from stoker.tools.common.synth import make_image_folder

    src = make_image_folder(tmp_path / "src", classes=("circles", "rings"), per_class=3, min_side=32, max_side=48)
    assert (
        cli(
            [
                "pack",
                str(src),
                str(tmp_path / "out"),
                "-q",
                "--workers",
                "1",
                "--samples-per-shard",
                "4",
                "--val-fraction",
                "0",
            ]
        )
        == 0
    )
    return tmp_path / "out" / "train"


def test_reindex_of_a_packed_split_is_a_repair_not_a_downgrade(tmp_path, capsys):
    split = _packed(tmp_path)
    before = Manifest.load(split)
    labels_before = [label for _, label in loaded(split)]
    (split / "train-000000.idx").write_bytes(b"\x00garbage\xff" * 10)  # what the Loader's message leads to
    assert cli(["index", str(split), "-q"]) == 0
    after = Manifest.load(split)
    assert after.classes == before.classes == ["circles", "rings"]
    assert after.shards == before.shards
    for key, value in before.pack.items():
        assert after.pack[key] == value, key
    assert after.pack["skip"] == [] and "indexed_by" not in after.pack and "reindexed_by" in after.pack
    assert [label for _, label in loaded(split)] == labels_before
    capsys.readouterr()
    assert cli(["verify", str(split), "-q"]) == 0  # still held to pack's rules (RGB)


def test_index_of_a_pack_root_or_a_split_without_idx(tmp_path, capsys):
    split = _packed(tmp_path)
    assert cli(["index", str(split.parent), "-q"]) == 2
    assert last_err(capsys) == (
        f"stoker index: error: no .tar files in {split.parent} (it holds splits: index "
        f"each one, e.g. stoker index {split})"
    )
    (split / "train-000001.idx").unlink()
    assert cli(["verify", str(split), "-q"]) == 1
    assert last_err(capsys).endswith(
        f"first: train/train-000001.tar: index {split / 'train-000001.idx'}: cannot "
        f"be read: No such file or directory (rerun `stoker index {split}`)"
    )


def test_reindex_of_some_shards_of_a_split_is_refused(tmp_path, capsys):
    split = _packed(tmp_path)
    before = (split / "stoker.json").read_text()
    assert cli(["index", str(split / "train-000000.tar"), "-q"]) == 2
    assert last_err(capsys) == (
        f"stoker index: error: {split / 'stoker.json'} also lists train-000001.tar: index "
        f"the whole folder (`stoker index {split}`) so the split keeps them"
    )
    assert (split / "stoker.json").read_text() == before


# ---- garbage .idx: verify and the Loader say one line and the fix -------------------------------


@pytest.mark.parametrize(
    "how,what",
    [
        ("random", "first line should be 'v1.2 <count>'"),
        ("truncated", "declares 4 samples but lists 2"),
        ("count", "declares 9 samples but lists 4"),
        ("past_end", None),
        ("negative", "line 2: offset/size are not non-negative integers"),
    ],
)
def test_garbage_idx(tmp_path, capsys, how, what):
    tar = make_tar(tmp_path / "s" / "t.tar", [m for k in range(4) for m in sample(f"k{k}", k % 2)])
    assert cli(["index", str(tar), "-q"]) == 0
    idx = tar.with_suffix(".idx")
    text = idx.read_text()
    if how == "random":
        idx.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8)))
    elif how == "truncated":
        idx.write_text(text[: len(text) // 2])
    elif how == "count":
        idx.write_text(text.replace("v1.2 4", "v1.2 9"))
    elif how == "past_end":
        lines = text.splitlines()
        f = lines[2].split()
        f[1] = str(tar.stat().st_size - 10)
        idx.write_text("\n".join(lines[:2] + [" ".join(f)] + lines[3:]) + "\n")
    elif how == "negative":
        idx.write_text(text.replace(" 512 ", " -512 ", 1))
    capsys.readouterr()
    assert cli(["verify", str(tmp_path / "s"), "-q"]) == 1
    line = last_err(capsys)
    assert line.startswith("stoker verify: ") and "s/t.tar: " in line and "(rerun `stoker index" in line
    if what:
        assert f"index {idx}: {what} (rerun `stoker index {tmp_path / 's'}`)" in line
    else:
        assert "t.idx does not match the tar (rerun `stoker index" in line
        what = "sample 1 points outside its tar"
    from stoker.errors import IdxFormatError

    if how == "count":  # the same size: the table built from the intact index still serves the Loader
        assert len(open_split(tmp_path / "s")) == 4
    else:  # the table is rebuilt for a changed index, and the rebuild names what is wrong
        with pytest.raises(IdxFormatError, match=r"^index .*t\.idx: " + what.replace("(", r"\(").replace(")", r"\)")):
            open_split(tmp_path / "s")
    # and the repair the message names works
    assert cli(["index", str(tmp_path / "s"), "-q"]) == 0
    assert cli(["verify", str(tmp_path / "s"), "-q"]) == 0


# ---- decoder agreement ---------------------------------------------------------------------------


def test_image_the_loader_drops_is_skipped_by_index_and_reported_by_verify(tmp_path, capsys):
    """Bytes after the end marker: pillow decodes it, the Loader's header guard drops it."""
    trailing = jpeg(1) + b"\0" * 100
    Image.open(io.BytesIO(trailing)).load()  # pillow alone would say fine
    tar = make_tar(tmp_path / "s" / "t.tar", sample("a", 0) + sample("b", 1, trailing) + sample("c", 1))
    assert cli(["index", str(tar), "-q"]) == 0
    assert Manifest.load(tmp_path / "s").pack["skip"] == [
        [
            "t.tar",
            1,
            "image does not decode: fails the loader's header check (truncated, not a JPEG/PNG, "
            "or a JPEG kind the decoders do not read)",
        ]
    ]
    assert sorted(loaded(tmp_path / "s")) == [(0, red(0)), (1, red(1))]
    m = Manifest.load(tmp_path / "s")
    m.pack["skip"] = []
    m.save(tmp_path / "s")
    capsys.readouterr()
    assert cli(["verify", str(tmp_path / "s"), "-q"]) == 1
    assert "s/t.tar sample 1 (key b): fails the loader's header check" in last_err(capsys)


@pytest.mark.skipif(not HAS_DALI, reason="needs nvidia-dali")
def test_dali_check_finds_the_failing_image_in_a_batch():
    from stoker.tools.verify.command import ImageChecker

    good = jpeg(1)
    bad = good[:50] + b"\0" * 100 + good[-2:]  # headers intact, entropy data gone
    checker = ImageChecker(require_rgb=False, dali=True, batch_size=4)
    got = checker._dali_check([good, bad, good])
    assert got[0] is None and got[2] is None
    assert got[1].startswith("does not decode with DALI: ")
    assert checker._dali_check([good, good]) == [None, None]  # the pipeline was rebuilt after the failure
