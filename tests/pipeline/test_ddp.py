"""Two gloo processes under torchrun: val sees every sample exactly once, train slices are
disjoint, equal-sized and take the same number of steps."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import run_in_group, write_split
from stoker.pipeline.deps import HAS_DALI
from stoker.tools.common.synth import CLASSES

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from stoker.pipeline import Loader

    dist.init_process_group("gloo")
    split, out, backend = sys.argv[1], sys.argv[2], sys.argv[3]
    rank = dist.get_rank()
    result = {}
    for train in (True, False):
        loader = Loader(split, batch_size=4, train=train, crop=24, backend=backend, threads=1,
                        seed=3)  # rank/world_size come from torch.distributed
        loader.set_epoch(1)
        labels = [y.tolist() for _, y in loader]
        result["train" if train else "val"] = {"labels": labels, "len": len(loader),
                                               "world": loader.world_size}
    gathered = [None, None]
    dist.all_gather_object(gathered, result)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its (killed) parent to be reaped counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_run_in_group_kills_grandchildren_on_timeout(tmp_path):
    pid_file = tmp_path / "child.pid"
    # a parent that starts a long-lived child (like torchrun and a rank) and waits for it
    cmd = ["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"]
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_group(cmd, timeout=2)
    child = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is delivered asynchronously
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child)


@pytest.mark.slow
def test_torchrun_two_gloo_ranks(tmp_path, fast_launchers):
    split = tmp_path / "val"
    write_split(split, num_samples=23, samples_per_shard=8, classes=list(CLASSES) * 4)  # unique labels
    script = tmp_path / "ddp_check.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = run_in_group(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(split),
            str(out),
            "dali" if HAS_DALI else "pil",
        ],
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(out.read_text())
    val = [sorted(i for b in r["val"]["labels"] for i in b) for r in ranks]
    assert sorted(val[0] + val[1]) == list(range(23))  # exactly once, no padding
    assert [len(v) for v in val] == [12, 11]
    train = [[i for b in r["train"]["labels"] for i in b] for r in ranks]
    assert not set(train[0]) & set(train[1])
    assert len(train[0]) == len(train[1]) == 8  # 11 per rank, drop_last: 2 full batches of 4
    assert ranks[0]["train"]["len"] == ranks[1]["train"]["len"] == 2
    assert ranks[0]["train"]["world"] == 2
    assert all(len(b) == 4 for r in ranks for b in r["train"]["labels"])
