"""`stoker pack` past one machine: OUT in object storage (a real moto S3 server on 127.0.0.1)
and the Ray engine (a local Ray with 2 CPUs), each byte-identical to a local pack."""

import functools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker.pipeline.storage import (
    MissingExtraError,
    StorageError,
    Store,
    is_url,
    parse_storage_options,
)
from stoker.tools.cli import main as cli
from stoker.tools.common.synth import make_image_folder
from stoker.tools.pack import ray_engine
from stoker.tools.pack.sources import scan
from storage_servers import dead_endpoint

CLASSES = ("circles", "rings", "squares")
SHARD = ["--samples-per-shard", "3", "--val-fraction", "0.25"]  # two splits: train/ and val/


def folder(root: Path, **kw) -> Path:
    kw = {"classes": CLASSES, "per_class": 4, "min_side": 32, "max_side": 80, **kw}
    return make_image_folder(root, **kw)


def pack(*argv) -> int:
    return cli(["pack", *map(str, argv), "-q"] + ([] if "--workers" in argv else ["--workers", "1"]))


def local_tree(out: Path) -> dict[str, bytes]:
    """What a reader of a local pack sees: every file but the packer's own .stoker-pack/ state and
    the splits' sample tables (stoker.index: a local split's; a URL's readers build theirs)."""
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and ".stoker-pack" not in p.relative_to(out).parts and p.name != "stoker.index"
    }


def remote_tree(s3, bucket: str, prefix: str = "ds") -> dict[str, bytes]:
    return {k[len(prefix) + 1 :]: v for k, v in s3.objects(bucket, prefix + "/").items()}


@pytest.fixture
def src_and_local(tmp_path):
    """A class folder with rejects in it, and its local pack (the reference)."""
    src = folder(tmp_path / "src", nasty=True)
    assert pack(src, tmp_path / "local", *SHARD) == 0
    return src, local_tree(tmp_path / "local")


def test_pack_to_s3_is_byte_identical_to_local_and_reruns_are_up_to_date(tmp_path, s3, src_and_local, capsys):
    src, local = src_and_local
    bucket = s3.bucket()
    url = f"s3://{bucket}/ds"
    stage = tmp_path / "stage"
    assert pack(src, url, *SHARD, "--staging", stage) == 0
    assert f"listed in {url}/rejects.jsonl" in capsys.readouterr().out
    assert remote_tree(s3, bucket) == local and len([k for k in local if k.endswith(".tar")]) == 8
    assert not list(stage.rglob("*.tar")) and not list(stage.rglob("*.idx"))  # staged shards left once uploaded
    assert pack(src, url, *SHARD, "--staging", stage) == 0
    assert "is up to date" in capsys.readouterr().out
    # a shard deleted from the bucket (and no longer staged) is rebuilt and uploaded again
    s3.client().delete_object(Bucket=bucket, Key="ds/train/train-000004.tar")
    assert pack(src, url, *SHARD, "--staging", stage) == 0
    assert "restored 1" in capsys.readouterr().err
    assert remote_tree(s3, bucket) == local
    # the default staging folder (under STOKER_CACHE_DIR) works the same
    assert pack(src, f"s3://{bucket}/other", *SHARD) == 0
    assert remote_tree(s3, bucket, "other") == local
    assert list((tmp_path / "stoker-cache" / "pack-staging").iterdir())


def test_file_url_is_byte_identical_to_local(tmp_path, src_and_local):
    src, local = src_and_local
    assert pack(src, (tmp_path / "out").as_uri(), *SHARD, "--staging", tmp_path / "stage") == 0
    assert local_tree(tmp_path / "out") == local
    assert not list((tmp_path / "out").rglob("*.tmp-*"))


# `stoker pack` whose upload of one object blocks (forever): a deterministic point to kill -9 at.
_BLOCKING_UPLOAD = """
import sys, time
from stoker.pipeline.storage import Store
real = Store.put_file
def put_file(self, local, rel):
    if rel.endswith(sys.argv[1]):
        open(sys.argv[1] + ".blocked", "w").close()  # tells the test where this packer is
        time.sleep(3600)
    return real(self, local, rel)
Store.put_file = put_file
from stoker.tools.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_kill_9_mid_upload_then_rerun_uploads_only_the_rest(tmp_path, s3, src_and_local, monkeypatch):
    src, local = src_and_local
    bucket = s3.bucket()
    url, stage = f"s3://{bucket}/ds", tmp_path / "stage"
    argv = ["pack", str(src), url, *SHARD, "--staging", str(stage), "--workers", "1", "-q"]
    script = tmp_path / "blocking_upload.py"
    script.write_text(_BLOCKING_UPLOAD)
    proc = subprocess.Popen(
        [sys.executable, str(script), "train-000002.tar", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    blocked = tmp_path / "train-000002.tar.blocked"
    deadline = time.monotonic() + 60
    while not blocked.exists():  # the packer is inside the upload of shard 2, its index already up
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "packer did not reach the blocking upload"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    names = set(remote_tree(s3, bucket))
    assert {"train/train-000000.tar", "train/train-000001.tar"} <= names
    assert "train/train-000002.tar" not in names and "train/stoker.json" not in names  # never looks finished
    assert (stage / "train" / "train-000002.tar").exists()  # journaled, staged, not yet up
    uploaded = []
    real = Store.put_file
    monkeypatch.setattr(Store, "put_file", lambda self, lp, rel: (uploaded.append(rel), real(self, lp, rel))[1])
    assert cli(argv) == 0
    assert "train/train-000002.tar" in uploaded
    assert uploaded[-3:] == ["rejects.jsonl", "train/stoker.json", "val/stoker.json"]  # the manifests last
    assert not {"train/train-000000.tar", "train/train-000001.tar", "train/train-000000.idx"} & set(uploaded)
    assert remote_tree(s3, bucket) == local


def test_upload_failing_midway_is_one_line_and_rerun_finishes(tmp_path, s3, src_and_local, monkeypatch, capsys):
    from stoker.pipeline.storage import storage_errors

    src, local = src_and_local
    bucket = s3.bucket()
    real = Store.put_file
    calls = []

    def flaky(self, path, rel):  # the server goes away after four uploads
        calls.append(rel)
        if len(calls) > 4:
            with storage_errors(self.url_of(rel)):
                raise ConnectionRefusedError(111, "Connection refused")
        return real(self, path, rel)

    monkeypatch.setattr(Store, "put_file", flaky)
    assert pack(src, f"s3://{bucket}/ds", *SHARD) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"cannot reach the server of s3://{bucket}/ds/train/train-000002.idx" in err
    assert set(remote_tree(s3, bucket)) == {f"train/train-00000{i}.{e}" for i in (0, 1) for e in ("idx", "tar")}
    monkeypatch.setattr(Store, "put_file", real)
    assert pack(src, f"s3://{bucket}/ds", *SHARD) == 0
    assert remote_tree(s3, bucket) == local


def test_unreachable_server_is_one_line_and_fast(tmp_path, s3, monkeypatch, capsys):
    src = folder(tmp_path / "src", per_class=1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead_endpoint())
    t0 = time.monotonic()
    assert pack(src, "s3://bucket/ds") == 1
    err = capsys.readouterr().err.strip()
    assert time.monotonic() - t0 < 30
    assert len(err.splitlines()) == 1 and "cannot reach the server of s3://bucket/ds" in err, err
    assert not (tmp_path / "stoker-cache").exists()  # refused before any work


def test_bad_targets_are_one_line_errors(tmp_path, s3, capsys):
    src = folder(tmp_path / "src", per_class=1)
    bucket = s3.bucket()
    s3.client().put_object(Bucket=bucket, Key="ds/notes.txt", Body=b"someone else's")
    cases = {
        "the bucket nobucket-x does not exist": (1, ["s3://nobucket-x/ds"]),
        "is not empty and this machine holds no pack journal": (2, [f"s3://{bucket}/ds"]),
        "--part with a URL OUT is not supported": (2, [f"s3://{bucket}/new", "--part", "0/2"]),
        "should be KEY=VALUE": (2, [f"s3://{bucket}/new", "--storage-option", "novalue"]),
        "are for a URL OUT": (2, [tmp_path / "out", "--staging", tmp_path / "st"]),
        "--staging": (2, [f"s3://{bucket}/new", "--staging", src / "circles" / "stage"]),
    }
    for expect, (code, argv) in cases.items():
        assert pack(src, *argv) == code, expect
        err = capsys.readouterr().err.strip()
        assert expect in err and len(err.splitlines()) == 1 and "Traceback" not in err, (expect, err)
    assert s3.objects(bucket, "ds/") == {"ds/notes.txt": b"someone else's"}  # nothing written over


def test_missing_extras_name_the_pip_extra(tmp_path, monkeypatch, capsys):
    import fsspec  # noqa: F401 - loads fsspec.registry

    with pytest.raises(MissingExtraError, match=r"pip install stoker\[gcs\]$"):  # gcsfs is not a test dependency
        Store("gs://bucket/ds")
    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if not installed
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "s3", raising=False)  # the imported class
    src = folder(tmp_path / "src", per_class=1)
    assert pack(src, "s3://bucket/ds") == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("needs s3fs, which is not installed: pip install stoker[s3]") and len(err.splitlines()) == 1
    monkeypatch.setitem(sys.modules, "ray", None)
    assert pack(src, tmp_path / "out", "--engine", "ray") == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--engine ray needs Ray, which is not installed: pip install stoker[ray]"), err


def test_storage_options_and_urls(s3):
    assert parse_storage_options(
        [
            "anon=true",
            "endpoint_url=http://h:9000",
            "config_kwargs.read_timeout=30",
            'config_kwargs.retries={"max_attempts": 2}',
        ]
    ) == {
        "anon": True,
        "endpoint_url": "http://h:9000",
        "config_kwargs": {"read_timeout": 30, "retries": {"max_attempts": 2}},
    }
    assert [is_url(p) for p in ("s3://b/k", "file:///x", "gs://b", "/data/x", "C:\\data", "rel/x")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    with pytest.raises(StorageError, match=r"^cannot open nosuch://x/y: Protocol not known"):
        Store("nosuch://x/y")
    with pytest.raises(StorageError, match=r"^s3://b/ds: TypeError: .*no_such_option"):
        Store("s3://b/ds", {"no_such_option": 1}).check()


def test_http_server_serves_what_store_reads(tmp_path):
    from storage_servers import http_server

    (tmp_path / "ds" / "train").mkdir(parents=True)
    (tmp_path / "ds" / "train" / "stoker.json").write_bytes(b'{"format": 1}')
    with http_server(tmp_path) as base:
        store = Store(f"{base}/ds")
        assert store.read_bytes("train/stoker.json") == b'{"format": 1}'
        assert store.read_bytes("train/missing.json") is None
        store.get_file("train/stoker.json", tmp_path / "copy.json")
    assert (tmp_path / "copy.json").read_bytes() == b'{"format": 1}' and len(list(tmp_path.iterdir())) == 2


def test_unreachable_ray_cluster_is_one_line_and_fast(tmp_path, capsys):
    pytest.importorskip("ray")
    src = folder(tmp_path / "src", per_class=1)
    t0 = time.monotonic()
    assert pack(src, tmp_path / "out", "--engine", "ray", "--ray-address", dead_endpoint().replace("http", "ray")) == 1
    err = capsys.readouterr().err.strip()
    assert time.monotonic() - t0 < 20
    assert len(err.splitlines()) == 1 and "cannot reach the Ray cluster at ray://127.0.0.1:" in err, err
    assert pack(src, tmp_path / "out", "--ray-address", "auto") == 2
    assert "--ray-address needs --engine ray" in capsys.readouterr().err


# --- the Ray engine: one local Ray (2 CPUs) for the module ---


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, object_store_memory=100 * 1024**2, include_dashboard=False, logging_level=logging.WARNING)
    # the test's task functions travel by value (the workers cannot import this module)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    ray.shutdown()


def _crash_once(job, settings, *, marker):
    """sanitize_item, but the first call anywhere kills its worker process (a lost node)."""
    from stoker.tools.pack.sources import sanitize_item

    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return sanitize_item(job, settings)
    os._exit(1)


def _fail_on(job, settings, *, bad):
    from stoker.tools.pack.sources import sanitize_item

    if job.where.endswith(bad):
        raise RuntimeError("simulated failure")
    return sanitize_item(job, settings)


def test_ray_engine_to_s3_is_byte_identical_to_local(tmp_path, s3, src_and_local, local_ray):
    src, local = src_and_local
    bucket = s3.bucket()
    assert pack(src, f"s3://{bucket}/ds", *SHARD, "--engine", "ray") == 0
    assert remote_tree(s3, bucket) == local
    assert pack(src, tmp_path / "ray-local", *SHARD, "--engine", "ray") == 0
    assert local_tree(tmp_path / "ray-local") == local


def test_ray_task_whose_worker_dies_is_retried(tmp_path, src_and_local, local_ray, monkeypatch):
    src, local = src_and_local
    marker = tmp_path / "crashed"
    monkeypatch.setattr(ray_engine, "sanitize_item", functools.partial(_crash_once, marker=str(marker)))
    assert pack(src, tmp_path / "out", *SHARD, "--engine", "ray") == 0
    assert marker.exists()  # a worker did die
    assert local_tree(tmp_path / "out") == local


def test_ray_job_failing_midway_resumes_on_rerun(tmp_path, src_and_local, local_ray, monkeypatch, capsys):
    src, local = src_and_local
    rels = [it.rel for it in scan(src, seed=0, val_fraction=0.25).splits["train"]]
    bad = rels[len(rels) - 2]  # late in the list: earlier shards are finished first
    monkeypatch.setattr(ray_engine, "CHUNK", 2)
    monkeypatch.setattr(ray_engine, "sanitize_item", functools.partial(_fail_on, bad=bad))
    out = tmp_path / "out"
    assert pack(src, out, *SHARD, "--engine", "ray") == 1
    err = capsys.readouterr().err.strip()
    assert f"a Ray task packing {src / bad} failed: RuntimeError: simulated failure; rerun" in err
    assert len(err.splitlines()) == 1 and not (out / "train" / "stoker.json").exists()
    done = json.loads((out / ".stoker-pack" / "train-p0of1.jsonl").read_text().splitlines()[-1])
    assert done["shard"] and "done" not in done  # shards were journaled before the failure
    monkeypatch.undo()
    assert pack(src, out, *SHARD, "--engine", "ray") == 0
    assert local_tree(out) == local
