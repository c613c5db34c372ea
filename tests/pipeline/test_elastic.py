"""Resume on another number of ranks: a Loader state saved by rank 0 of W ranks continues the same
epoch on W' ranks, every sample not yet handed out exactly once, none handed out again (simulated
ranks for W, W' in 1..4, and real torchrun for 2 -> 1 and 1 -> 2)."""

import itertools
import json
import os
import sys
import textwrap

import pytest

from helpers import run_in_group, write_split
from stoker.pipeline import Loader
from stoker.pipeline.order import epoch_permutation
from stoker.tools.common.synth import CLASSES

N, GLOBAL, EPOCH, STEPS = 60, 12, 2, 2  # samples; global batch (divides 1..4 ranks); epoch; steps before the cut


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    path = tmp_path_factory.mktemp("elastic") / "train"
    write_split(path, num_samples=N, samples_per_shard=16, classes=list(CLASSES) * 10)  # label = position
    return path


def _loader(split, rank, world, batch, **kw):
    return Loader(split, batch_size=batch, rank=rank, world_size=world, crop=16, backend="pil", threads=0, seed=9, **kw)


def _run(loaders, steps=None):
    """The labels each loader hands out (at most ``steps`` batches each); the iterators stay open."""
    out = []
    for ld in loaders:
        it = iter(ld)
        out.append([v for _, y in (itertools.islice(it, steps) if steps else it) for v in y.tolist()])
    return out


@pytest.mark.parametrize(("old", "new"), [(w, v) for w in (1, 2, 3, 4) for v in (1, 2, 3, 4) if w != v])
def test_every_unseen_sample_is_seen_once_on_the_new_ranks(split, old, new):
    cut = [_loader(split, r, old, GLOBAL // old) for r in range(old)]
    for ld in cut:
        ld.set_epoch(EPOCH)
    seen = _run(cut, STEPS)
    state = cut[0].state_dict()  # what stoker train and every framework save: rank 0's
    resumed = [_loader(split, r, new, GLOBAL // new) for r in range(new)]
    for ld in resumed:
        ld.load_state_dict(state)
    assert [len(ld) for ld in resumed] == [N // GLOBAL - STEPS] * new  # the global batch kept: the steps too
    rest = _run(resumed)
    flat_seen, flat_rest = [v for s in seen for v in s], [v for s in rest for v in s]
    assert len(set(flat_rest)) == len(flat_rest) and not set(flat_seen) & set(flat_rest)
    perm = epoch_permutation(N, 9, EPOCH).tolist()
    # what the cut ranks handed out, then the rest: the epoch's sequence, in its order, to its end
    assert sorted(flat_seen) == sorted(perm[: old * STEPS * (GLOBAL // old)])
    assert sorted(flat_seen + flat_rest) == sorted(perm[: GLOBAL * (N // GLOBAL)])
    # the next epoch is a whole one on the new ranks
    nxt = _run(resumed)
    assert sorted(v for s in nxt for v in s) == sorted(epoch_permutation(N, 9, EPOCH + 1)[: GLOBAL * (N // GLOBAL)])


def test_two_resumes_in_a_row_compose(split):
    a = [_loader(split, r, 4, 3) for r in range(4)]
    for ld in a:
        ld.set_epoch(EPOCH)
    first = _run(a, 1)
    b = [_loader(split, r, 3, 4) for r in range(3)]
    for ld in b:
        ld.load_state_dict(a[0].state_dict())
    second = _run(b, 2)
    state = b[0].state_dict()
    assert state["offset"] == 12 and state["world_size"] == 3 and state["position"] == 8
    c = [_loader(split, r, 2, 6) for r in range(2)]
    for ld in c:
        ld.load_state_dict(state)
    third = _run(c)
    flat = [v for part in (first, second, third) for s in part for v in s]
    assert len(flat) == len(set(flat)) == N and sorted(flat) == list(range(N))


def test_an_odd_new_batch_still_never_repeats_a_sample(split):
    cut = [_loader(split, r, 2, 5) for r in range(2)]
    for ld in cut:
        ld.set_epoch(1)
    seen = [v for s in _run(cut, 3) for v in s]
    resumed = [_loader(split, r, 3, 4) for r in range(3)]
    for ld in resumed:
        ld.load_state_dict(cut[0].state_dict())
    rest = [v for s in _run(resumed) for v in s]
    assert len(set(rest)) == len(rest) and not set(seen) & set(rest)
    # 30 left, 10 a rank, batches of 4: each rank's last 2 dropped (drop_last, as every train epoch)
    assert len(rest) == 3 * 8


def test_val_from_another_world_restarts_its_evaluation_and_block_mode_refuses(split):
    val = [_loader(split, r, 2, 8, train=False) for r in range(2)]
    _run(val, 1)
    again = _loader(split, 0, 1, 8, train=False)
    again.load_state_dict(val[0].state_dict())
    assert sorted(_run([again])[0]) == list(range(N))
    block = _loader(split, 0, 2, 6, shuffle="block", block_shards=2)
    state = block.state_dict()
    with pytest.raises(ValueError, match="shuffle='block' resumes on the same number of ranks only"):
        _loader(split, 0, 1, 6, shuffle="block", block_shards=2).load_state_dict(state)


SCRIPT = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from stoker.pipeline import Loader

    dist.init_process_group("gloo")
    split, out, batch, steps, state_in = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    loader = Loader(split, batch_size=batch, crop=16, backend="pil", threads=0, seed=9)
    loader.set_epoch(2)
    if state_in != "-":
        loader.load_state_dict(json.load(open(state_in)))
    labels = []
    for k, (_, y) in enumerate(loader):
        labels += y.tolist()
        if steps and k + 1 == steps:
            break
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"labels": labels, "state": loader.state_dict()})
    if dist.get_rank() == 0:
        json.dump(gathered, open(out, "w"))
    dist.destroy_process_group()
""")


def _torchrun(tmp_path, split, nproc, batch, steps, state_in, name):
    script = tmp_path / "elastic.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    cmd += [str(script), str(split), str(out), str(batch), str(steps), str(state_in)]
    proc = run_in_group(cmd, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2)])
def test_real_torchrun_resumes_on_another_process_count(tmp_path, split, old, new, fast_launchers):
    first = _torchrun(tmp_path, split, old, GLOBAL // old, STEPS, "-", "cut")
    state = tmp_path / "state.json"
    state.write_text(json.dumps(first[0]["state"]))  # rank 0's, as a checkpoint holds it
    rest = _torchrun(tmp_path, split, new, GLOBAL // new, 0, state, "rest")
    seen = [v for r in first for v in r["labels"]]
    after = [v for r in rest for v in r["labels"]]
    assert len(set(after)) == len(after) and not set(seen) & set(after)
    assert sorted(seen + after) == sorted(epoch_permutation(N, 9, 2)[: GLOBAL * (N // GLOBAL)].tolist())
