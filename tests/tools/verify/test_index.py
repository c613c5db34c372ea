import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from stoker.pipeline.shards.idx import index_tar, read_idx
from stoker.pipeline.shards.manifest import Manifest, check_shards
from stoker.tools.cli import main as cli


def jpeg(colour, size=(24, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "JPEG")
    return buf.getvalue()


def write_foreign(folder: Path, n=11, bad=(4,)) -> list[Path]:
    """Shards written by webdataset's own ShardWriter: non-numeric keys, .jpeg, one corrupt image."""
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / "foreign-%03d.tar"), maxcount=5, verbose=0) as sink:
        for i in range(n):
            data = jpeg((i * 20, 0, 0))
            if i in bad:
                data = data[:40]
            sink.write({"__key__": f"photo_{i}", "jpeg": data, "cls": i % 3})
    return sorted(folder.glob("*.tar"))


def test_index_webdataset_shards_marks_corrupt_image_as_skip(tmp_path, capsys):
    tars = write_foreign(tmp_path / "wds")
    assert cli(["index", *map(str, tars), "-q"]) == 0
    assert "1 sample(s) marked to skip (1 image does not decode)" in capsys.readouterr().out
    m = Manifest.load(tmp_path / "wds")
    assert m.num_samples == 11 and [s.num_samples for s in m.shards] == [5, 5, 1]
    assert m.classes == ["0", "1", "2"] and m.pack["image_exts"] == ["jpeg"]
    assert m.pack["skip"] == [
        [
            "foreign-000.tar",
            4,
            "image does not decode: fails the loader's header check "
            "(truncated, not a JPEG/PNG, or a JPEG kind the decoders do not read)",
        ]
    ]
    check_shards(tmp_path / "wds", m, sha256=True)
    for t in tars:
        assert read_idx(t.with_suffix(".idx")) == index_tar(t)
    # the loader-facing check passes: the bad sample is known and skipped
    assert cli(["verify", str(tmp_path / "wds"), "-q"]) == 0


@pytest.mark.skipif(
    not (Path(sys.executable).parent / "wds2idx").exists() and not shutil.which("wds2idx"),
    reason="DALI's wds2idx not installed",
)
def test_index_equals_wds2idx_on_foreign_tar(tmp_path):
    tars = write_foreign(tmp_path / "wds", bad=())
    cli(["index", str(tmp_path / "wds"), "-q", "--no-check"])
    exe = shutil.which("wds2idx") or str(Path(sys.executable).parent / "wds2idx")
    for t in tars:
        subprocess.run([exe, str(t), str(tmp_path / "dali.idx")], check=True, capture_output=True)
        assert (tmp_path / "dali.idx").read_text() == t.with_suffix(".idx").read_text()


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs the tar command")
def test_index_gnu_tar_with_png_and_class_names(tmp_path, capsys):
    files = tmp_path / "files"
    files.mkdir()
    for i in range(4):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (0, i * 60, 0)).save(buf, "PNG")
        (files / f"s{i}.png").write_bytes(buf.getvalue())
        (files / f"s{i}.cls").write_text(str(i % 2))
    (files / "s9.png").write_bytes(buf.getvalue())  # no label
    Image.new("LA", (8, 8)).save(files / "s5.png")  # not RGB: fine for DALI
    (files / "s5.cls").write_text("1")
    names = sorted(p.name for p in files.iterdir())
    (tmp_path / "shards").mkdir()
    subprocess.run(["tar", "cf", str(tmp_path / "shards" / "gnu.tar"), "-C", str(files), *names], check=True)
    assert cli(["index", str(tmp_path / "shards" / "gnu.tar"), "--classes", "cat,dog", "-q"]) == 0
    m = Manifest.load(tmp_path / "shards")
    assert m.classes == ["cat", "dog"] and m.num_samples == 6 and m.pack["skip"] == [["gnu.tar", 5, "no cls label"]]
    assert "1 no cls label" in capsys.readouterr().out
    assert cli(["verify", str(tmp_path / "shards"), "-q"]) == 0


def test_index_usage_errors(tmp_path, capsys):
    tars = write_foreign(tmp_path / "wds", bad=())
    assert cli(["index", str(tmp_path / "nope.tar")]) == 2
    assert cli(["index", str(tars[0]), "--classes", "one"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope.tar'} does not exist" in err and "names only 1 classes" in err
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
    assert cli(["index", str(tmp_path / "junk.tar"), "-q"]) == 1


def test_index_skips_images_the_loader_cannot_read(tmp_path, capsys):
    """A WebP sample (Pillow decodes it, the loader does not) is marked to skip, not passed."""
    import webdataset as wds

    from stoker.pipeline import Loader

    folder = tmp_path / "webp"
    folder.mkdir()
    buf = io.BytesIO()
    Image.new("RGB", (24, 16), (0, 90, 0)).save(buf, "WEBP")
    with wds.TarWriter(str(folder / "mixed.tar")) as sink:
        for i in range(4):
            sink.write({"__key__": f"k{i}", "jpg": jpeg((i * 40, 0, 0)), "cls": i % 2})
        sink.write({"__key__": "k4", "webp": buf.getvalue(), "cls": 1})
    assert cli(["index", str(folder / "mixed.tar"), "-q"]) == 0
    capsys.readouterr()
    m = Manifest.load(folder)
    assert m.pack["skip"] == [["mixed.tar", 4, "no image: has cls, webp"]]
    loader = Loader(folder, batch_size=2, train=False, crop=16, backend="pil", threads=0)
    assert sum(len(labels) for _, labels in loader) == 4


def test_index_python_api(tmp_path):
    from stoker.errors import UsageError
    from stoker.tools.verify.indexing import IndexResult, index

    write_foreign(tmp_path / "wds", bad=(4,))
    result = index(tmp_path / "wds", classes=["cat", "dog", "bird"], workers=1)
    assert isinstance(result, IndexResult)
    assert result.manifest == tmp_path / "wds" / "stoker.json" and result.shards == 3 and result.num_samples == 11
    assert result.classes == ["cat", "dog", "bird"] and [e[:2] for e in result.skip] == [["foreign-000.tar", 4]]
    assert result.notes == []
    assert result.summary().splitlines()[1] == "1 sample(s) marked to skip (1 image does not decode)"
    assert Manifest.load(tmp_path / "wds").classes == ["cat", "dog", "bird"]
    again = index(sorted((tmp_path / "wds").glob("*.tar")), check=False, workers=1)  # re-index keeps the names
    assert again.classes == ["cat", "dog", "bird"] and again.skip == result.skip  # decode skips carried over
    with pytest.raises(UsageError, match="^classes names a class twice"):
        index(tmp_path / "wds", classes=["a", "a"])
