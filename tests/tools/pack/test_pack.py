import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker.pipeline.shards.idx import index_tar, read_idx
from stoker.pipeline.shards.manifest import Manifest, check_shards
from stoker.tools.cli import main as cli
from stoker.tools.common.synth import make_image_folder
from stoker.tools.pack.sanitize import Settings, sanitize
from stoker.tools.pack.sources import scan

CLASSES = ("circles", "rings", "squares")  # sorted: class index = position


def folder(root: Path, **kw) -> Path:
    kw = {"classes": CLASSES, "per_class": 4, "min_side": 32, "max_side": 96, **kw}
    return make_image_folder(root, **kw)


def pack(*argv) -> int:
    return cli(
        ["pack", *map(str, argv), "-q", "--workers", "1"]
        if "--workers" not in argv
        else ["pack", *map(str, argv), "-q"]
    )


def read_wds(split_dir: Path) -> list[dict]:
    """All samples of a split through webdataset (the reference reader)."""
    import webdataset as wds

    m = Manifest.load(split_dir)
    urls = [str(split_dir / s.name) for s in m.shards]
    return list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))


def tree_sha(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_round_trip_webdataset_reads_sanitized_bytes_and_labels(tmp_path):
    src = folder(tmp_path / "src")
    assert pack(src, tmp_path / "out", "--short-side", "48", "--samples-per-shard", "5") == 0
    split = tmp_path / "out" / "train"
    m = Manifest.load(split)
    assert m.classes == list(CLASSES) and m.num_samples == 12
    assert [s.name for s in m.shards] == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    assert m.pack["short_side"] == 48 and m.pack["seed"] == 0 and m.pack["split"] == "train"
    check_shards(split, m, sha256=True)
    samples = read_wds(split)
    assert len(samples) == 12
    seen = set()
    for s in samples:
        meta = json.loads(s["json"])
        expect = sanitize(str(src / meta["path"]), Settings(short_side=48))
        assert s["jpg"] == expect.jpg
        assert int(s["cls"]) == CLASSES.index(meta["path"].split("/")[0]) and meta["class"] in CLASSES
        assert (meta["width"], meta["height"]) == (expect.width, expect.height)
        assert len(s["__key__"]) == 9 and s["__key__"].isdigit()
        seen.add(meta["path"])
    assert len(seen) == 12
    # keys are positions of the shuffled list, in order
    assert [s["__key__"] for s in samples] == [f"{i:09d}" for i in range(12)]


@pytest.mark.skipif(
    not (Path(sys.executable).parent / "wds2idx").exists() and not shutil.which("wds2idx"),
    reason="DALI's wds2idx not installed",
)
def test_idx_equals_dali_wds2idx(tmp_path):
    src = folder(tmp_path / "src", nasty=True)
    pack(src, tmp_path / "out", "--samples-per-shard", "7")
    exe = shutil.which("wds2idx") or str(Path(sys.executable).parent / "wds2idx")
    split = tmp_path / "out" / "train"
    for s in Manifest.load(split).shards:
        subprocess.run([exe, str(split / s.name), str(tmp_path / "dali.idx")], check=True, capture_output=True)
        assert (tmp_path / "dali.idx").read_text() == (split / s.name).with_suffix(".idx").read_text()


def test_nasty_inputs_listed_in_rejects_rest_packs(tmp_path, capsys):
    src = folder(tmp_path / "src", nasty=True)
    (src / "circles" / ".DS_Store").write_bytes(b"junk")
    (src / "circles" / "notes.txt").write_text("hello")
    assert pack(src, tmp_path / "out") == 0
    out = capsys.readouterr().out
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    reasons = {r["path"]: r["reason"] for r in rejects}
    assert reasons == {
        "circles/bad_truncated.jpg": "truncated",
        "circles/bad_zero.jpg": "empty file",
        "circles/bad_not_an_image.jpg": "not an image",
        "circles/bad_bomb.png": "too many pixels (100000x100000)",
    }
    m = Manifest.load(tmp_path / "out" / "train")
    assert m.num_samples == 12 + 9  # the 9 odd-but-valid nasty files pack
    paths = {json.loads(s["json"])["path"] for s in read_wds(tmp_path / "out" / "train")}
    assert "circles/odd name, with spaces & ünïcode's.jpg" in paths and "circles/exif_rotated.jpg" in paths
    assert m.pack["rejected"] == 4 and m.pack["skipped"] == 2
    assert "4 rejected inputs" in out
    assert cli(["pack", str(src), str(tmp_path / "out2"), "-q", "--workers", "1", "--strict"]) == 1


def test_same_seed_same_bytes_other_seed_other_order(tmp_path):
    src = folder(tmp_path / "src")
    for name, seed, workers in (("a", 0, 2), ("b", 0, 1), ("c", 1, 2)):
        pack(src, tmp_path / name, "--seed", seed, "--samples-per-shard", "4", "--workers", workers)
    a, b, c = (tree_sha(tmp_path / n / "train") for n in "abc")
    assert a == b  # same seed, with and without the process pool
    assert set(a) == set(c) and a != c

    def order(n):
        return [json.loads(s["json"])["path"] for s in read_wds(tmp_path / n / "train")]

    assert order("a") != order("c") and sorted(order("a")) == sorted(order("c"))


def test_shard_size_rolls_over_before_exceeding(tmp_path):
    src = folder(tmp_path / "src", min_side=100, max_side=160)
    pack(src, tmp_path / "out", "--shard-size", "30KB")
    m = Manifest.load(tmp_path / "out" / "train")
    assert len(m.shards) > 2 and m.num_samples == 12
    # each shard stays within the size (+ the tar end padding of at most one 10 KiB record)
    assert all(s.bytes <= 30_000 + 10_240 for s in m.shards if s.num_samples > 1)


def test_rerun_is_up_to_date_and_other_settings_refused(tmp_path, capsys):
    src = folder(tmp_path / "src")
    assert pack(src, tmp_path / "out") == 0
    before = tree_sha(tmp_path / "out")
    capsys.readouterr()
    assert pack(src, tmp_path / "out") == 0
    assert "up to date" in capsys.readouterr().out
    assert tree_sha(tmp_path / "out") == before
    assert pack(src, tmp_path / "out", "--quality", "70") == 2
    err = capsys.readouterr().err.strip()
    assert "already holds a different pack" in err and "quality" in err and len(err.splitlines()) == 1


def test_usage_errors_one_line_exit_2(tmp_path, capsys):
    src = folder(tmp_path / "src", per_class=1)
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    (tmp_path / "empty" / "cls" / "readme.txt").write_text("no images")
    (tmp_path / "afile").write_text("x")
    cases = {
        "does not exist": [tmp_path / "nope", tmp_path / "o1"],
        "holds no images": [tmp_path / "empty", tmp_path / "o2"],
        "inside SRC": [src, src / "cls-out"],
        "cannot write": [src, tmp_path / "afile" / "out"],
        "--part": [src, tmp_path / "o3", "--part", "2/2"],
        "shard-size": [src, tmp_path / "o4", "--shard-size", "lots"],
    }
    for expect, argv in cases.items():
        assert pack(*argv) == 2, expect
        err = capsys.readouterr().err.strip()
        assert expect in err and len(err.splitlines()) == 1 and "Traceback" not in err, (expect, err)


def test_usage_error_through_console_script_has_no_traceback(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "stoker.tools.cli", "pack", str(tmp_path / "nope"), str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "does not exist" in r.stderr


def test_val_fraction_is_stratified_and_deterministic(tmp_path):
    src = folder(tmp_path / "src", per_class=5)
    pack(src, tmp_path / "out", "--val-fraction", "0.4")
    train, val = (read_wds(tmp_path / "out" / s) for s in ("train", "val"))
    tpaths = {json.loads(s["json"])["path"] for s in train}
    vpaths = {json.loads(s["json"])["path"] for s in val}
    assert len(vpaths) == 6 and len(tpaths) == 9 and not tpaths & vpaths
    assert sorted(int(s["cls"]) for s in val) == [0, 0, 1, 1, 2, 2]
    assert Manifest.load(tmp_path / "out" / "val").classes == list(CLASSES)
    pack(src, tmp_path / "again", "--val-fraction", "0.4")
    assert tree_sha(tmp_path / "again" / "val") == tree_sha(tmp_path / "out" / "val")


def test_train_val_tree_shares_classes(tmp_path):
    folder(tmp_path / "src" / "train", classes=("circles", "rings"), per_class=2)
    folder(tmp_path / "src" / "val", classes=("rings", "squares"), per_class=1)
    pack(tmp_path / "src", tmp_path / "out")
    for split, n in (("train", 4), ("val", 2)):
        m = Manifest.load(tmp_path / "out" / split)
        assert m.classes == list(CLASSES) and m.num_samples == n
    labels = {json.loads(s["json"])["class"]: int(s["cls"]) for s in read_wds(tmp_path / "out" / "val")}
    assert labels == {"rings": 1, "squares": 2}


def test_csv_input(tmp_path):
    src = folder(tmp_path / "imgs", per_class=2)
    rows = ["path,label"] + [f"imgs/{p.parent.name}/{p.name},{p.parent.name}" for p in sorted(src.rglob("*.jpg"))]
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    assert pack(tmp_path / "list.csv", tmp_path / "out") == 0
    m = Manifest.load(tmp_path / "out" / "train")
    assert m.num_samples == 6 and m.classes == list(CLASSES)
    for s in read_wds(tmp_path / "out" / "train"):
        meta = json.loads(s["json"])
        assert meta["path"].startswith("imgs/") and CLASSES[int(s["cls"])] == meta["path"].split("/")[1]
    (tmp_path / "int.tsv").write_text("".join(f"{r.split(',')[0]}\t{i % 2}\n" for i, r in enumerate(rows[1:])))
    assert pack(tmp_path / "int.tsv", tmp_path / "out2") == 0
    assert Manifest.load(tmp_path / "out2" / "train").classes == ["0", "1"]


def test_parts_then_merge_equal_plain_pack(tmp_path, capsys):
    src = folder(tmp_path / "src", nasty=True)
    pack(src, tmp_path / "plain", "--samples-per-shard", "4")
    parts = tmp_path / "parts"
    assert pack(src, parts, "--samples-per-shard", "4", "--part", "0/2") == 0
    capsys.readouterr()
    assert cli(["pack", "--merge", str(parts)]) == 2
    assert "1/2" in capsys.readouterr().err
    assert pack(src, parts, "--samples-per-shard", "4", "--part", "1/2", "--workers", "2") == 0
    assert cli(["pack", "--merge", str(parts)]) == 0
    m = Manifest.load(parts / "train")
    assert all("-p0of2-" in s.name or "-p1of2-" in s.name for s in m.shards)

    def samples(root):
        return sorted((s["__key__"], hashlib.sha256(s["jpg"]).hexdigest(), s["cls"]) for s in read_wds(root / "train"))

    assert samples(parts) == samples(tmp_path / "plain")

    def rej(r):
        return sorted((r / "rejects.jsonl").read_text().splitlines())

    assert rej(parts) == rej(tmp_path / "plain") and len(rej(parts)) == 4


# Runs `stoker pack` with sanitize blocked (forever) on one input: a deterministic point to kill -9 at.
_BLOCKING_PACK = """
import sys, time
import stoker.tools.pack.engine as engine
real = engine.sanitize_item
def blocking(job, settings):
    if job.where.endswith(sys.argv[1]):
        time.sleep(3600)
    return real(job, settings)
engine.sanitize_item = blocking
from stoker.tools.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _blocking_source(tmp_path: Path) -> tuple[Path, int, int]:
    """A folder and a seed that puts one image (where the packer will block) at an odd
    position in the middle of the shuffled list: two shards done, a third half written."""
    src = folder(tmp_path / "src", per_class=4)
    shutil.copy(src / "rings" / "rings_00000.jpg", src / "rings" / "zz_block.jpg")
    for seed in range(100):
        rels = [it.rel for it in scan(src, seed=seed).splits["train"]]
        pos = rels.index("rings/zz_block.jpg")
        if pos == 5:
            return src, seed, pos
    raise AssertionError("no seed puts the image at position 5")


def test_kill_9_mid_pack_then_rerun_is_byte_identical(tmp_path):
    src, seed, _ = _blocking_source(tmp_path)
    script = tmp_path / "blocking_pack.py"
    script.write_text(_BLOCKING_PACK)

    def argv(out):
        return [
            "pack",
            str(src),
            str(out),
            "--workers",
            "1",
            "--samples-per-shard",
            "2",
            "--seed",
            str(seed),
            "-q",
        ]

    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, str(script), "zz_block.jpg", *argv(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    journal = out / ".stoker-pack" / "train-p0of1.jsonl"
    tmp_shard = out / "train" / "train-000002.tar.tmp"
    deadline = time.monotonic() + 60
    while not (journal.exists() and journal.read_text().count("\n") == 2 and tmp_shard.exists()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "packer did not reach the blocking image"
        time.sleep(0.02)
    time.sleep(0.2)  # blocked on the image, mid-shard
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "train" / "stoker.json").exists() and tmp_shard.exists()
    first = (out / "train" / "train-000000.tar").stat()
    cli_cmd = [sys.executable, "-m", "stoker.tools.cli"]
    assert subprocess.run(cli_cmd + argv(out), capture_output=True).returncode == 0
    again = (out / "train" / "train-000000.tar").stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # kept, not redone
    assert subprocess.run(cli_cmd + argv(tmp_path / "clean"), capture_output=True).returncode == 0
    killed, clean = tree_sha(out), tree_sha(tmp_path / "clean")
    assert killed == clean
    assert not any(name.endswith(".tmp") for name in killed)
    assert Manifest.load(out / "train").num_samples == 13


def test_resume_drops_torn_journal_line_and_stale_tmp(tmp_path):
    src = folder(tmp_path / "src")
    pack(src, tmp_path / "clean", "--samples-per-shard", "3")
    pack(src, tmp_path / "out", "--samples-per-shard", "3")
    out = tmp_path / "out"
    # simulate a crash after shard 1: journal cut mid-line, later shards and manifests gone
    journal = out / ".stoker-pack" / "train-p0of1.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:2]) + lines[2][:10])
    for p in list((out / "train").iterdir()):
        if p.name >= "train-000002" or p.name == "stoker.json":
            p.unlink()
    (out / "rejects.jsonl").unlink()
    (out / "train" / "train-000002.tar.tmp").write_bytes(b"half a shard")
    assert pack(src, out, "--samples-per-shard", "3") == 0
    assert tree_sha(out) == tree_sha(tmp_path / "clean")


def test_idx_matches_tar_scan(tmp_path):
    src = folder(tmp_path / "src")
    pack(src, tmp_path / "out", "--samples-per-shard", "5")
    for tar in (tmp_path / "out" / "train").glob("*.tar"):
        assert read_idx(tar.with_suffix(".idx")) == index_tar(tar)


@pytest.mark.skipif(sys.platform == "win32", reason="needs fcntl")
def test_same_part_twice_at_once_is_refused(tmp_path, capsys):
    import fcntl

    src = folder(tmp_path / "src", per_class=1)
    state = tmp_path / "out" / ".stoker-pack"
    state.mkdir(parents=True)
    with open(state / "train-p0of1.lock", "a") as held:  # another process packing this part
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert pack(src, tmp_path / "out") == 2
    assert "being packed by another process" in capsys.readouterr().err
    assert pack(src, tmp_path / "out") == 0


def test_summary_says_what_was_resized_reencoded_and_copied(tmp_path, capsys):
    import io
    import random

    from PIL import Image

    from stoker.tools.common.synth import draw, encode

    src = tmp_path / "src" / "circles"
    src.mkdir(parents=True)
    rng = random.Random(0)
    sizes = {"big0.jpg": (400, 300), "big1.jpg": (300, 500), "small0.jpg": (80, 60), "small1.jpg": (64, 64)}
    for name, size in sizes.items():
        (src / name).write_bytes(encode(draw("circles", size, rng)))
    png = io.BytesIO()
    draw("circles", (70, 50), rng).save(png, "PNG")  # a PNG is re-encoded at its size
    (src / "small.png").write_bytes(png.getvalue())
    capsys.readouterr()
    assert pack(tmp_path / "src", tmp_path / "out", "--quality", "85") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == (
        "stored: 2 resized to a shorter side of 256 px and re-encoded at quality 85, 1 re-encoded at quality 85 "
        "without resizing, 2 copied byte for byte; --short-side 0 keeps the original sizes"
    )
    stored = {
        json.loads(s["json"])["path"]: Image.open(io.BytesIO(s["jpg"])).size
        for s in read_wds(tmp_path / "out" / "train")
    }
    assert sum(min(wh) == 256 for wh in stored.values()) == 2  # what the line says is what the shards hold
    assert pack(tmp_path / "src", tmp_path / "keep", "--short-side", "0", "--max-side", "0") == 0
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == "stored: 1 re-encoded at quality 90 without resizing, 4 copied byte for byte"
    )
