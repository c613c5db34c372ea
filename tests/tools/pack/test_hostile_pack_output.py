"""Hostile inputs for ``stoker pack``, what it stores and writes: every stored JPEG decodes alike
in every decoder (or the input is a reject), a full disk mid-shard or mid-manifest is one line
and a rerun finishes byte-identically, damaged shards and rewritten manifests are restored, a
missing part refuses the merge. The inputs themselves: test_hostile_pack.py. Data is generated
in tmp_path."""

import errno
import hashlib
import io
import json
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hostile_pack_helpers import folder, one_line_error, pack, rejects, samples
from stoker.pipeline.decodecheck import jpeg_copy_safe
from stoker.tools.cli import main as cli
from stoker.tools.common.synth import bomb_png, draw, encode, nasty_files
from stoker.tools.pack.sanitize import Settings, sanitize_bytes


def tree_sha(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# --- decoder agreement -------------------------------------------------------------------------


def _baseline() -> bytes:
    return encode(draw("circles", (120, 90), random.Random(0)), quality=90)


def _sof(data: bytes, marker: bytes) -> bytes:
    i = data.index(b"\xff\xc0")
    return data[:i] + marker + data[i + 2 :]


def _12bit(data: bytes) -> bytes:
    i = data.index(b"\xff\xc0")
    return data[: i + 4] + b"\x0c" + data[i + 5 :]


def _huge_header(data: bytes, w: int, h: int) -> bytes:
    i = data.index(b"\xff\xc0")
    return data[: i + 5] + h.to_bytes(2, "big") + w.to_bytes(2, "big") + data[i + 9 :]


def _hostile_jpegs() -> dict[str, bytes]:
    base = _baseline()
    im = draw("rings", (100, 80), random.Random(1))
    return {
        "baseline.jpg": base,
        "trailing.jpg": base + b"\x00garbage after the end marker" * 4,
        "trailing_jpeg.jpg": base + base,  # two images glued together
        "progressive.jpg": encode(im, progressive=True),
        "arithmetic_sof9.jpg": _sof(base, b"\xff\xc9"),
        "lossless_sof3.jpg": _sof(base, b"\xff\xc3"),
        "extended_sof1.jpg": _sof(base, b"\xff\xc1"),
        "12bit.jpg": _12bit(base),
        "rgb_no_ycc.jpg": encode(im, keep_rgb=True),
        "truncated.jpg": base[: len(base) * 2 // 3],
        "bomb.jpg": _huge_header(base, 60000, 60000),  # tiny file, 3.6 gigapixel header
    }


def test_jpeg_copy_safe_reasons():
    want = {
        "baseline.jpg": None,
        "trailing.jpg": "bytes after EOI",
        "trailing_jpeg.jpg": "bytes after EOI",
        "progressive.jpg": "progressive (SOF2)",
        "arithmetic_sof9.jpg": "arithmetic coding (SOF9)",
        "lossless_sof3.jpg": "lossless (SOF3)",
        "extended_sof1.jpg": "extended sequential (SOF1)",
        "12bit.jpg": "12-bit samples",
        "rgb_no_ycc.jpg": "RGB colour transform",
        "truncated.jpg": "truncated (no EOI)",
        "bomb.jpg": None,  # structurally fine: the pixel limit rejects it
    }
    assert {k: jpeg_copy_safe(v) for k, v in _hostile_jpegs().items()} == want
    assert jpeg_copy_safe(encode(Image.new("L", (8, 8)))) is None
    assert jpeg_copy_safe(encode(Image.new("CMYK", (8, 8)))) == "4 components (CMYK)"
    assert jpeg_copy_safe(encode(Image.new("RGB", (8, 8)), "PNG")) == "not a JPEG"
    assert jpeg_copy_safe(b"") == "not a JPEG"


def _dali_decode(blobs: list[bytes]) -> list:
    """Decode each blob alone with DALI's CPU decoder (what the Loader uses): its HWC
    shape, or "error"."""
    dali = pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, types

    @dali.pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        return fn.decoders.image(fn.external_source(name="raw", dtype=types.UINT8), device="cpu", output_type=types.RGB)

    out = []
    for b in blobs:
        p = pipe()
        p.build()
        p.feed_input("raw", [np.frombuffer(b, dtype=np.uint8)])
        try:
            (img,) = p.run()
            out.append(tuple(np.array(img[0]).shape))
        except RuntimeError:
            out.append("error")
    return out


def test_what_pack_stores_is_copy_safe_and_decodes_in_dali_and_pil(tmp_path):
    files = {**_hostile_jpegs(), **nasty_files(random.Random(0))}
    expect_reject = {
        "truncated.jpg": "truncated",
        "bomb.jpg": "too many pixels (60000x60000)",
        "lossless_sof3.jpg": "corrupt: ",
        "12bit.jpg": "unsupported JPEG: 12-bit samples",
        "bad_truncated.jpg": "truncated",
        "bad_zero.jpg": "empty file",
        "bad_not_an_image.jpg": "not an image",
        "bad_bomb.png": "too many pixels (100000x100000)",
    }
    stored, copied = {}, set()
    for name, data in files.items():
        r = sanitize_bytes(data, Settings(short_side=0))
        if name in expect_reject:
            want = expect_reject[name]  # "...: " -> the decoder's message follows
            assert r.jpg is None and (r.reason == want or want.endswith(": ") and r.reason.startswith(want)), name
            continue
        assert r.jpg is not None, (name, r.reason)
        assert jpeg_copy_safe(r.jpg) is None, name
        stored[name] = r.jpg
        if r.copied:
            copied.add(name)
    assert copied == {"baseline.jpg", "gray.jpg", "odd name, with spaces & ünïcode's.jpg"}  # gray: baseline, 1 channel
    assert stored["trailing.jpg"] != files["trailing.jpg"]
    shapes = _dali_decode(list(stored.values()))
    for (name, jpg), shape in zip(stored.items(), shapes, strict=True):
        im = Image.open(io.BytesIO(jpg))
        im.load()  # the pil backend's decoder
        assert shape == (im.height, im.width, 3), name


def test_packed_shards_decode_in_dali(tmp_path):
    src = folder(tmp_path / "src", nasty=True)
    for name, data in _hostile_jpegs().items():
        (src / "rings" / name).write_bytes(data)
    assert pack(src, tmp_path / "out") == 0
    got = samples(tmp_path / "out")
    assert all(jpeg_copy_safe(jpg) is None for _, _, jpg in got.values())
    assert "error" not in _dali_decode([jpg for _, _, jpg in got.values()])
    rej = rejects(tmp_path / "out")
    assert set(rej) == {
        "circles/bad_truncated.jpg",
        "circles/bad_zero.jpg",
        "circles/bad_not_an_image.jpg",
        "circles/bad_bomb.png",
        "rings/truncated.jpg",
        "rings/bomb.jpg",
        "rings/lossless_sof3.jpg",
        "rings/12bit.jpg",
    }


# --- faults ------------------------------------------------------------------------------------


def test_disk_full_mid_shard_is_one_line_and_rerun_finishes_identically(tmp_path, monkeypatch, capsys):
    from stoker.pipeline.shards import writer as shardwriter

    src = folder(tmp_path / "src", per_class=4)
    assert pack(src, tmp_path / "clean", "--samples-per-shard", "3") == 0
    real = shardwriter.ShardWriter.__enter__
    budget = [60_000]

    class FillingDisk(io.BufferedWriter):  # the shard file: ENOSPC once 60 kB were written
        def write(self, data):
            budget[0] -= len(data)
            if budget[0] < 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    def enter(self):
        real(self)
        self._f = FillingDisk(self._f.detach())
        return self

    monkeypatch.setattr(shardwriter.ShardWriter, "__enter__", enter)
    capsys.readouterr()
    out = tmp_path / "out"
    assert pack(src, out, "--samples-per-shard", "3") == 1
    err = one_line_error(capsys)
    assert err.startswith(f"disk full writing {out / 'train'}/train-0000")
    assert err.endswith(
        ".tar.tmp: free space and rerun the same command (finished shards are kept, nothing written is corrupt)"
    )
    assert not (out / "train" / "stoker.json").exists() and not list(out.rglob("*.tmp"))
    monkeypatch.setattr(shardwriter.ShardWriter, "__enter__", real)
    assert pack(src, out, "--samples-per-shard", "3") == 0
    assert tree_sha(out) == tree_sha(tmp_path / "clean")


def test_disk_full_writing_the_manifest(tmp_path, monkeypatch, capsys):
    from stoker.pipeline import fsutil

    src = folder(tmp_path / "src")
    assert pack(src, tmp_path / "clean") == 0
    real = os.fsync

    def fsync(fd):
        if re.search(r"stoker\.json\.[^/]*\.tmp$", os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc")
    monkeypatch.setattr(fsutil.os, "fsync", fsync)
    out = tmp_path / "out"
    capsys.readouterr()
    assert pack(src, out) == 1
    assert one_line_error(capsys) == (
        f"disk full writing {out / 'train' / 'stoker.json'}: free space and "
        f"rerun the same command (finished shards are kept, nothing written is corrupt)"
    )
    assert not (out / "train" / "stoker.json").exists() and not list(out.rglob("*.tmp"))
    monkeypatch.setattr(fsutil.os, "fsync", real)
    assert pack(src, out) == 0
    assert tree_sha(out) == tree_sha(tmp_path / "clean")


def test_deleted_or_truncated_shard_is_rebuilt_byte_identical(tmp_path, capsys):
    src = folder(tmp_path / "src", per_class=4)
    out = tmp_path / "out"
    assert pack(src, out, "--samples-per-shard", "4") == 0
    before = tree_sha(out)
    (out / "train" / "train-000001.tar").unlink()
    with open(out / "train" / "train-000002.tar", "r+b") as f:
        f.truncate(1000)
    (out / "train" / "train-000000.idx").unlink()
    capsys.readouterr()
    assert pack(src, out, "--samples-per-shard", "4") == 0
    assert "restored 3 missing or damaged shard(s)" in capsys.readouterr().err
    assert tree_sha(out) == before
    capsys.readouterr()
    assert pack(src, out, "--samples-per-shard", "4") == 0
    assert "up to date" in capsys.readouterr().out
    # a shard gone after SRC changed cannot come back the same: say so, leave nothing that looks complete
    (out / "train" / "train-000001.tar").unlink()
    for p in src.rglob("*.jpg"):
        p.write_bytes(encode(Image.open(p).convert("RGB"), quality=50))
    assert pack(src, out, "--samples-per-shard", "4") == 1
    assert "rebuilds differently" in one_line_error(capsys)
    assert not (out / "train" / "train-000001.tar").exists()


def test_manifest_rewritten_by_another_tool_is_repaired_on_rerun(tmp_path, capsys):
    src = folder(tmp_path / "src")
    out = tmp_path / "out"
    assert pack(src, out) == 0
    before = tree_sha(out)
    man = json.loads((out / "train" / "stoker.json").read_text())
    man["classes"], man["pack"] = ["0", "1", "2"], {}  # what a re-index of the split would leave
    (out / "train" / "stoker.json").write_text(json.dumps(man))
    capsys.readouterr()
    assert pack(src, out) == 0
    assert "up to date" not in capsys.readouterr().out
    assert tree_sha(out) == before


def test_merge_refuses_a_missing_part_shard(tmp_path, capsys):
    src = folder(tmp_path / "src")
    out = tmp_path / "out"
    for part in ("0/2", "1/2"):
        assert pack(src, out, "--samples-per-shard", "2", "--part", part) == 0
    (out / "train" / "train-p1of2-000000.tar").unlink()
    capsys.readouterr()
    assert cli(["pack", "--merge", str(out)]) == 2
    assert "train-p1of2-000000.tar is missing or damaged; rerun part 1/2" in one_line_error(capsys)
    assert pack(src, out, "--samples-per-shard", "2", "--part", "1/2") == 0
    assert cli(["pack", "--merge", str(out)]) == 0


def test_bomb_and_pixel_limits_still_reject():
    assert sanitize_bytes(bomb_png(30_000, 30_000), Settings()).reason == "too many pixels (30000x30000)"
