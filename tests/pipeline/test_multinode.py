"""Two nodes simulated on one machine: two ``torchrun --nnodes 2 --node-rank {0,1}`` launches
(rendezvous on 127.0.0.1, gloo), each with its own shard cache, read one ``s3://`` split from
a moto server: val is seen exactly once across the ranks, train slices are disjoint and take
equal steps, and in block mode each node downloads only its share."""

import json
import os
import socket
import sys
import textwrap
import threading

import pytest

from helpers import run_in_group, write_split
from stoker.tools.common.synth import CLASSES
from storage_servers import s3_server

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as dist
    from stoker.pipeline import Loader

    dist.init_process_group("gloo")
    url, cache_root, out = sys.argv[1], sys.argv[2], sys.argv[3]
    node = int(os.environ["GROUP_RANK"])
    result = {"rank": dist.get_rank(), "world": dist.get_world_size(), "node": node}
    for name, kw in (("train", {"train": True}), ("val", {"train": False}),
                     ("block", {"train": True, "shuffle": "block", "block_shards": 2})):
        loader = Loader(url, batch_size=4, crop=24, backend="pil", threads=0, seed=3,
                        cache_dir=os.path.join(cache_root, f"node{node}-{name}"), **kw)
        loader.set_epoch(1)
        labels = [int(v) for _, y in loader for v in y]
        result[name] = {"labels": labels, "len": len(loader),
                        "fetched": sorted(n for n in loader.cache.fetched if n.endswith(".tar"))}
    dist.barrier()
    with open(f"{out}.{dist.get_rank()}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(script, args, env, port):
    """Launch the two simulated nodes at once and wait for both."""
    procs = [None, None]

    def launch(node: int) -> None:
        procs[node] = run_in_group(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                str(script),
                *args,
            ],
            timeout=240,
            env=env,
        )

    threads = [threading.Thread(target=launch, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]


TRAIN_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from stoker.model.train import train
    url, cache_root, out = sys.argv[1], sys.argv[2], sys.argv[3]
    node = os.environ["GROUP_RANK"]
    s = train(dict(data=url, out=f"{out}/node{node}", epochs=1, batch_size=4, crop=16, progress=False,
                   threads=1, backend="pil", cache_dir=f"{cache_root}/node{node}"))
    with open(f"{out}/rank{os.environ['RANK']}.json", "w") as f:
        json.dump(s, f)
""")


@pytest.mark.slow
def test_stoker_train_on_two_nodes_from_s3(tmp_path, fast_launchers):
    """`stoker train` on two simulated nodes, each with its own cache, reading one s3:// dataset:
    identical weights on both ranks, val counted once over the ranks."""
    root = tmp_path / "local"
    write_split(root / "train", num_samples=37, samples_per_shard=8)
    write_split(root / "val", num_samples=19, samples_per_shard=8, seed=1)
    script = tmp_path / "train_two_nodes.py"
    script.write_text(TRAIN_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    with s3_server() as s3:
        bucket = s3.bucket()
        for split in ("train", "val"):
            for f in (root / split).iterdir():
                s3.client().put_object(Bucket=bucket, Key=f"ds/{split}/{f.name}", Body=f.read_bytes())
        env = {**os.environ, **s3.env, "OMP_NUM_THREADS": "1"}
        _two_nodes(script, [f"s3://{bucket}/ds", str(tmp_path / "cache"), str(out)], env, _free_port())
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["weights_sha256"] == r1["weights_sha256"]
    assert r0["steps"] == 4 and r0["val_samples"] == r1["val_samples"] == 19  # 18 per rank / 4; val once
    for node in (0, 1):  # each node fetched the whole dataset into its own cache
        assert len(list((tmp_path / "cache" / f"node{node}").rglob("*.tar"))) == 5 + 3


@pytest.mark.slow
def test_two_nodes_read_one_s3_split(tmp_path, fast_launchers):
    split = tmp_path / "local" / "train"
    write_split(split, num_samples=46, samples_per_shard=6, classes=list(CLASSES) * 8)  # unique labels
    script = tmp_path / "multinode.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out.json"
    port = _free_port()
    with s3_server() as s3:
        bucket = s3.bucket()
        for f in split.iterdir():
            s3.client().put_object(Bucket=bucket, Key=f"ds/train/{f.name}", Body=f.read_bytes())
        url = f"s3://{bucket}/ds/train"
        env = {**os.environ, **s3.env, "OMP_NUM_THREADS": "1"}
        _two_nodes(script, [url, str(tmp_path / "cache"), str(out)], env, port)
    results = sorted((json.loads((tmp_path / f"out.json.{r}").read_text()) for r in (0, 1)), key=lambda r: r["rank"])
    assert [(r["rank"], r["world"]) for r in results] == [(0, 2), (1, 2)]
    assert {r["node"] for r in results} == {0, 1}
    val = [v for r in results for v in r["val"]["labels"]]
    assert sorted(val) == list(range(46))  # every val sample exactly once across the nodes
    for mode in ("train", "block"):
        a, b = (r[mode]["labels"] for r in results)
        assert len(a) == len(b) == 20 and results[0][mode]["len"] == results[1][mode]["len"] == 5
        assert not set(a) & set(b)  # disjoint slices
    # global mode: each node caches the whole split; block mode: each only its share (8 shards,
    # 23 samples a node: 4 shards, plus at most the one shared at the boundary)
    assert all(len(r["train"]["fetched"]) == 8 for r in results)
    block = [set(r["block"]["fetched"]) for r in results]
    assert all(len(f) <= 5 for f in block) and len(block[0] & block[1]) <= 1
