"""Mixes at their joints with the rest (issue 48): an empty split, box packs, label spaces that
differ, a split's own options (``Source``), and a shard truncated or rewritten mid-epoch on every
backend."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from marked_splits import check_batch, write_marked

from helpers import run_cli, write_split
from stoker.errors import ArgumentError, StokerError
from stoker.pipeline import Loader, Source
from stoker.pipeline.deps import HAS_DALI


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("joints")
    write_split(root / "a" / "train", num_samples=20, samples_per_shard=10)
    write_split(root / "e" / "train", num_samples=0, samples_per_shard=10)  # a pack whose train/ is empty
    for split, n in (("train", 12), ("val", 6)):
        write_marked(root / "boxa" / split, "boxes", n=n, first_uid=0 if split == "train" else 500)
        write_marked(root / "boxb" / split, "boxes", n=n - 3, first_uid=100 if split == "train" else 600)
    return root


def _loader(paths, **kw):
    return Loader(paths, **{"batch_size": 4, "crop": 32, "backend": "pil", "threads": 0, **kw})


def test_a_split_of_weight_0_is_left_out_in_one_line(packs, capsys):
    a, e = packs / "a" / "train", packs / "e" / "train"
    for how in ({"weights": [1, 0]}, {}):
        loader = _loader([Source(a, weight=1), Source(e, weight=0)] if not how else [a, e], **how)
        err = [ln for ln in capsys.readouterr().err.splitlines() if "left out" in ln]
        assert err == [f"stoker mix: {e}: weight 0: left out"]
        assert loader.mix.names == [str(a)] and sorted(np.concatenate(list(loader.epoch_batches()))) == list(range(20))
    # without weights=, a split's size is its weight: an empty one is left out too, saying so
    loader = _loader([a, e])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "left out" in ln]
    assert err == [f"stoker mix: {e}: no loadable samples (its weight: its size, 0): left out"]
    assert loader.mix.quotas == [20]


def test_an_empty_split_of_a_weight_is_one_line_naming_it_the_same_on_every_rank(packs):
    a, e = packs / "a" / "train", packs / "e" / "train"
    said = set()
    for rank in range(3):  # raised while the Loader is made: before any worker process starts
        with pytest.raises(ArgumentError) as got:
            _loader([a, e], weights=[0.5, 0.5], rank=rank, world_size=3, threads=2)
        said.add(str(got.value))
    assert said == {f"{e} has no loadable samples: a split of a mix needs some (give it weight 0 to leave it out)"}


def test_stoker_train_of_a_mix_with_an_empty_split_exits_2_in_one_line(packs):
    rc, out, err = run_cli("train", packs, "--mix", "a:0.5,e:0.5", "--out", packs / "run", "--epochs", "1")
    assert rc == 2, err
    assert err.strip().splitlines() == [
        f"stoker train: error: {packs / 'e' / 'train'} has no loadable samples: a split of a mix needs some "
        "(give it weight 0 to leave it out)"
    ]


@pytest.mark.parametrize("train", [True, False])
def test_a_mix_of_two_box_packs_reads_their_boxes(packs, train):
    split = "train" if train else "val"
    loader = _loader([packs / "boxa" / split, packs / "boxb" / split], train=train)
    seen = np.concatenate([check_batch("boxes", x, y) for x, y in loader])
    if train:
        assert len(seen) == 20 and len(set(seen.tolist())) == 20  # 21 samples, drop_last: 5 batches of 4
    else:
        assert sorted(seen.tolist()) == [*range(500, 506), *range(600, 603)]


@pytest.mark.parametrize("kind", ["class", "multilabel", "boxes"])
def test_splits_whose_class_names_differ_are_refused_naming_both_lists(tmp_path, kind):
    """The same count of classes, other names: a sample tagged "ant" never trains as "cat"."""
    a = write_marked(tmp_path / "a", kind, n=4)
    b = write_marked(tmp_path / "b", kind, n=4, classes=("cat", "dog", "eel"))
    with pytest.raises(ArgumentError) as got:
        _loader([a, b])
    assert str(got.value) == (
        f"a mix needs splits of one target: {a} has 3 classes (ant, bee, cat), {kind} targets, "
        f"{b} has 3 classes (cat, dog, eel), {kind} targets"
    )


def test_a_source_carries_its_own_url_options(packs, tmp_path):
    from storage_servers import http_server

    a = packs / "a" / "train"
    with http_server(packs) as base:
        url = f"{base}/a/train"
        own = Source(url, weight=3, cache_dir=tmp_path / "own", storage_options={"block_size": 4096})
        loader = _loader([own, Source(a, weight=1)], epoch_length=16)
        remote = loader.source.sources[0].cache
        assert remote.dir == tmp_path / "own" and remote.fs.storage_options["block_size"] == 4096
        next(iter(loader))  # the URL split's shards are fetched for the first batch, into its own cache
        assert loader.mix.quotas == [12, 4] and sorted(p.name for p in (tmp_path / "own").glob("*.tar")) == [
            "shard-000000.tar",
            "shard-000001.tar",
        ]
        # the Loader's URL options are for the mix's URL splits; a local split is read as it is
        loader = _loader([url, a], cache_dir=tmp_path / "shared")
        assert loader.source.sources[0].cache.dir == tmp_path / "shared"
        # a plain split given as a Source
        one = _loader(Source(url, cache_dir=tmp_path / "one"))
        assert one.cache.dir == tmp_path / "one" and len(one) == 5
    with pytest.raises(ArgumentError, match=rf"cache_dir= is for a URL .*; {a} is a local path"):
        _loader([Source(a, cache_dir=tmp_path / "x"), a])
    with pytest.raises(ArgumentError, match=rf"cache_dir= is for a URL .*; {a} is a local path"):
        _loader([a, a], cache_dir=tmp_path / "x")  # no URL split in the mix: the refusal as before
    with pytest.raises(ArgumentError, match=r"weights= and Source\(weight=\) are both given"):
        _loader([Source(a, weight=1), Source(a, weight=1)], weights=[1, 1])
    with pytest.raises(ArgumentError, match=rf"Source\(weight=\) is given to some splits only: give {a} one too"):
        _loader([Source(a, weight=1), a])
    with pytest.raises(ArgumentError, match=r"weight=-1\): a weight must be a finite number >= 0"):
        Source(a, weight=-1)


_CHANGE = """
import os, sys
from pathlib import Path
from stoker.pipeline import Loader

split = Path(sys.argv[1])
backends = [("pil", 0), ("pil", 1)] + ([("dali", 1)] if sys.argv[2] == "1" else [])
for how, backend, threads in [(how, *b) for how in ("truncate", "rewrite") for b in backends]:
    data = {p: p.read_bytes() for p in split.glob("*.tar")}
    loader = Loader(split, batch_size=4, crop=32, backend=backend, threads=threads, train=False, prefetch=1)
    it = iter(loader)
    next(it)
    for p, raw in data.items():
        if how == "truncate":
            with open(p, "r+b") as f:
                f.truncate(1024)
        else:  # rewritten in place, the same size (a `cp` of another pack over it)
            with open(p, "r+b") as f:
                f.write(bytes(len(raw)))
            os.utime(p, ns=(1, 1))
    try:
        for _ in it:
            pass
        print(how, backend, threads, "no error")
    except Exception as e:
        print(how, backend, threads, type(e).__name__, str(e).replace(chr(10), " | "))
    loader.close()
    for p, raw in data.items():
        p.write_bytes(raw)
"""


def test_a_shard_changed_mid_epoch_is_one_line_naming_it_on_every_backend(tmp_path):
    """Before: a SIGBUS on DALI and on pil in-process (exit -7, nothing said), torch's traceback
    from a pil worker. Now every backend reads with pread and checks the shard's size and time."""
    split = tmp_path / "s"
    write_split(split, num_samples=64, samples_per_shard=32)
    script = tmp_path / "change.py"
    script.write_text(textwrap.dedent(_CHANGE))
    run = subprocess.run(
        [sys.executable, str(script), str(split), "1" if HAS_DALI else "0"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) == (6 if HAS_DALI else 4), run.stdout
    for line in lines:
        how, backend, threads, error, message = line.split(" ", 4)
        why = "left: truncated" if how == "truncate" else "rewritten: "
        assert error == "ShardChangedError", line
        assert message.startswith(f"{split / 'shard-00000'}") and why in message and " | " not in message, line
    assert issubclass(__import__("stoker.errors").errors.ShardChangedError, StokerError)
