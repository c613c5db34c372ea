from pathlib import Path

from stoker.pipeline.shards.idx import read_idx
from stoker.tools.cli import main as cli
from stoker.tools.common.synth import make_image_folder


def packed(tmp_path: Path, **kw) -> Path:
    src = make_image_folder(tmp_path / "src", classes=("circles", "rings"), per_class=4, min_side=32, max_side=80)
    out = tmp_path / "out"
    assert (
        cli(["pack", str(src), str(out), "-q", "--workers", "1", "--samples-per-shard", "3", "--val-fraction", "0.25"])
        == 0
    )
    return out


def jpg_of(tar: Path, sample: int):
    return next(c for c in read_idx(tar.with_suffix(".idx"))[sample] if c.ext == "jpg")


def test_clean_pack_verifies_both_splits(tmp_path, capsys):
    out = packed(tmp_path)
    assert cli(["verify", str(out), "-q", "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "train/train-000000.tar" in text and "val/val-000000.tar" in text and "ok: 3 shards, 8 samples" in text
    assert cli(["verify", str(out / "val"), "-q", "--sample", "1"]) == 0
    assert "1 images decoded" in capsys.readouterr().out


def test_flipped_byte_names_the_shard(tmp_path, capsys):
    out = packed(tmp_path)
    tar = out / "train" / "train-000001.tar"
    c = jpg_of(tar, 1)
    data = bytearray(tar.read_bytes())
    data[c.offset + c.size // 2] ^= 0x01
    tar.write_bytes(bytes(data))
    assert cli(["verify", str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert "train/train-000001.tar: sha256 differs" in err.splitlines()[-1]


def test_undecodable_image_names_shard_and_sample(tmp_path, capsys):
    out = packed(tmp_path)
    tar = out / "train" / "train-000000.tar"
    c = jpg_of(tar, 2)
    data = bytearray(tar.read_bytes())
    data[c.offset + 2 : c.offset + c.size] = b"\x00" * (c.size - 2)
    tar.write_bytes(bytes(data))
    assert cli(["verify", str(out / "train"), "-q", "--workers", "2"]) == 1
    err = capsys.readouterr().err
    assert "train/train-000000.tar sample 2 (key 000000002): fails the loader's header check" in err


def test_damaged_idx_and_missing_shard(tmp_path, capsys):
    out = packed(tmp_path)
    idx = out / "train" / "train-000000.idx"
    idx.write_text(idx.read_text().replace(" 512 ", " 1024 ", 1))
    (out / "val" / "val-000000.tar").unlink()
    assert cli(["verify", str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert "train/train-000000.tar: train-000000.idx does not match the tar" in err
    assert "val/val-000000.tar: missing" in err


def test_not_a_pack_is_a_usage_error(tmp_path, capsys):
    assert cli(["verify", str(tmp_path)]) == 2
    assert "no stoker.json" in capsys.readouterr().err
