"""Reading splits from object storage: a real S3-protocol server (moto's, on 127.0.0.1) and a
plain HTTP server; the local shard cache (verified, atomic, shared by processes, bounded); the
block shuffle's order, per-rank downloads, exactly-once val and exact resume."""

import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import write_split
from stoker.errors import CacheError, ManifestError, StorageError
from stoker.pipeline import Loader, order
from stoker.pipeline import cache as cache_mod
from stoker.tools.common.synth import CLASSES
from storage_servers import dead_endpoint, http_server, s3_server

KW = {"batch_size": 4, "crop": 24, "backend": "pil", "threads": 0}
UNIQUE = list(CLASSES) * 10  # labels are global positions


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        yield server


@pytest.fixture
def s3env(s3, monkeypatch):
    """The AWS variables pointing every client at the test server (the ecosystem's way)."""
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("STOKER_CACHE_DIR", "/nonexistent-use-cache_dir")
    return s3


def upload(server, split: Path, bucket: str, prefix: str) -> str:
    client = server.client()
    for f in sorted(split.iterdir()):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{f.name}", Body=f.read_bytes())
    return f"s3://{bucket}/{prefix}"


@pytest.fixture
def remote(tmp_path, s3env):
    """A 48-sample split (6 shards of 8, labels = positions) on disk and in a fresh bucket."""
    split = tmp_path / "local" / "train"
    write_split(split, num_samples=48, samples_per_shard=8, classes=UNIQUE)
    return split, upload(s3env, split, s3env.bucket(), "ds/train")


def epoch(loader, e):
    loader.set_epoch(e)
    images, labels = [], []
    for x, y in loader:
        images.append(x)
        labels.append(y)
    return torch.cat(images), torch.cat(labels).tolist()


def tars(names):
    return sorted(n for n in names if n.endswith(".tar"))


def test_s3_split_reads_exactly_like_the_local_copy(remote, tmp_path):
    split, url = remote
    for train in (True, False):
        local = Loader(split, train=train, seed=7, **KW)
        s3 = Loader(url, train=train, seed=7, cache_dir=tmp_path / "cache", **KW)
        for e in (0, 3):
            li, ll = epoch(local, e)
            si, sl = epoch(s3, e)
            assert sl == ll and len(sl) == 48
            assert torch.equal(si, li)  # same crops and flips of the same bytes
    assert s3.path == url and "s3://" in repr(s3)


def test_https_split_reads_like_the_local_copy(tmp_path):
    split = tmp_path / "data" / "val"
    write_split(split, num_samples=20, samples_per_shard=8, classes=UNIQUE)
    with http_server(tmp_path / "data") as base:
        got = Loader(f"{base}/val", train=False, cache_dir=tmp_path / "cache", **KW)
        assert epoch(got, 0)[1] == list(range(20))
    assert epoch(got, 1)[1] == list(range(20))  # served from the cache once fetched


def test_second_loader_fetches_no_shard(remote, tmp_path):
    split, url = remote
    first = Loader(url, cache_dir=tmp_path / "cache", **KW)
    epoch(first, 0)
    assert tars(first.cache.fetched) == [f"shard-{k:06d}.tar" for k in range(6)]
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("shard-*")}
    second = Loader(url, cache_dir=tmp_path / "cache", **KW)
    _, labels = epoch(second, 0)
    assert second.cache.fetched == ["stoker.json"]  # the manifest only: a repacked split is noticed
    assert second.cache.fetched_bytes == len((split / "stoker.json").read_bytes())
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("shard-*")} == mtimes
    assert sorted(labels) == list(range(48))


SHARED = textwrap.dedent("""
    import json, sys
    from stoker.pipeline import Loader
    loader = Loader(sys.argv[1], batch_size=4, crop=24, backend="pil", threads=0, cache_dir=sys.argv[2])
    labels = sorted(int(v) for _, y in loader for v in y)
    print(json.dumps({"fetched": loader.cache.fetched, "labels": labels}))
""")


@pytest.mark.slow  # two processes, each importing torch
def test_two_processes_sharing_a_cache_fetch_each_shard_once(remote, tmp_path):
    split, url = remote
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SHARED, url, str(tmp_path / "shared")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        for _ in range(2)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    fetched = [n for o in outs for n in tars(o["fetched"])]
    assert sorted(fetched) == [f"shard-{k:06d}.tar" for k in range(6)]  # every shard once, in all
    assert all(o["labels"] == list(range(48)) for o in outs)


def test_a_shard_whose_bytes_differ_from_the_manifest_is_refused(remote, s3env, tmp_path):
    split, url = remote
    bucket = url.split("/")[2]
    data = bytearray((split / "shard-000002.tar").read_bytes())
    data[1000] ^= 0xFF  # same size, other bytes
    s3env.client().put_object(Bucket=bucket, Key="ds/train/shard-000002.tar", Body=bytes(data))
    loader = Loader(url, cache_dir=tmp_path / "cache", **KW)
    with pytest.raises(CacheError) as e:
        epoch(loader, 0)
    msg = str(e.value)
    assert "\n" not in msg and f"shard shard-000002.tar at {url}/shard-000002.tar does not match" in msg
    assert "refused" in msg
    assert not (tmp_path / "cache" / "shard-000002.tar").exists()  # never renamed into place
    assert not list((tmp_path / "cache").glob("*.part"))
    assert loader.cache.fetched.count("shard-000002.tar") == cache_mod.ATTEMPTS  # fetched again first


def test_a_damaged_cached_shard_is_fetched_again_never_read(remote, tmp_path):
    split, url = remote
    epoch(Loader(url, cache_dir=tmp_path / "cache", **KW), 0)
    shard = tmp_path / "cache" / "shard-000004.tar"
    data = bytearray(shard.read_bytes())
    data[700] ^= 0xFF
    shard.write_bytes(bytes(data))  # damaged in place (same size, new mtime)
    (tmp_path / "cache" / "shard-000001.tar").write_bytes(b"partial")  # truncated
    again = Loader(url, cache_dir=tmp_path / "cache", **KW)
    li, ll = epoch(Loader(split, **KW), 2)
    si, sl = epoch(again, 2)
    assert tars(again.cache.fetched) == ["shard-000001.tar", "shard-000004.tar"]
    assert sl == ll and torch.equal(si, li)


def test_the_server_going_away_mid_epoch_is_one_line_naming_shard_and_url(tmp_path, monkeypatch):
    split = tmp_path / "local" / "train"
    write_split(split, num_samples=48, samples_per_shard=8, classes=UNIQUE)
    with s3_server() as server:  # a server of its own: this test stops it
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        url = upload(server, split, server.bucket(), "ds/train")
        loader = Loader(url, shuffle="block", block_shards=1, cache_dir=tmp_path / "cache", **KW)
        it = iter(loader)
        next(it)  # window 1 is here, window 2 is being fetched
        time.sleep(0.5)
    start = time.monotonic()
    with pytest.raises(CacheError) as e:
        for _ in it:
            pass
    assert time.monotonic() - start < 60  # bounded timeouts and attempts, never a hang
    msg = str(e.value)
    assert "\n" not in msg
    assert "cannot fetch shard shard-0000" in msg and f"from {url}/shard-0000" in msg


def test_an_unreachable_endpoint_or_a_missing_split_is_one_line(remote, tmp_path, monkeypatch):
    split, url = remote
    with pytest.raises(ManifestError, match=f"no stoker.json at {url}-missing"):
        Loader(url + "-missing", cache_dir=tmp_path / "c1", **KW)
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead_endpoint())
    with pytest.raises(StorageError, match=f"cannot reach the server of {url}/stoker.json"):
        Loader(url, cache_dir=tmp_path / "c2", **KW)
    with pytest.raises(ValueError, match="cache_dir= is for a URL"):
        Loader(split, cache_dir=tmp_path / "c3", **KW)


def test_a_full_cache_disk_is_one_line(remote, tmp_path, monkeypatch):
    split, url = remote
    loader = Loader(url, cache_dir=tmp_path / "cache", **KW)

    def full(f, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod, "_write", full)
    with pytest.raises(CacheError) as e:
        epoch(loader, 0)
    msg = str(e.value)
    assert "\n" not in msg and f"the shard cache {tmp_path / 'cache'} is full: cannot write shard-0000" in msg
    assert not list((tmp_path / "cache").glob("*.tar")) and not list((tmp_path / "cache").glob("*.part"))


# ---- block mode ----------------------------------------------------------------------------
def test_block_mode_each_rank_downloads_its_share(remote, tmp_path):
    split, url = remote
    total = sum(p.stat().st_size for p in split.glob("*.tar"))
    shard_bytes = max(p.stat().st_size for p in split.glob("*.tar"))
    for e in (0, 1):
        seen, steps = [], []
        for rank in range(2):
            loader = Loader(
                url,
                shuffle="block",
                block_shards=2,
                rank=rank,
                world_size=2,
                seed=1,
                cache_dir=tmp_path / f"node{rank}-epoch{e}",
                **KW,
            )
            _, labels = epoch(loader, e)
            fetched = sum((split / n).stat().st_size for n in tars(loader.cache.fetched))
            assert fetched <= total / 2 + shard_bytes  # its half, plus at most a boundary shard
            seen.append(labels)
            steps.append(len(loader))
        assert steps == [6, 6] and not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(48))  # 48 = 2 * 24: nothing left over
    val = []
    for rank in range(3):
        loader = Loader(
            url, train=False, shuffle="block", rank=rank, world_size=3, cache_dir=tmp_path / f"val{rank}", **KW
        )
        val += epoch(loader, 0)[1]
    assert sorted(val) == list(range(48)) and len(val) == 48  # val: each sample exactly once


def test_block_mode_resume_is_exact_and_the_cache_stays_bounded(remote, tmp_path):
    split, url = remote
    limit = 5 * max(p.stat().st_size for p in split.glob("*.tar"))  # 2 windows of 2 + one boundary

    def make(d):
        return Loader(
            url,
            shuffle="block",
            block_shards=2,
            seed=5,
            cache_dir=tmp_path / d,
            cache_limit=limit,
            **KW,
        )

    whole = make("a")
    full = epoch(whole, 3)[1]
    assert whole.cache.cached_bytes() <= limit
    assert sorted(full) == list(range(48))
    part = make("b")
    part.set_epoch(3)
    it = iter(part)
    head = []
    for _ in range(5):
        head += next(it)[1].tolist()
        assert part.cache.cached_bytes() <= limit
    state = part.state_dict()
    assert state == {
        "seed": 5,
        "epoch": 3,
        "position": 20,
        "world_size": 1,
        "num_samples": 48,
        "batch_size": 4,
        "shuffle": "block",
        "block_shards": 2,
    }
    resumed = make("b")
    resumed.load_state_dict(state)
    tail = [v for _, y in resumed for v in y.tolist()]
    assert head + tail == full
    with pytest.raises(
        ValueError, match="state was saved with shuffle='block', block_shards=2, this loader has shuffle='global'"
    ):
        Loader(split, **KW).load_state_dict(state)
    with pytest.raises(ValueError, match="cache_limit=1,000 is smaller than two windows of block_shards=2"):
        Loader(url, shuffle="block", block_shards=2, cache_dir=tmp_path / "c", cache_limit=1000, **KW)
    with pytest.raises(ValueError, match="which shuffle='global' keeps cached whole"):
        Loader(url, cache_dir=tmp_path / "c", cache_limit=limit, **KW)


def test_block_plan_is_a_pure_function_of_seed_epoch_rank_world():
    counts = [8, 8, 8, 8, 8, 3]  # a short last shard
    bounds = np.cumsum([0] + counts)
    for world in (1, 2, 3):
        plans = [
            order.block_plan(counts, seed=2, epoch=1, rank=r, world_size=world, train=True, block_shards=2)
            for r in range(world)
        ]
        got = [p[0] for p in plans]
        assert {len(g) for g in got} == {43 // world}  # equal steps
        assert len(np.unique(np.concatenate(got))) == 43 // world * world  # disjoint
        for idx, windows in plans:
            assert all(len(w) <= 2 for w in windows)
            pos = 0
            for w in windows:  # each window's samples come from its own shards only
                n = sum(min(counts[s], int(np.isin(idx, np.arange(bounds[s], bounds[s + 1])).sum())) for s in w)
                shard = np.searchsorted(bounds, idx[pos : pos + n], side="right") - 1
                assert set(shard.tolist()) <= set(w.tolist())
                pos += n
            assert pos == len(idx)
        again = order.block_plan(counts, seed=2, epoch=1, rank=0, world_size=world, train=True, block_shards=2)
        assert np.array_equal(again[0], got[0])
    other = order.block_plan(counts, seed=2, epoch=2, rank=0, world_size=1, train=True, block_shards=2)[0]
    assert not np.array_equal(
        other, order.block_plan(counts, seed=2, epoch=1, rank=0, world_size=1, train=True, block_shards=2)[0]
    )
    val = [
        order.block_plan(counts, seed=0, epoch=0, rank=r, world_size=4, train=False, block_shards=2)[0]
        for r in range(4)
    ]
    assert np.array_equal(np.concatenate(val), np.arange(43))  # stored order, each once, contiguous


# ---- stoker verify URL -----------------------------------------------------------------------
def test_verify_checks_a_pack_in_s3(tmp_path, s3env, monkeypatch, capsys):
    from stoker.tools.cli import main as cli

    root = tmp_path / "local"
    write_split(root / "train", num_samples=20, samples_per_shard=8, classes=UNIQUE)
    write_split(root / "val", num_samples=6, samples_per_shard=8, classes=UNIQUE)
    bucket = s3env.bucket()
    for name in ("train", "val"):
        upload(s3env, root / name, bucket, f"ds/{name}")
    # the endpoint as a --storage-option instead of AWS_ENDPOINT_URL
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    opt = f"--storage-option=endpoint_url={s3env.endpoint}"
    assert cli(["verify", f"s3://{bucket}/ds", "-q", "--workers", "1", opt]) == 0
    out = capsys.readouterr().out
    assert "train/shard-000002.tar" in out and "val/shard-000000.tar" in out and "ok: 4 shards, 26 samples" in out
    data = bytearray((root / "train" / "shard-000001.tar").read_bytes())
    data[5000] ^= 0x01
    s3env.client().put_object(Bucket=bucket, Key="ds/train/shard-000001.tar", Body=bytes(data))
    assert cli(["verify", f"s3://{bucket}/ds/train", "-q", "--workers", "1", opt]) == 1
    assert "train/shard-000001.tar: sha256 differs" in capsys.readouterr().err.splitlines()[-1]
    assert cli(["verify", f"s3://{bucket}/nothing", "-q", opt]) == 2
    assert f"s3://{bucket}/nothing does not exist" in capsys.readouterr().err
    assert cli(["verify", str(root), "-q", opt]) == 2
    assert "--storage-option is for a URL" in capsys.readouterr().err


def test_a_download_left_by_a_killed_process_is_removed(remote, tmp_path):
    split, url = remote
    cache = tmp_path / "cache"
    cache.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = cache / f".shard-000000.tar.{int(dead.stdout)}.140000.part"
    live = cache / f".shard-000001.tar.{os.getpid()}.140000.part"
    stale.write_bytes(b"half a shard")
    live.write_bytes(b"being written")
    loader = Loader(url, cache_dir=cache, **KW)
    assert not stale.exists() and live.exists()
    assert sorted(epoch(loader, 0)[1]) == list(range(48))


def test_read_manifest_of_a_url_or_a_path(remote, tmp_path):
    from stoker.pipeline.cache import read_manifest

    split, url = remote
    assert read_manifest(url) == read_manifest(split) and read_manifest(url).num_samples == 48
    val = url.rsplit("/", 1)[0] + "/val"
    with pytest.raises(ManifestError, match=f"no stoker.json at {val}: pack it"):
        read_manifest(val)


def test_stoker_train_on_s3_gives_the_weights_of_the_local_copy(tmp_path, s3env):
    import contextlib
    import io
    import json

    from stoker.tools.cli import main as cli

    root = tmp_path / "local"
    write_split(root / "train", num_samples=32, samples_per_shard=8)
    write_split(root / "val", num_samples=12, samples_per_shard=8, seed=1)
    bucket = s3env.bucket()
    upload(s3env, root / "train", bucket, "ds/train")
    url = upload(s3env, root / "val", bucket, "ds/val").rsplit("/", 1)[0]
    args = [
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--crop",
        "24",
        "--deterministic",
        "--no-progress",
        "--json",
        "--threads",
        "1",
        "--backend",
        "pil",
    ]

    def run(data, out, *extra):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert cli(["train", data, "--out", str(tmp_path / out), *args, *extra]) == 0
        return json.loads(buf.getvalue())

    local = run(str(root), "local-run")
    # credentials given as options are used, but never written into the run's config or checkpoints
    creds = ["--storage-option", "key=testing", "--storage-option", "secret=do-not-write-me"]
    remote = run(url, "s3-run", "--cache-dir", str(tmp_path / "cache"), *creds)
    assert remote["weights_sha256"] == local["weights_sha256"]
    config = json.loads((tmp_path / "s3-run" / "config.json").read_text())
    assert config["storage_options"] == {"key": "***", "secret": "***"}
    assert not [p.name for p in (tmp_path / "s3-run").iterdir() if b"do-not-write-me" in p.read_bytes()]
    assert remote["val_samples"] == local["val_samples"] == 12
    cached = sorted(str(p.relative_to(tmp_path / "cache")) for p in (tmp_path / "cache").rglob("*.tar"))
    assert cached == [f"train/shard-00000{i}.tar" for i in range(4)] + [f"val/shard-00000{i}.tar" for i in range(2)]


def test_bench_and_diagnose_take_a_url(remote, tmp_path, monkeypatch, fast_python):
    from stoker.tools.bench.loader import bench
    from stoker.tools.diagnose.inputs import resolve_data

    split, url = remote
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    kind, local = resolve_data(url.rsplit("/", 1)[0])  # the dataset root: its train/ is taken
    assert kind == "shards" and sorted(p.name for p in local.glob("*.tar")) == sorted(
        p.name for p in split.glob("*.tar")
    )
    assert all((local / p.name).read_bytes() == p.read_bytes() for p in split.glob("*.tar"))
    result = bench(url, only=["stoker-pil"], batch_size=8, crop=24, seconds=2, epochs=1, warmup=1, workers=1)
    assert result.data == str(local) and result.rows and result.rows[0].get("img_s", 0) > 0, result.rows


def test_a_mask_split_from_s3_in_block_mode_reads_like_the_local_copy(tmp_path, s3env):
    from stoker.tools.common.synth import make_segmentation_tree
    from stoker.tools.pack import Masks, Shards, pack

    images, masks = make_segmentation_tree(tmp_path / "src", n=12, seed=1, min_side=40, max_side=60)
    pack(images, tmp_path / "local", masks=Masks(masks, num_classes=4), shards=Shards(samples=3), workers=1)
    url = upload(s3env, tmp_path / "local" / "train", s3env.bucket(), "seg/train")
    kw = dict(KW, shuffle="block", block_shards=2, seed=3)
    local = Loader(tmp_path / "local" / "train", **kw)
    remote = Loader(url, cache_dir=tmp_path / "cache", cache_limit=10**8, **kw)
    for e in (0, 1):
        local.set_epoch(e)
        remote.set_epoch(e)
        for (a, ma), (b, mb) in zip(local, remote, strict=True):
            assert torch.equal(a, b) and torch.equal(ma, mb) and ma.shape == (len(a), 24, 24)
