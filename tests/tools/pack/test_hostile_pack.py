"""Hostile inputs for ``stoker pack``: every input ends packed with the right label,
listed in rejects.jsonl with a reason, or as a one-line error: the source tree (links, hidden,
unreadable and special files, undecodable names), CSV labels, the val split. What is stored and
faults while writing: test_hostile_pack_output.py. Data is generated in tmp_path; the whole file
runs in seconds."""

import collections
import errno
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from hostile_pack_helpers import CLASSES, folder, one_line_error, pack, rejects, samples
from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.common.synth import draw, encode


def labels(out: Path, split: str = "train") -> dict[str, str]:
    """path -> class name, checked against the class index stored in ``cls``."""
    classes = Manifest.load(out / split).classes
    got = {}
    for path, (cls, meta, _) in samples(out, split).items():
        assert classes[cls] == meta["class"], path
        got[path] = meta["class"]
    return got


def flat_classes(root: Path, counts: dict[str, int]) -> Path:
    """An ImageFolder with ``counts[name]`` small JPEGs in each class folder ``name``."""
    for c, n in counts.items():
        (root / c).mkdir(parents=True)
        for i in range(n):
            (root / c / f"{i}.jpg").write_bytes(encode(draw("circles", (40, 30), random.Random(f"{c}{i}"))))
    return root


def own_images(src: Path) -> dict[str, str]:
    return {p.relative_to(src).as_posix(): p.parent.name for p in sorted(src.glob("*/*.jpg"))}


# --- walking the source tree -------------------------------------------------------------------


def test_symlink_loop_up_adds_nothing_under_the_wrong_label(tmp_path):
    src = folder(tmp_path / "src")
    os.symlink("..", src / "circles" / "loop")
    os.symlink("../..", src / "rings" / "way_up")  # above SRC: would walk its siblings
    (tmp_path / "elsewhere.jpg").write_bytes((src / "rings" / "rings_00000.jpg").read_bytes())
    assert pack(src, tmp_path / "out") == 0
    assert labels(tmp_path / "out") == own_images(src)
    rej = rejects(tmp_path / "out")
    assert set(rej) == {"circles/loop", "rings/way_up"}
    assert rej["circles/loop"] == f"symlink loop to {src.resolve()}: not followed"
    assert rej["rings/way_up"] == f"symlink loop to {tmp_path.resolve()}: not followed"


def test_class_folder_linked_to_src_and_train_linked_to_val_are_not_followed(tmp_path):
    src = folder(tmp_path / "src")
    os.symlink(".", src / "all")  # a "class" that is SRC itself
    assert pack(src, tmp_path / "out") == 0
    assert labels(tmp_path / "out") == own_images(src)
    assert rejects(tmp_path / "out") == {"all": f"symlink loop to {src.resolve()}: not followed"}
    tree = tmp_path / "tree"
    folder(tree / "train", classes=("circles", "rings"))
    folder(tree / "val", classes=("circles", "rings"), seed=1)
    os.symlink("../../val/rings", tree / "train" / "rings" / "more")  # val images would leak into train
    assert pack(tree, tmp_path / "out2") == 0
    assert labels(tmp_path / "out2", "train") == {f"train/{k}": v for k, v in own_images(tree / "train").items()}
    assert labels(tmp_path / "out2", "val") == {f"val/{k}": v for k, v in own_images(tree / "val").items()}
    assert rejects(tmp_path / "out2") == {"train/rings/more": "link into val/: not followed"}


def test_links_into_another_class_are_not_followed_same_class_aliases_pack_once_and_are_listed(tmp_path):
    src = folder(tmp_path / "src")
    os.symlink("../rings", src / "circles" / "borrowed")  # folder link into another class
    os.symlink("../squares/squares_00001.jpg", src / "circles" / "stolen.jpg")  # file link
    os.symlink(".", src / "rings" / "self")  # alias of its own class folder
    os.symlink("rings_00000.jpg", src / "rings" / "again.jpg")  # same file twice in one class
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(src / "squares" / "squares_00000.jpg", outside / "x.jpg")
    os.symlink(outside, src / "squares" / "ext")  # outside SRC: followed
    os.symlink(outside, src / "rings" / "ext2")  # the same outside folder from another class
    os.link(src / "circles" / "circles_00002.jpg", src / "squares" / "hardlink.jpg")
    assert pack(src, tmp_path / "out") == 0
    want = own_images(src)
    del want["rings/rings_00000.jpg"], want["squares/hardlink.jpg"], want["circles/stolen.jpg"]  # again.jpg sorts first
    want["rings/ext2/x.jpg"] = "rings"  # rings sorts before squares: the outside folder is walked there first
    assert labels(tmp_path / "out") == want
    assert rejects(tmp_path / "out") == {
        "circles/borrowed": "link into class 'rings': not followed",
        "circles/stolen.jpg": "link into class 'squares': not followed",
        "squares/ext": "same file as rings/ext2 (class 'rings')",
        "squares/hardlink.jpg": "same file as circles/circles_00002.jpg (class 'circles')",
        "rings/rings_00000.jpg": "same file as rings/again.jpg",  # a second path in one class: listed too
        "rings/self": "same file as rings",
    }


def test_hidden_folders_are_left_out_and_named_in_the_summary(tmp_path, capsys):
    src = folder(tmp_path / "src")
    shutil.copytree(src / "rings", src / ".ipynb_checkpoints")  # a hidden "class": Jupyter made it
    shutil.copytree(src / "rings", src / "rings" / ".thumbs")
    (src / "squares" / "__MACOSX").mkdir()
    assert pack(src, tmp_path / "out") == 0
    out = capsys.readouterr().out
    assert "left out 3 hidden folders: .ipynb_checkpoints/, rings/.thumbs/, squares/__MACOSX/" in out.splitlines()
    want = {k: v for k, v in own_images(src).items() if not k.startswith(".")}
    assert labels(tmp_path / "out") == want  # nothing of them packed
    tree = tmp_path / "tree"
    folder(tree / "train", classes=("circles", "rings"))
    folder(tree / "val", classes=("circles", "rings"), seed=1)
    (tree / ".git").mkdir()
    shutil.copytree(tree / "val" / "rings", tree / "val" / ".cache")
    from stoker.tools.pack import pack as pack_api

    result = pack_api(tree, tmp_path / "out2", workers=1)
    assert (
        result.hidden == [".git/", "val/.cache/"]
        and "left out 2 hidden folders: .git/, val/.cache/" in result.summary()
    )
    assert pack_api(src, tmp_path / "out3", workers=1, part=(0, 2)).hidden == [
        ".ipynb_checkpoints/",
        "rings/.thumbs/",
        "squares/__MACOSX/",
    ]


def test_unreadable_folder_and_file_are_rejects_and_strict_fails(tmp_path, monkeypatch, capsys):
    src = folder(tmp_path / "src")
    (src / "rings" / "locked").mkdir()
    shutil.copy(src / "rings" / "rings_00000.jpg", src / "rings" / "locked" / "a.jpg")
    shutil.copy(src / "rings" / "rings_00000.jpg", src / "rings" / "noperm.jpg")
    locked, noperm = str(src / "rings" / "locked"), str(src / "rings" / "noperm.jpg")
    real_scandir, real_open = os.scandir, os.open

    def scandir(path="."):  # chmod 000 does not stop root: fail the way a real EACCES does
        if str(path) == locked:
            raise PermissionError(errno.EACCES, "Permission denied", locked)
        return real_scandir(path)

    def os_open(path, *a, **k):
        if str(path) == noperm:
            raise PermissionError(errno.EACCES, "Permission denied", noperm)
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "open", os_open)
    assert pack(src, tmp_path / "out") == 0
    assert rejects(tmp_path / "out") == {
        "rings/locked": "unreadable folder: Permission denied",
        "rings/noperm.jpg": "unreadable: errno 13 (Permission denied)",
    }
    assert Manifest.load(tmp_path / "out" / "train").pack["rejected"] == 2
    capsys.readouterr()
    assert pack(src, tmp_path / "out2", "--strict") == 1
    assert one_line_error(capsys) == "2 input(s) rejected (--strict); see rejects.jsonl"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_fifo_device_and_oversized_files_are_never_read(tmp_path):
    src = folder(tmp_path / "src")
    os.mkfifo(src / "circles" / "pipe.jpg")
    os.symlink("/dev/zero", src / "circles" / "zero.jpg")
    big = encode(Image.effect_noise((256, 256), 64).convert("RGB"), quality=95)
    (src / "rings" / "big.jpg").write_bytes(big)
    (tmp_path / "list.csv").write_text("src/circles/pipe.jpg,a\nsrc/circles/circles_00000.jpg,b\n")

    def run(*argv):  # a subprocess with a timeout: a regression here would hang, not fail
        return subprocess.run(
            [sys.executable, "-m", "stoker.tools.cli", "pack", *map(str, argv), "-q"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    r = run(src, tmp_path / "out", "--max-file-size", "20KB", "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert rejects(tmp_path / "out") == {
        "circles/pipe.jpg": "not a regular file (fifo)",
        "circles/zero.jpg": "not a regular file (character device)",
        "rings/big.jpg": f"file too large ({len(big):,} bytes > 20,000)",
    }
    r = run(tmp_path / "list.csv", tmp_path / "out2", "--workers", "2")  # a CSV is not walked: the reader checks
    assert r.returncode == 0, r.stderr
    assert rejects(tmp_path / "out2") == {"src/circles/pipe.jpg": "not a regular file (fifo)"}


def test_non_utf8_file_names_pack_with_escaped_names(tmp_path, capsys):
    src = folder(tmp_path / "src")
    d = os.fsencode(src / "circles")
    good = (src / "rings" / "rings_00000.jpg").read_bytes()
    with open(d + b"/caf\xe9.jpg", "wb") as f:  # Latin-1 name
        f.write(good)
    with open(d + b"/bad\xff.jpg", "wb") as f:  # not UTF-8 and not an image
        f.write(b"")
    os.mkdir(d + b"/sub\xfe")
    with open(d + b"/sub\xfe/x.jpg", "wb") as f:
        f.write(good)
    os.mkdir(os.fsencode(src) + b"/z\xe9bre")  # a class folder
    with open(os.fsencode(src) + b"/z\xe9bre/1.jpg", "wb") as f:
        f.write(good)
    assert pack(src, tmp_path / "out") == 0
    assert Manifest.load(tmp_path / "out" / "train").classes == [*CLASSES, "z\\xe9bre"]
    got = labels(tmp_path / "out")
    assert got["circles/caf\\xe9.jpg"] == "circles" and got["circles/sub\\xfe/x.jpg"] == "circles"
    assert got["z\\xe9bre/1.jpg"] == "z\\xe9bre"
    assert len(got) == 9 + 3
    assert rejects(tmp_path / "out") == {"circles/bad\\xff.jpg": "empty file"}
    capsys.readouterr()
    assert pack(src, tmp_path / "out") == 0 and "up to date" in capsys.readouterr().out


# --- labels (CSV/TSV) --------------------------------------------------------------------------


def _images(tmp_path: Path, n: int) -> list[str]:
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(n):
        (d / f"{i}.jpg").write_bytes(encode(draw("circles", (40, 30), random.Random(i))))
    return [f"imgs/{i}.jpg" for i in range(n)]


def test_integer_labels_kept_negative_and_huge_rejected(tmp_path):
    paths = _images(tmp_path, 6)
    labs = ["2", "10", "3", "-1", "100000000000", "007"]
    (tmp_path / "l.csv").write_text("".join(f"{p},{lab}\n" for p, lab in zip(paths, labs, strict=True)))
    assert pack(tmp_path / "l.csv", tmp_path / "out") == 0
    m = Manifest.load(tmp_path / "out" / "train")
    assert m.classes == [str(i) for i in range(11)]
    assert {p: c for p, (c, _, _) in samples(tmp_path / "out").items()} == {
        "imgs/0.jpg": 2,
        "imgs/1.jpg": 10,
        "imgs/2.jpg": 3,
        "imgs/5.jpg": 7,
    }
    assert rejects(tmp_path / "out") == {
        "imgs/3.jpg": "label -1 out of range 0..1000000",
        "imgs/4.jpg": "label 100000000000 out of range 0..1000000",
    }


def test_header_row_detected_and_odd_names_are_classes(tmp_path):
    paths = _images(tmp_path, 4)
    (tmp_path / "l.csv").write_text(
        "filepath,class\n" + "".join(f"{p},{lab}\n" for p, lab in zip(paths, ["cat", "²", "dog", "cat"], strict=True))
    )
    assert pack(tmp_path / "l.csv", tmp_path / "out") == 0
    assert Manifest.load(tmp_path / "out" / "train").classes == ["cat", "dog", "²"]
    assert labels(tmp_path / "out") == {
        "imgs/0.jpg": "cat",
        "imgs/1.jpg": "²",
        "imgs/2.jpg": "dog",
        "imgs/3.jpg": "cat",
    }
    (tmp_path / "t.tsv").write_text("path\tlabel\n" + "".join(f"{p}\t{i}\n" for i, p in enumerate(paths)))
    assert pack(tmp_path / "t.tsv", tmp_path / "out2") == 0
    assert Manifest.load(tmp_path / "out2" / "train").classes == ["0", "1", "2", "3"]


def test_csv_errors_are_one_line(tmp_path, capsys):
    paths = _images(tmp_path, 3)
    (tmp_path / "latin1.csv").write_bytes("".join(f"{p},café\n" for p in paths).encode("latin-1"))
    (tmp_path / "mixed.csv").write_text(f"{paths[0]},1\n{paths[1]},2\n{paths[2]},²\n")
    (tmp_path / "short.csv").write_text(f"{paths[0]},1\n{paths[1]}\n")
    capsys.readouterr()
    assert pack(tmp_path / "latin1.csv", tmp_path / "o1") == 2
    err = one_line_error(capsys)
    assert "latin1.csv is not UTF-8 (byte 0xe9 on line 1)" in err and "iconv -f latin1 -t utf-8" in err
    assert pack(tmp_path / "mixed.csv", tmp_path / "o2") == 2
    assert "labels mix integers and names (e.g. '1' and '²')" in one_line_error(capsys)
    assert pack(tmp_path / "short.csv", tmp_path / "o3") == 2
    assert "line 2 should be 'path,label'" in one_line_error(capsys)
    # a header naming fewer columns than the rows hold: never a target column silently dropped
    (tmp_path / "narrow.csv").write_text(f"path,target\n{paths[0]},0.1,0.2\n{paths[1]},0.3,0.4\n")
    assert pack(tmp_path / "narrow.csv", tmp_path / "o4") == 2
    assert "line 2 has 3 cells but the header names 2 (path,target)" in one_line_error(capsys)
    (tmp_path / "trailing.csv").write_text(f"path,target\n{paths[0]},0.1,\n{paths[1]},0.3,\n")  # trailing commas
    assert pack(tmp_path / "trailing.csv", tmp_path / "o5") == 0
    (tmp_path / "ragged.csv").write_text(f"{paths[0]},0.1,0.2\n{paths[1]},0.3\n")
    assert pack(tmp_path / "ragged.csv", tmp_path / "o6") == 2
    assert "line 2 has 2 cells, the widest row 3" in one_line_error(capsys)


# --- splits ------------------------------------------------------------------------------------


def test_val_fraction_keeps_a_single_image_class_in_train(tmp_path, capsys):
    # 1 image a class: none can give val one without losing its only train image
    capsys.readouterr()
    ones = flat_classes(tmp_path / "ones", {f"c{i:02d}": 1 for i in range(10)})
    assert pack(ones, tmp_path / "o1", "--val-fraction", "0.3") == 2
    assert one_line_error(capsys) == (
        f"--val-fraction 0.3 leaves val/ empty: each class of {ones} holds a single image, which stays in "
        "train (a class needs 2 to give val one); drop --val-fraction"
    )
    # 2 images a class: 10 x 2 x 0.25 = 5 classes give one each, every class keeps one in train
    twos = flat_classes(tmp_path / "twos", {f"c{i:02d}": 2 for i in range(10)})
    assert pack(twos, tmp_path / "o2", "--val-fraction", "0.25") == 0
    train, val = labels(tmp_path / "o2", "train"), labels(tmp_path / "o2", "val")
    assert len(val) == 5 and len(set(val.values())) == 5 and set(train.values()) == set(own_images(twos).values())
    assert "val/ only" not in capsys.readouterr().err
    pack(twos, tmp_path / "again", "--val-fraction", "0.25")
    assert labels(tmp_path / "again", "val") == val  # deterministic
    # mixed: the 5-image classes give floor(1.25) = 1 and share the rest; the single images stay in train
    mixed = flat_classes(tmp_path / "mixed", {"a": 5, "b": 5, "c": 1, "d": 1, "e": 1})
    assert pack(mixed, tmp_path / "o3", "--val-fraction", "0.25") == 0
    val3 = labels(tmp_path / "o3", "val")
    assert len(val3) == 2 and sorted(val3.values()) == ["a", "b"]
    assert set(labels(tmp_path / "o3", "train").values()) == {"a", "b", "c", "d", "e"}


def test_stratified_split_keeps_every_class_in_train():
    from stoker.tools.pack.sources.base import Item
    from stoker.tools.pack.sources.registry import stratified_split

    rng = random.Random(7)
    sizes = [rng.choice([1, 2, 2, 3, 7, 40]) for _ in range(300)]
    items = [Item(f"{c}/{i}.jpg", c) for c, n in enumerate(sizes) for i in range(n)]
    for fraction in (0.01, 0.1, 0.3, 0.5, 0.9):
        train, val = stratified_split(items, fraction, seed=3)
        assert sorted(train + val, key=lambda it: it.rel) == sorted(items, key=lambda it: it.rel)
        assert {it.label for it in train} == set(range(len(sizes)))  # no class lost from train
        per_class = collections.Counter(it.label for it in val)
        assert all(abs(per_class[c] - n * fraction) < 1 for c, n in enumerate(sizes) if n >= 2)  # stratified
        assert not any(per_class[c] for c, n in enumerate(sizes) if n == 1)
        # the overall fraction of the classes that can give, unless they are all given up to their last image
        eligible = sum(n for n in sizes if n >= 2)
        full = all(per_class[c] >= min(math.ceil(n * fraction), n - 1) for c, n in enumerate(sizes) if n >= 2)
        assert abs(len(val) - fraction * eligible) <= 1 or full


def test_a_class_only_in_val_is_named(tmp_path, capsys):
    src = flat_classes(tmp_path / "src", {"a": 2, "b": 2, "c": 1})
    (tmp_path / "val.txt").write_text("a/0\nc/0\n")
    capsys.readouterr()
    assert pack(src, tmp_path / "out", "--val-list", tmp_path / "val.txt") == 0
    assert capsys.readouterr().err.strip() == "note: 1 class is in val/ only (no train image, so never learnt): c"


def test_flat_folder_of_images_is_one_line(tmp_path, capsys):
    src = tmp_path / "flat"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.JPEG").write_bytes(encode(draw("circles", (40, 30), random.Random(i))))
    capsys.readouterr()
    assert pack(src, tmp_path / "out") == 2
    assert one_line_error(capsys) == (
        f"SRC {src} holds 3 images but no class folders; put them in one subfolder "
        f"per class, list them in a CSV of path,label, or give their masks with --masks"
    )


def test_empty_val_folder_is_said(tmp_path, capsys):
    folder(tmp_path / "src" / "train")
    (tmp_path / "src" / "val").mkdir()
    capsys.readouterr()
    assert pack(tmp_path / "src", tmp_path / "out") == 0
    assert capsys.readouterr().err.strip() == "note: val/ holds no samples: it has no input images"
    assert Manifest.load(tmp_path / "out" / "val").num_samples == 0
