"""Sampling policies in the one registry (pipeline/policies.py): the built-in ones by role, and a
policy made in this file, registered once, read through the Loader (its order, its batches, its
resume state) with nothing else touched."""

import numpy as np
import pytest

from helpers import write_split
from stoker.errors import ArgumentError
from stoker.pipeline import Loader
from stoker.pipeline.order import SampleOrder, samples_per_rank
from stoker.pipeline.policies import POLICIES, SamplingPolicy, policy_names, register_policy


class StoredOrder(SampleOrder):
    """Train in the stored order, the ranks taking turns (a policy a user might want for a curriculum)."""

    name = "stored"

    def share(self, rank=None, offset=0):
        rank = self.rank if rank is None else rank
        return samples_per_rank(self.num_samples, rank=rank, world_size=self.world_size, train=True, offset=offset)

    def positions(self, seed, epoch, offset=0, start=0, stop=None):
        return offset + self.rank_draws(offset, start, stop)

    def rank_position(self, seed, epoch, offset, position):
        return (position - offset - self.rank) // self.world_size

    def state_fields(self):
        return self.mode()  # {"shuffle": "stored"}: a state of another order is not read by this one


class Stored(SamplingPolicy):
    name = "stored"

    def order(self, source, options, **kw):
        return StoredOrder(source.index.valid_counts(), **kw)


@pytest.fixture
def registered():
    saved = POLICIES.copy()
    register_policy(Stored)
    yield
    POLICIES.restore(saved)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    root = tmp_path_factory.mktemp("policies") / "train"
    write_split(root, num_samples=24, samples_per_shard=8)
    return root


def test_the_built_in_policies_by_role():
    assert policy_names("shuffle")[:2] == ("global", "block")
    assert policy_names("mix") == ("mix",)
    assert policy_names("balance")[:2] == ("classes", "weights")


def test_a_policy_registered_from_outside_is_read_through_the_loader(split, registered):
    loader = Loader(split, shuffle="stored", batch_size=4, crop=32, backend="pil", threads=0, train=True)
    assert loader.indices().tolist() == list(range(24))
    ranks = [Loader(split, shuffle="stored", batch_size=4, crop=32, rank=r, world_size=2, train=True) for r in (0, 1)]
    assert [ld.indices()[:3].tolist() for ld in ranks] == [[0, 2, 4], [1, 3, 5]]
    batches = list(loader)
    assert [b[1].tolist() for b in batches[:2]] == [[0, 1, 2, 3], [4, 5, 0, 1]]  # sample i has class i % 6
    # its state resumes mid-epoch in a new Loader; another policy's state is refused in one line
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    again = Loader(split, shuffle="stored", batch_size=4, crop=32, backend="pil", threads=0, train=True)
    again.load_state_dict(state)
    assert np.concatenate(list(again.epoch_batches())[1:]).tolist() == list(range(4, 24))
    plain = Loader(split, batch_size=4, crop=32, backend="pil", threads=0, train=True)
    with pytest.raises(ArgumentError, match="state was saved with shuffle='stored', this loader has shuffle='global'"):
        plain.load_state_dict(state)


def test_an_unknown_policy_names_the_registered_ones(split, registered):
    with pytest.raises(ArgumentError, match=r"shuffle='sorted' must be one of \('global', 'block', 'stored'\)"):
        Loader(split, shuffle="sorted", batch_size=4)
    with pytest.raises(ArgumentError, match=r"a sampling policy's role is one of"):
        register_policy(type("Odd", (SamplingPolicy,), {"name": "odd", "role": "sideways"}))


def test_a_policy_not_registered_is_refused(split):
    with pytest.raises(ArgumentError, match=r"shuffle='stored' must be one of \('global', 'block'\)"):
        Loader(split, shuffle="stored", batch_size=4)


@pytest.mark.parametrize(
    "options", [{}, {"shuffle": "block"}, {"balance": "classes"}, {"weights": [0.7, 0.3], "epoch_length": 900}]
)
def test_an_epochs_batches_computed_a_block_at_a_time_are_each_batch_s_own(tmp_path, options):
    from stoker.pipeline.order.base import BLOCK_BATCHES, EpochBatches

    write_split(tmp_path / "a", num_samples=700, samples_per_shard=50)
    write_split(tmp_path / "b", num_samples=300, samples_per_shard=50, seed=3)
    split = [tmp_path / "a", tmp_path / "b"] if "weights" in options else tmp_path / "a"
    for rank, world in [(0, 1), (1, 3)]:
        loader = Loader(split, batch_size=8, crop=16, backend="pil", threads=0, rank=rank, world_size=world, **options)
        o, stop = loader.order, loader.order.stop(0)
        batches = EpochBatches(o, 5, 2, 0, 0, stop, lambda p: p)
        alone = [o.positions(5, 2, 0, lo, min(lo + 8, stop)) for lo in range(0, stop, 8)]
        assert len(batches) == len(alone) > BLOCK_BATCHES + 2  # more than one block, the last one partial
        for i in [*range(len(alone)), len(alone) - 1, 3, BLOCK_BATCHES + 1, 0]:  # in order, then jumping back
            assert np.array_equal(batches[i], alone[i]), (options, rank, i)
