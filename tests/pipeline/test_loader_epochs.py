"""Epoch boundaries, resume states and the DataLoader-shaped surface of the Loader.

An epoch ends when its last batch is handed out, so loops bounded by ``len(loader)``
(Lightning, ``islice``, ``zip(range(n), loader)``) get full, fresh epochs every time.
"""

import itertools

import pytest
import torch

from helpers import write_split
from stoker.errors import LoaderError
from stoker.pipeline import Loader
from stoker.pipeline.deps import HAS_DALI
from stoker.tools.common.synth import CLASSES

BACKENDS = ["pil"] + (["dali"] if HAS_DALI else [])


@pytest.fixture
def split(tmp_path):
    """30 samples in 2 shards whose labels are their global positions (unique)."""
    path = tmp_path / "train"
    write_split(path, num_samples=30, samples_per_shard=16, classes=list(CLASSES) * 5)
    return path


def make(split, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("crop", 16)
    kw.setdefault("threads", 0 if kw.get("backend") == "pil" else 1)
    return Loader(split, **kw)


def labels_of(batches):
    return torch.cat([y for _, y in batches]).tolist() if batches else []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [True, False])
def test_loops_bounded_by_len_get_full_fresh_epochs(split, backend, train):
    loader = make(split, backend=backend, train=train)
    reference = make(split, backend=backend, train=train)
    n = len(loader)
    assert n == (3 if train else 4)
    for epoch in range(3):
        got = labels_of(list(itertools.islice(loader, n)))  # never asks for batch n + 1
        assert loader.epoch == epoch
        want = labels_of(list(iter_epoch(reference, epoch)))
        assert got == want and len(got) == (24 if train else 30)
        if train:
            assert got == loader.indices(epoch)[:24].tolist()  # labels are positions here
    if train:  # each epoch is its own permutation
        assert loader.indices(0).tolist() != loader.indices(1).tolist()


def iter_epoch(loader, epoch):
    loader.set_epoch(epoch)
    return iter(loader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zip_with_range_and_state_after_last_batch(split, backend):
    loader = make(split, backend=backend, seed=4)
    for _ in zip(range(len(loader)), loader):  # noqa: B905 - a zip that never asks for one more
        pass
    state = loader.state_dict()
    assert state == {
        "seed": 4,
        "epoch": 1,
        "position": 0,
        "world_size": 1,
        "num_samples": 30,
        "batch_size": 8,
        "permutation": 2,
    }
    resumed = make(split, backend=backend, seed=0)
    resumed.load_state_dict(state)
    got = labels_of(list(resumed))
    assert resumed.epoch == 1 and got == loader.indices(1)[:24].tolist()


def test_state_from_an_older_run_at_the_end_of_an_epoch_starts_the_next(split):
    loader = make(split, backend="pil", seed=2)
    loader.load_state_dict({"seed": 2, "epoch": 3, "position": 24})  # epoch 3 fully consumed
    got = labels_of(list(loader))
    assert loader.epoch == 4 and got == loader.indices(4)[:24].tolist()


def test_a_new_iteration_starts_the_epoch_over_train_and_val(split):
    train = make(split, backend="pil")
    for _ in train:  # a peek at one batch
        break
    train.set_epoch(0)
    whole = labels_of(list(train))  # the full epoch, not the rest of the peeked one
    assert whole == train.indices(0)[:24].tolist() and len(whole) == 8 * len(train)
    it = iter(train)  # (finished epoch: the next one) cut short after one batch ...
    next(it)
    assert train.state_dict()["position"] == 8  # ... the state still says where it stopped
    assert labels_of(list(train)) == train.indices(1)[:24].tolist() and train.epoch == 1
    val = make(split, backend="pil", train=False)
    sanity = labels_of(list(itertools.islice(val, 2)))  # e.g. Lightning's sanity check
    assert sanity == list(range(16))
    assert labels_of(list(val)) == list(range(30))  # a real evaluation sees every sample


def test_a_state_saved_after_a_loop_was_cut_short_resumes_there(split):
    train = make(split, backend="pil")
    it = iter(train)
    first = labels_of([next(it)])
    del it  # `break`, then save
    state = train.state_dict()
    train.load_state_dict(state)
    rest = labels_of(list(train))
    assert first + rest == train.indices(0)[:24].tolist()


def test_val_resumed_from_a_state_continues_once(split):
    val = make(split, backend="pil", train=False)
    val.load_state_dict({"seed": 0, "epoch": 0, "position": 16})
    assert labels_of(list(val)) == list(range(16, 30))
    assert labels_of(list(val)) == list(range(30))


def test_a_replaced_iterator_raises_instead_of_ending_quietly(split):
    loader = make(split, backend="pil")
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(LoaderError, match="replaced by a newer iter"):
        next(first)
    assert len(list(second)) == 3  # the newer iterator starts the epoch over


@pytest.mark.parametrize(
    "state, match",
    [
        ({"seed": 0, "epoch": -1, "position": 0}, r"state\['epoch'\]=-1"),
        ({"seed": 0, "epoch": 0, "position": -8}, r"state\['position'\]=-8"),
        ({"seed": 0, "epoch": 0, "position": 32}, "past the end"),
        ({"seed": "x", "epoch": 0, "position": 0}, r"state\['seed'\]='x'"),
        ({"seed": 0, "epoch": 1.5, "position": 0}, r"state\['epoch'\]=1.5"),
        ([0, 0, 0], "must be the dict"),
    ],
)
def test_bad_states_are_refused(split, state, match):
    loader = make(split, backend="pil")
    with pytest.raises(ValueError, match=match):
        loader.load_state_dict(state)
    assert loader.state_dict()["position"] == 0 and len(list(loader)) == 3  # unchanged


def test_settings_that_would_yield_nothing_are_refused(split):
    with pytest.raises(ValueError, match=r"batch_size=16 with drop_last=True leaves rank 1 no batch: its share is 15"):
        make(split, backend="pil", batch_size=16, world_size=2, rank=0)
    with pytest.raises(ValueError, match="world_size=40 is larger than the 30 loadable samples"):
        make(split, backend="pil", train=False, world_size=40, rank=0)
    with pytest.raises(ValueError, match="batch_size=31 with drop_last=True"):
        make(split, backend="pil", batch_size=31)
    assert len(make(split, backend="pil", batch_size=31, drop_last=False)) == 1


@pytest.mark.parametrize(
    "kwarg, hint",
    [
        ({"num_workers": 4}, "takes threads=N"),
        ({"shuffle": True}, "takes train=True"),
        ({"pin_memory": True}, "takes device='cuda'"),
    ],
)
def test_dataloader_habits_get_a_one_line_hint(split, kwarg, hint):
    with pytest.raises(ValueError, match=f"is a torch DataLoader argument: stoker's Loader {hint}"):
        make(split, backend="pil", **kwarg)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        make(split, backend="pil", bogus=1)


def test_dataloader_surface_is_backed_by_the_real_loader(split):
    loader = make(split, backend="pil", world_size=2, rank=1, seed=7)
    assert len(loader.dataset) == 30 and loader.dataset.classes == list(CLASSES) * 5
    assert loader.dataset.class_to_idx[loader.dataset.classes[-1]] == 29
    with pytest.raises(TypeError, match="decodes whole batches"):
        loader.dataset[0]
    assert loader.batch_size == 8 and loader.drop_last
    loader.sampler.set_epoch(3)  # what DDP scripts and Lightning call each epoch
    assert loader.epoch == 3 and loader.sampler.epoch == 3
    assert len(loader.sampler) == 15 and list(loader.sampler) == loader.indices(3).tolist()
    batches = list(loader.batch_sampler)
    assert len(loader.batch_sampler) == len(loader) == len(batches) == 1
    assert batches[0] == labels_of(list(loader))  # labels are positions: the same samples
    loader.batch_sampler.set_epoch(4)
    assert loader.epoch == 4


def test_close_and_context_manager(split):
    with make(split, backend="pil") as loader:
        it = iter(loader)
        next(it)
    with pytest.raises(LoaderError):
        next(it)
    with pytest.raises(ValueError, match="was closed"):
        iter(loader)
