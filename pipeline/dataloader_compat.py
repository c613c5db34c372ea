"""The DataLoader-shaped views of a :class:`~.loader.Loader`, for training code written
against ``torch.utils.data.DataLoader``: ``loader.dataset`` (``len``, ``classes``,
``class_to_idx``), ``loader.sampler`` and ``loader.batch_sampler`` (whose ``set_epoch`` sets
the Loader's epoch, as DistributedSampler's does), and the one-line answer to a DataLoader
argument passed out of habit. The views read a :class:`LoaderLike` (what the Loader is to
them), not the Loader class: the loader imports this module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from stoker.errors import LoaderError

from .order import EpochBatches, SampleOrder
from .shards.samples import SampleIndex


class LoaderLike(Protocol):
    """What the views read of a :class:`~.loader.Loader` (which has all of it)."""

    path: Path | str
    num_samples: int
    index: SampleIndex
    order: SampleOrder
    epoch: int
    batch_size: int
    drop_last: bool

    @property
    def offset(self) -> int: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def indices(self, epoch: int | None = None) -> np.ndarray: ...

    def epoch_batches(self) -> EpochBatches: ...


class LoaderDataset:
    """``loader.dataset``: the split seen as a dataset, for code that reads ``len(dataset)``,
    ``dataset.classes`` or ``dataset.class_to_idx``. Samples are decoded in whole batches by
    the Loader, so there is no per-sample ``dataset[i]``."""

    def __init__(self, loader: LoaderLike):
        self._loader = loader

    def __len__(self) -> int:
        return self._loader.num_samples

    @property
    def classes(self) -> list:
        return list(self._loader.index.manifest.classes)

    @property
    def class_to_idx(self) -> dict:
        return {name: i for i, name in enumerate(self._loader.index.manifest.classes)}

    @property
    def root(self) -> Path:
        return self._loader.path

    @property
    def targets(self) -> list:
        """Every loadable sample's target in stored order (ImageFolder's ``targets``): class
        indices, or the float values / multi-hot rows (read from the shards; a mask split's
        targets are images, see the Loader's batches)."""
        index = self._loader.index
        if index.target.spatial:
            raise TypeError(
                f"loader.dataset.targets: a {index.target.kind} split's targets are images; iterate the Loader"
            )
        values = index.targets(index.valid)
        return values.tolist() if hasattr(values, "tolist") else list(values)  # a kind of ragged values: a list

    @property
    def samples(self) -> list:
        """``(sample key, target)`` per loadable sample in stored order (ImageFolder's ``samples``
        holds paths; a shard sample's name is its key)."""
        index = self._loader.index
        return [(index.key(int(i)), t) for i, t in zip(index.valid.tolist(), self.targets, strict=True)]

    def __getitem__(self, i: int):
        raise TypeError(
            f"loader.dataset[{i!r}]: stoker's Loader decodes whole batches, there is no per-sample "
            "access; iterate the Loader, or read raw samples with "
            f"stoker.pipeline.shards.samples.open_split({str(self._loader.path)!r})"
        )

    def __repr__(self) -> str:
        return f"LoaderDataset({str(self._loader.path)!r}, samples={len(self)}, classes={len(self.classes)})"


class LoaderSampler:
    """``loader.sampler``: this rank's sample positions for the current epoch, in order."""

    def __init__(self, loader: LoaderLike):
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._loader.epoch

    def __len__(self) -> int:
        loader = self._loader
        return loader.order.share(offset=loader.offset)

    def __iter__(self) -> Iterator[int]:
        return iter(self._loader.indices().tolist())


class LoaderBatchSampler(LoaderSampler):
    """``loader.batch_sampler``: this rank's batches (lists of sample positions) this epoch."""

    @property
    def batch_size(self) -> int:
        return self._loader.batch_size

    @property
    def drop_last(self) -> bool:
        return self._loader.drop_last

    @property
    def sampler(self) -> LoaderSampler:
        return LoaderSampler(self._loader)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[list]:
        loader = self._loader
        return (b.tolist() for b in loader.epoch_batches())


class DataLoaderSurface:
    """The parts of the torch ``DataLoader`` surface training code reads, as the
    :class:`~.loader.Loader` carries them (a base class of it): ``dataset``, ``sampler``,
    ``batch_sampler``, ``num_workers``, and ``prefetch_factor`` refused in one line."""

    threads: int

    @property
    def dataset(self) -> LoaderDataset:
        """The split as a dataset view: ``len`` (loadable samples), ``classes``,
        ``class_to_idx`` (what ``len(loader.dataset)`` and ``loader.dataset.classes`` read)."""
        return LoaderDataset(self)

    @property
    def sampler(self) -> LoaderSampler:
        """This rank's epoch order; ``loader.sampler.set_epoch(e)`` is ``loader.set_epoch(e)``
        (what DDP scripts and Lightning call each epoch)."""
        return LoaderSampler(self)

    @property
    def batch_sampler(self) -> LoaderBatchSampler:
        """This rank's batches of sample positions; ``set_epoch`` as on :attr:`sampler`."""
        return LoaderBatchSampler(self)

    @property
    def num_workers(self) -> int:
        """The decode threads / pillow worker processes (``threads``; a DataLoader's name for it)."""
        return self.threads

    @property
    def prefetch_factor(self):
        """Not a Loader's (it prepares ``prefetch`` batches itself). Read by code that rebuilds a torch
        DataLoader from this one, e.g. ``accelerator.skip_first_batches``: refused in one line."""
        raise LoaderError(
            "stoker's Loader cannot be rebuilt as a torch DataLoader (accelerator.skip_first_batches does that): "
            "it resumes mid-epoch with its own state, loader.load_state_dict(state) with state from "
            "loader.state_dict() (accelerator.register_for_checkpointing(loader) saves and loads it)"
        )


#: torch DataLoader (and Dataset) arguments people pass out of habit -> what the Loader takes instead
_DATALOADER_HABITS = {
    "transform": "augment= (per-sample augmentation on the device: a policy like 'rand-m9-mstd0.5' or a "
    "stoker.pipeline.augment transform) and crop=/scale=/ratio= for the crop; normalize in the model "
    "(stoker.model.with_normalize), not in the loader",
    "target_transform": "nothing (targets arrive as tensors on the device: transform them there)",
    "pin_memory_device": "device='cuda:N' (batches arrive on the device already)",
    "in_order": "nothing (the order is always the Loader's, exact and resumable)",
    "dataset": "the split's path as the first argument (a folder stoker pack wrote)",
    "num_workers": "threads=N (decode threads; default: all usable cores)",
    "shuffle": "train=True (a fresh global permutation every epoch) or train=False (stored order); "
    "shuffle='block' (shards permuted, samples within windows of shards) for a bounded cache",
    "pin_memory": "device='cuda' (batches arrive on the device already)",
    "persistent_workers": "nothing (the Loader keeps its pipeline across epochs)",
    "prefetch_factor": "prefetch=N (batches prepared ahead)",
    "sampler": "seed=, rank=, world_size= (the Loader orders and splits samples itself)",
    "batch_sampler": "batch_size= and drop_last= (the Loader orders and splits samples itself)",
    "collate_fn": "nothing (batches are uint8 images and int64 labels; transform them on the device)",
    "worker_init_fn": "nothing (decode runs in the Loader's own threads)",
    "generator": "seed=N",
    "timeout": "nothing",
    "multiprocessing_context": "nothing",
}


def habit_message(kwargs: dict) -> str:
    """What to pass instead of each DataLoader argument in ``kwargs``; TypeError for any other."""
    unknown = sorted(set(kwargs) - set(_DATALOADER_HABITS))
    if unknown:
        raise TypeError(
            f"Loader() got an unexpected keyword argument {unknown[0]!r} (see help(stoker.pipeline.Loader) "
            "for its arguments)"
        )
    return "; ".join(
        f"{name}= is a torch DataLoader argument: stoker's Loader takes {_DATALOADER_HABITS[name]}" for name in kwargs
    )
