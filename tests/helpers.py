"""Helpers shared by the tests of every room (imported as ``from helpers import ...``)."""

import json
import os
import random
import signal
import subprocess
from pathlib import Path

from stoker.pipeline.shards.manifest import Manifest
from stoker.pipeline.shards.writer import ShardWriter
from stoker.tools.common.synth import CLASSES, draw, encode


def write_split(
    split_dir: Path,
    *,
    num_samples: int,
    samples_per_shard: int,
    seed: int = 0,
    classes=CLASSES,
    min_side: int = 40,
    max_side: int = 96,
) -> Manifest:
    """Write tiny procedural shards + manifest directly (no packer): a test fixture.

    Sample ``i`` (global position) has label ``i % len(classes)`` and key ``f"{i:09d}"``.
    """
    split_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    shards = []
    for start in range(0, num_samples, samples_per_shard):
        with ShardWriter(split_dir / f"shard-{start // samples_per_shard:06d}.tar") as w:
            for i in range(start, min(start + samples_per_shard, num_samples)):
                label = i % len(classes)
                size = (rng.randint(min_side, max_side), rng.randint(min_side, max_side))
                meta = {
                    "path": f"{classes[label]}/{i}.jpg",
                    "width": size[0],
                    "height": size[1],
                    "class": classes[label],
                }
                image = encode(draw(classes[label], size, rng), quality=90)
                w.write(f"{i:09d}", {"jpg": image, "cls": str(label).encode(), "json": json.dumps(meta).encode()})
        shards.append(w.info)
    m = Manifest(num_samples=num_samples, classes=list(classes), shards=shards, pack={"fixture": True})
    m.save(split_dir)
    return m


def run_in_group(cmd, *, timeout, env=None):
    """``subprocess.run`` for a launcher with children (torchrun and its ranks): it runs in its
    own process group, killed as a whole on timeout or failure, so no rank outlives the test."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the ranks too, even when torchrun is gone
        except ProcessLookupError:
            pass
        proc.communicate()


def run_epoch(loader, epoch=None):
    """``(images, labels)`` lists of one pass over ``loader`` (after ``set_epoch(epoch)`` if given)."""
    if epoch is not None:
        loader.set_epoch(epoch)
    images, labels = [], []
    for x, y in loader:
        images.append(x)
        labels.append(y)
    return images, labels


# Work for stoker's worker processes in tests (a module they can import by name).
def square(x: int) -> int:
    return x * x


def buggy(x: int) -> int:
    """A bug in the work itself: raises TypeError on 3."""
    return x * x if x != 3 else x + "3"


def block_on(x: int, target: int, pidfile: str) -> int:
    """``x * x``, except that ``target`` writes its worker's pid to ``pidfile`` and blocks."""
    if x == target:
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pidfile + ".tmp", pidfile)
        import time

        time.sleep(3600)
    return x * x


def run_cli(*argv) -> tuple[int, str, str]:
    """``stoker ARGV`` in this process: ``(exit status, stdout, stderr)``."""
    import contextlib
    import io

    from stoker.tools.cli import main as cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()
